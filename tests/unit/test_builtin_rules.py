"""Built-in rules, each tested the way a rule author would: through ftd.testing."""

from __future__ import annotations

from pathlib import Path

import pytest

import ftd.rules
from ftd.coordinator.decide.plugins import DEFAULT_RULES, make_plugin_manager
from ftd.events import Kind
from ftd.rules import (
    ecc_remap,
    fs_fill,
    hang,
    node_death,
    repeat_offender,
    straggler,
    xid_catalog,
)
from ftd.testing import evaluate_rule, make_event, view_with

PCI = "0000:3b:00.0"
UUID = "GPU-1111"


def kinds(actions: list) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    return [(str(a.kind), a.target) for a in actions]


def test_every_builtin_is_registered() -> None:
    shipped = {p.stem for p in Path(ftd.rules.__file__).parent.glob("*.py") if not p.name.startswith("_")}
    assert {name.rsplit(".", 1)[-1] for name in DEFAULT_RULES} == shipped
    pm = make_plugin_manager(entry_points=False)
    names = {pm.get_name(plugin) for plugin in pm.get_plugins()}
    assert names == {
        "xid_catalog",
        "ecc_remap",
        "repeat_offender",
        "fs_fill",
        "hang",
        "node_death",
        "straggler",
        "app_faults",
        "nccl_ib",
        "sxid",
        "gpu_health",
        "thermal",
        "memory",
        "kernel",
        "shared_fs",
        "storage",
        "host",
        "supervisor",
        "interruption",
        "fabric",
    }


@pytest.mark.parametrize(
    ("code", "data", "expected"),
    [
        (13, {}, [("checkpoint_restart", "j1")]),  # RESTART_APP: node stays usable
        (119, {}, [("checkpoint_restart", "j1"), ("gpu_reset", "node-1")]),  # RESET_GPU
        (79, {}, [("checkpoint_restart", "j1"), ("drain_node", "node-1")]),  # RESTART_BM
        (48, {}, [("checkpoint_restart", "j1"), ("gpu_reset", "node-1")]),  # WORKFLOW_XID_48 alone: reset
        (74, {}, [("checkpoint_restart", "j1"), ("gpu_reset", "node-1")]),  # WORKFLOW_NVLINK_ERR
        (142, {}, [("notify", "node-1")]),  # CONTACT_SUPPORT: a human looks, no drain
        (150, {}, [("checkpoint_restart", "j1"), ("gpu_reset", "node-1")]),  # NVLink5 MSE: fatal
        (
            149,
            {"message": "NVRM: Xid (PCI:0000:8a:00): 149, Fatal link event on XC2 i1 Link 17"},
            [("checkpoint_restart", "j1"), ("gpu_reset", "node-1")],
        ),
        (
            149,
            {"message": "NVRM: Xid (PCI:0000:8a:00): 149, Nonfatal link event on XC2 i1 Link 17"},
            [("notify", "node-1")],
        ),
        (43, {}, []),  # IGNORE: recorded only
        (154, {"action": "RESET_GPU"}, [("checkpoint_restart", "j1"), ("gpu_reset", "node-1")]),
        (154, {"action": "RESTART_BM"}, [("checkpoint_restart", "j1"), ("drain_node", "node-1")]),
        (154, {"action": "IGNORE"}, []),
        (154, {}, []),
        (31, {"extra": {"caused_by_previous": 13}}, []),  # follow-on: its cause was acted on
    ],
)
def test_xid_catalog_buckets(code: int, data: dict, expected: list) -> None:  # type: ignore[type-arg]
    view = view_with(jobs={"j1": ["node-1", "node-2"]})
    event = make_event(
        "node-1", "xid", severity="error", data={"code": code, "pci": PCI, "uuid": UUID, **data}
    )
    actions = evaluate_rule(xid_catalog, event, view)
    assert kinds(actions) == expected
    by_kind = {str(a.kind): a for a in actions}
    if "gpu_reset" in by_kind:
        assert by_kind["gpu_reset"].params["pci"] == PCI and by_kind["gpu_reset"].params["uuid"] == UUID
    if "drain_node" in by_kind or "gpu_reset" in by_kind:
        assert by_kind["checkpoint_restart"].params["exclude"] == ["node-1"]
    elif "checkpoint_restart" in by_kind:
        assert by_kind["checkpoint_restart"].params["exclude"] == []


