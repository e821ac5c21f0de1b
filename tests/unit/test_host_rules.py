"""Rules ``storage`` and ``host`` (#23 part 1) as pure functions, and the agent's job attribution of a
segfault (``with_rank``): the branches the replay scenarios do not walk."""

from __future__ import annotations

from ftd.agent.door import enriched
from ftd.events import Event, Kind
from ftd.plugin import ActionRequest
from ftd.rules import host, storage
from ftd.testing import evaluate_rule, make_event, view_with


def kinds(actions: list[ActionRequest]) -> list[tuple[str, str]]:
    return [(a.kind, a.target) for a in actions]


def view():  # type: ignore[no-untyped-def]
    return view_with(jobs={"j1": ["node-1"]})  # a fresh one each time: evaluate_rule records the events


def test_storage_moves_the_job_then_drains_and_leaves_shared_filesystems_alone() -> None:
    lost = make_event(
        "node-1",
        Kind.STORAGE,
        severity="critical",
        data={"device": "nvme0", "subsystem": "nvme", "fault": "disabled"},
    )
    assert kinds(evaluate_rule(storage, lost, view())) == [
        ("checkpoint_restart", "j1"),
        ("drain_node", "node-1"),
    ]
    restart = evaluate_rule(storage, lost, view())[0]
    assert restart.params["exclude"] == ["node-1"] and "nvme nvme0: disabled" in restart.reason
    ro = make_event(
        "node-1",
        Kind.FS_READONLY,
        severity="critical",
        data={"device": "md0", "fstype": "xfs", "mount": "/local"},
    )
    assert kinds(evaluate_rule(storage, ro, view())) == [
        ("checkpoint_restart", "j1"),
        ("drain_node", "node-1"),
    ]
    assert "xfs on md0 (/local) is read-only" in evaluate_rule(storage, ro, view())[1].reason
    shared = make_event(
        "node-1", Kind.FS_READONLY, severity="critical", data={"device": "nfs01:/ckpt", "fstype": "nfs4"}
    )
    assert evaluate_rule(storage, shared, view()) == []  # shared_fs's
    flagged = make_event("node-1", Kind.STORAGE, severity="critical", data={"device": "x", "shared": True})
    assert evaluate_rule(storage, flagged, view()) == []
    io = make_event(
        "node-1",
        Kind.STORAGE,
        severity="error",
        data={"device": "sda", "subsystem": "block", "fault": "io_error"},
    )
    assert kinds(evaluate_rule(storage, io, view())) == [("notify", "node-1")]
    slow = make_event(
        "node-1", Kind.STORAGE, severity="warning", data={"device": "nvme0", "fault": "timeout"}
    )
    assert evaluate_rule(storage, slow, view()) == []


def test_host_decisions_by_kind_and_severity() -> None:
    def decide(kind: Kind, severity: str, **data: object) -> list[tuple[str, str]]:
        return kinds(
            evaluate_rule(host, make_event("node-1", kind, severity=severity, data=dict(data)), view())
        )

    move = [("checkpoint_restart", "j1"), ("drain_node", "node-1")]
    assert decide(Kind.NIC, "critical", driver="efa", fault="admin_queue_closed") == move
    assert decide(Kind.NIC, "warning", driver="mlx5_core", fault="access_reg_failed") == [
        ("notify", "node-1")
    ]
    assert decide(Kind.NIC, "info", driver="mlx5_core", fault="tx_timeout") == []
    assert decide(Kind.NVLINK, "error", fault="post_rx_detect_failed") == move
    assert decide(Kind.MACHINE_CHECK, "critical", extra={"uncorrected": True}) == move
    assert decide(Kind.MACHINE_CHECK, "info", extra={"uncorrected": False}) == []
    assert (
        decide(Kind.MACHINE_CHECK, "warning", cpu=1, bank=7, extra={"uncorrected": False}) == []
    )  # corrected
    assert decide(Kind.KERNEL_OOPS, "critical", what="panic") == move
    assert decide(Kind.KERNEL_OOPS, "info", what="stack_dump") == []  # a diagnostic print: recorded only
    assert decide(Kind.KERNEL_OOPS, "warning", what="netdev_refcount_leak") == [("notify", "node-1")]
    assert decide(Kind.SOFT_LOCKUP, "warning", cpu=3, process="python") == [("notify", "node-1")]
    assert decide(Kind.GPUDIRECT, "error", fault="invalid_context") == [("notify", "node-1")]
    assert decide(Kind.RESOURCE_LIMIT, "error", resource="nf_conntrack") == [("notify", "node-1")]
    # Segfaults: only a GPU library's in a job's rank reaches a decision.
    assert decide(Kind.SEGFAULT, "error", library="libnccl.so.2", extra={"gpu_library": True}) == []
    assert decide(Kind.SEGFAULT, "warning", library="dash", job="j1", extra={"gpu_library": False}) == []
    got = evaluate_rule(
        host,
        make_event("node-1", Kind.SEGFAULT, severity="error",
                   data={"library": "libcuda.so.1", "job": "j1", "pid": 7, "extra": {"gpu_library": True}}),
        view(),
    )  # fmt: skip
    assert kinds(got) == [("checkpoint_restart", "j1")] and got[0].params["exclude"] == []
    assert got[0].params["signature"] == "log segfault"


def with_rank(event: Event, pids: dict[int, tuple[str, int]]) -> Event:
    """The agent's door (:func:`ftd.agent.door.enriched`) with ``pids`` as the registered ranks."""
    return enriched(event, owner_of=pids.get, ranks=dict, mounts=list)


def test_with_rank_names_the_job_of_a_registered_pid() -> None:
    pids = {4242: ("j1", 3)}
    mine = make_event("node-1", Kind.SEGFAULT, data={"pid": 4242, "library": "libnccl.so.2"})
    assert {k: with_rank(mine, pids).data.get(k) for k in ("job", "rank")} == {"job": "j1", "rank": 3}
    other = make_event("node-1", Kind.SEGFAULT, data={"pid": 1, "library": "dash"})
    assert with_rank(other, pids) is other
    named = make_event("node-1", Kind.SEGFAULT, data={"pid": 4242, "job": "j9"})
    assert with_rank(named, pids) is named