def test_ecc_remap_pending_resets_at_next_checkpoint_failure_drains() -> None:
    view = view_with(jobs={"j1": ["node-1"]})
    pending = make_event(
        "node-1", "row_remap", severity="warning", data={"pending": True, "uuid": UUID, "pci": PCI}
    )
    actions = evaluate_rule(ecc_remap, pending, view)
    assert kinds(actions) == [("checkpoint_restart", "j1"), ("gpu_reset", "node-1")]
    assert actions[1].params == {"pci": PCI, "uuid": UUID, "severity": "warning"}
    failure = make_event(
        "node-1", "row_remap", severity="error", data={"pending": True, "failure": 1, "uuid": UUID}
    )
    assert kinds(evaluate_rule(ecc_remap, failure, view)) == [
        ("checkpoint_restart", "j1"),
        ("drain_node", "node-1"),
    ]
    sram_ok = make_event("node-1", "ecc", data={"sram_uncorrectable": 4, "uuid": UUID})
    sram_bad = make_event("node-1", "ecc", data={"sram_uncorrectable": 5, "uuid": UUID})
    assert evaluate_rule(ecc_remap, sram_ok, view) == []
    nvml_shape = make_event("node-1", "ecc", severity="error", data={"counters": {"aggregate_dbe_sram": 6}})
    assert [a.kind for a in evaluate_rule(ecc_remap, nvml_shape, view)] == [
        "checkpoint_restart",
        "drain_node",
    ]
    [_, drain] = evaluate_rule(ecc_remap, sram_bad, view)
    assert drain.kind == "drain_node" and "5 uncorrectable SRAM" in drain.reason


def test_repeat_offender_drains_on_the_same_hardware_fault_twice_within_24h() -> None:
    view = view_with(jobs={"j1": ["node-1"]})
    gpu = {"pci": PCI, "uuid": UUID}
    first = make_event("node-1", "xid", severity="critical", data={"code": 48, **gpu}, ts=1000)
    other = make_event("node-1", "xid", severity="error", data={"code": 13, **gpu}, ts=2000)
    again = make_event("node-1", "xid", severity="critical", data={"code": 48, **gpu}, ts=1000 + 23 * 3600)
    actions = evaluate_rule(repeat_offender, [first, other, again], view)
    assert kinds(actions) == [("checkpoint_restart", "j1"), ("drain_node", "node-1")]
    assert "xid 48" in actions[1].reason and actions[0].params["exclude"] == ["node-1"]
    late = view_with(history=[first])
    assert (
        evaluate_rule(
            repeat_offender,
            make_event("node-1", "xid", severity="critical", data={"code": 48, **gpu}, ts=1000 + 25 * 3600),
            late,
        )
        == []
    )
    warning = view_with()
    twice = [make_event("node-1", "thermal", severity="warning", ts=t) for t in (1, 2)]
    assert evaluate_rule(repeat_offender, twice, warning) == []  # warnings are not faults


def test_repeat_offender_flags_a_gpu_that_failed_on_another_node() -> None:
    failed = make_event("node-1", "xid", severity="critical", data={"code": 79, "uuid": UUID}, ts=10)
    view = view_with(history=[failed])
    arrived = make_event("node-7", "gpu_health", severity="info", data={"uuid": UUID}, ts=5000)
    [flag] = evaluate_rule(repeat_offender, arrived, view)
    assert (flag.kind, flag.target) == ("notify", "node-7")
    assert flag.params["previous_node"] == "node-1" and UUID in flag.reason
    again = make_event("node-7", "gpu_health", severity="info", data={"uuid": UUID}, ts=5001)
    assert evaluate_rule(repeat_offender, again, view) == []  # flagged once, on arrival
    assert view.gpu(UUID) is not None and view.gpu(UUID).nodes_seen == ["node-1", "node-7"]  # type: ignore[union-attr]


def test_fs_fill_saves_without_stopping_then_stops_before_full() -> None:
    view = view_with(jobs={"j1": ["node-1"]})
    warn = make_event("node-1", "fs_fill", data={"level": "warning", "mount": "/ckpt", "used_pct": 86})
    save, note = evaluate_rule(fs_fill, warn, view)
    assert (save.kind, save.target, save.params["stop"]) == ("checkpoint", "j1", False)
    assert note.kind == "notify" and "/ckpt at 86%" in note.reason
    full = {"level": "critical", "mount": "/ckpt"}
    critical = make_event("node-1", "fs_fill", severity="critical", data=full)
    stop = evaluate_rule(fs_fill, critical, view)
    assert kinds(stop) == [("checkpoint_restart", "j1"), ("notify", "node-1")]
    assert stop[0].params["exclude"] == ["node-1"]  # the requeued job must not land on the full disk
    soon = make_event("node-1", "fs_fill", data={"mount": "/ckpt", "eta_s": 300})
    assert kinds(evaluate_rule(fs_fill, soon, view)) == [("checkpoint", "j1"), ("notify", "node-1")]
    forecast = make_event(  # the fs watcher's shape: forecast while the level is still ok
        "node-1",
        "fs_fill",
        data={"reason": "forecast", "level": "ok", "path": "/ckpt", "time_to_full_s": 2000},
    )
    assert kinds(evaluate_rule(fs_fill, forecast, view)) == [("checkpoint", "j1"), ("notify", "node-1")]
    cleared = make_event("node-1", "fs_fill", severity="critical", data={"level": "cleared"})
    assert evaluate_rule(fs_fill, cleared, view) == []


def test_hang_symptoms_ask_for_one_diagnosis_per_job() -> None:
    view = view_with(jobs={"j1": ["node-1", "node-2"], "j2": ["node-1"]})
    lost = make_event("node-2", "rank_heartbeat_lost", data={"job": "j1", "rank": 1})
    assert kinds(evaluate_rule(hang, lost, view)) == [("diagnose_hang", "j1")]
    stale = make_event("node-1", "log_stale", data={"path": "/logs/train.log"})
    actions = evaluate_rule(hang, stale, view)
    assert kinds(actions) == [("diagnose_hang", "j1"), ("diagnose_hang", "j2")]
    assert "/logs/train.log" in actions[0].reason


def test_node_death_restarts_running_jobs_elsewhere() -> None:
    view = view_with(jobs={"j1": ["node-1", "node-2"]}, offline=["node-2"])
    dead = make_event("node-2", "node_offline", severity="error", data={"jobs": ["j1"]})
    [restart] = evaluate_rule(node_death, dead, view)
    assert (restart.kind, restart.target, restart.params["exclude"]) == (
        "checkpoint_restart",
        "j1",
        ["node-2"],
    )
    idle = make_event("node-9", "node_offline", severity="error", data={"jobs": []})
    assert evaluate_rule(node_death, idle, view) == []


def test_straggler_notifies() -> None:
    slow = make_event("node-3", "rank_straggler", data={"job": "j1", "rank": 5, "lag_steps": 40})
    [note] = evaluate_rule(straggler, slow)
    assert (note.kind, note.target) == ("notify", "node-3") and note.params["lag_steps"] == 40
    assert note.rule == "straggler"


def test_storm_summaries_and_follow_ons_do_not_act_twice_on_one_incident() -> None:
    """The agent publishes the first Xid at once and later a summary (``repeat_of``, ``count``):
    the first is acted on, the summary only recorded; a follow-on Xid (``caused_by``) likewise."""
    view = view_with(jobs={"1001": ["node-1"]})
    first = make_event("node-1", Kind.XID, data={"code": 79, "pci": "0000:3b:00.0"})
    summary = make_event(
        "node-1", Kind.XID, data={"code": 79, "pci": "0000:3b:00.0", "repeat_of": first.id}, count=5000
    )
    follow_on = make_event("node-1", Kind.XID, data={"code": 45, "pci": PCI, "caused_by": first.id})
    for rule in (xid_catalog, repeat_offender):
        assert evaluate_rule(rule, [summary, follow_on], view) == [], rule.__name__
    assert {r.kind for r in evaluate_rule(xid_catalog, [first], view)} == {"checkpoint_restart", "drain_node"}


def test_one_hang_is_not_a_repeat_offence() -> None:
    """A hung rank silences its peers too (they block in the collective): several rank_heartbeat_lost
    events from one incident must not make the node a repeat offender and drain it."""
    view = view_with(jobs={"1001": ["node-1"]})
    lost = [
        make_event("node-1", Kind.RANK_HEARTBEAT_LOST, severity="error", data={"job": "1001", "rank": r})
        for r in (0, 1, 2)
    ]
    assert evaluate_rule(repeat_offender, lost, view) == []
    # ...while a real repeated hardware fault (two incidents, an hour apart) still is one.
    xids = [
        make_event("node-1", Kind.XID, severity="critical", data={"code": 64, "pci": PCI}, ts=ts)
        for ts in (1000, 4600)
    ]
    assert "drain_node" in {r.kind for r in evaluate_rule(repeat_offender, xids, view)}
