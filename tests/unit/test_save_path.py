"""Decisions that respect the save path (issue #23 part 2): the filesystem a job saves to is known
(registered by its client, related by its agent), a save is never asked onto a read-only, full or
unresponsive one (fallback or stop without a save), and a shared filesystem's outage on many nodes
is one incident, never N drains."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from ftd.agent import save_path as agent_save_path
from ftd.agent.local_api import LocalApi, wire
from ftd.agent.save_path import Mount, SavePathWatcher, mount_of, parse_mounts, probe, relate
from ftd.client import Client, protocol
from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.checkpoint_restart import CheckpointRestart
from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.coordinator.decide.save_path import guard
from ftd.coordinator.model.state import ClusterState
from ftd.events import Directive, Event, JobPresence, Kind, RankInfo, decode, make_event
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState
from ftd.plugin.save_path import path_under, save_trouble, troubles
from ftd.rules import shared_fs
from ftd.testing import evaluate_rule, view_with
from tests.unit.helpers import until

MOUNTS = (
    "/dev/nvme0n1p1 / ext4 rw,relatime 0 0\n"
    "/dev/nvme1n1 /local\\040scratch xfs ro,noatime 0 0\n"
    "nfs01:/export/ckpt /ckpt nfs4 rw,hard,vers=4.2 0 0\n"
    "10.0.0.5@o2ib:/lfs /lustre lustre rw 0 0\n"
    "broken line\n"
)


def fs_event(node: str, kind: Kind, ts: float, **data: object) -> Event:
    return make_event(node, kind, severity="error", source="kmsg", data=dict(data), ts=ts)


# --- the agent: mounts, relating events to jobs, the probe -------------------------------------------


def test_mounts_are_parsed_with_the_kernels_escapes_and_found_by_longest_prefix() -> None:
    mounts = parse_mounts(MOUNTS)
    assert [m.point for m in mounts] == ["/", "/local scratch", "/ckpt", "/lustre"]
    assert mounts[1].read_only and not mounts[0].read_only
    assert [m.shared for m in mounts] == [False, False, True, True]
    assert mount_of("/ckpt/run-7/step-100", mounts) == mounts[2]
    assert mount_of("/ckpt2/x", mounts) == mounts[0]  # component-wise, not a string prefix
    assert mount_of("/local scratch/a", mounts) == mounts[1]
    assert path_under("/ckpt", "/ckpt") and not path_under("relative", "/")


def test_the_agent_names_the_mount_and_the_jobs_saving_there() -> None:
    mounts = parse_mounts(MOUNTS)
    jobs = {
        "7": [RankInfo(rank=0, checkpoint_dir="/ckpt/run-7"), RankInfo(rank=1)],
        "8": [RankInfo(rank=0, checkpoint_dir="/local scratch/8")],
    }
    nfs = relate(
        fs_event("n1", Kind.NETFS, 1.0, fs="nfs", server="nfs01", state="not_responding"), jobs, mounts
    )
    assert nfs.data["mount"] == "/ckpt" and nfs.data["jobs"] == ["7"] and nfs.data["shared"] is True
    ro = relate(fs_event("n1", Kind.FS_READONLY, 1.0, device="nvme1n1", fstype="xfs"), jobs, mounts)
    assert ro.data["mount"] == "/local scratch" and ro.data["jobs"] == ["8"] and "shared" not in ro.data
    other = fs_event("n1", Kind.XID, 1.0, code=13)
    assert relate(other, jobs, mounts) is other
    unknown = fs_event("n1", Kind.FS_READONLY, 1.0, device="sdz", fstype="ext4")
    assert relate(unknown, jobs, mounts) is unknown  # nothing this node can add


async def test_the_probe_reads_mount_flags_fullness_and_gives_up_on_a_hung_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fine = [Mount("/dev/x", str(tmp_path), "ext4", frozenset({"rw"}))]
    assert await probe(str(tmp_path / "not-yet" / "made"), 5.0, fine) is None  # nearest existing parent
    ro = [Mount("/dev/x", str(tmp_path), "ext4", frozenset({"ro"}))]
    assert await probe(str(tmp_path), 5.0, ro) == "read_only"
    release = threading.Event()

    def hung(path: str, mounts: list[Mount]) -> str | None:
        release.wait(10)  # a dead hard NFS mount
        return None

    monkeypatch.setattr(agent_save_path, "_statvfs_state", hung)
    started = time.monotonic()
    assert await probe(str(tmp_path), 0.2, fine) == "unresponsive"
    assert time.monotonic() - started < 5  # the agent did not wait for the stat
    release.set()


async def test_the_watcher_reports_a_checkpoint_dir_turning_read_only_and_back(tmp_path: Path) -> None:
    mounts = [Mount("/dev/sdb1", str(tmp_path), "ext4", frozenset({"rw"}))]
    emitted: list[Event] = []

    async def emit(event: Event) -> None:
        emitted.append(event)

    ckpt = str(tmp_path / "ckpt")
    jobs = {"7": [RankInfo(rank=0, checkpoint_dir=ckpt)], "9": [RankInfo(rank=0)]}
    watcher = SavePathWatcher("n1", emit, lambda: jobs, mounts=lambda: mounts)
    assert watcher.directories() == {ckpt: ["7"]}
    assert await watcher.check() == []  # fine, and fine is not news
    mounts[0] = Mount("/dev/sdb1", str(tmp_path), "ext4", frozenset({"ro"}))
    [ro] = await watcher.check()
    assert (ro.kind, ro.source, ro.severity) == (Kind.FS_READONLY, "save_path", "critical")
    assert ro.data | {} == {
        "path": ckpt,
        "jobs": ["7"],
        "probe": True,
        "mount": str(tmp_path),
        "fstype": "ext4",
        "device": "/dev/sdb1",
        "shared": False,
    }
    assert await watcher.check() == []  # still read-only: said once
    mounts[0] = Mount("/dev/sdb1", str(tmp_path), "ext4", frozenset({"rw"}))
    [back] = await watcher.check()
    assert back.kind == Kind.FS_READONLY and back.data["state"] == "rw" and back.severity == "info"
    assert emitted == [ro, back]


# --- the trainer's registration ------------------------------------------------------------------


def test_the_checkpoint_dirs_a_client_registers_reach_the_agents_rank_info() -> None:
    line = protocol.encode(protocol.register("j1", 0, 0, 42, "r0", None, "/ckpt/j1", "/scratch/j1"))
    msg = wire.decode_line(line.rstrip(b"\n"))
    assert isinstance(msg, wire.Register)
    assert (msg.checkpoint_dir, msg.fallback_checkpoint_dir) == ("/ckpt/j1", "/scratch/j1")
    old = protocol.encode(protocol.register("j1", 0, 0, 42))
    assert b"checkpoint_dir" not in old  # an old client's bytes, unchanged
    msg = wire.decode_line(old.rstrip(b"\n"))
    assert isinstance(msg, wire.Register) and msg.checkpoint_dir is None
    bad = wire.decode_line(b'{"op":"register","job":"j","rank":0,"checkpoint_dir":"relative/dir"}')
    assert isinstance(bad, wire.BadLine) and bad.op == "register"


async def test_a_real_client_registers_its_dirs_and_reads_the_fallback_from_a_save(api: LocalApi) -> None:
    client = Client(
        job="j1",
        rank=0,
        socket_path=api.socket_path,
        checkpoint_dir="/ckpt/j1",
        fallback_checkpoint_dir="/scratch/j1",
    )
    try:
        await until(lambda: bool(api.jobs().get("j1")))
        [info] = api.jobs()["j1"]
        assert (info.checkpoint_dir, info.fallback_checkpoint_dir) == ("/ckpt/j1", "/scratch/j1")
        assert client.save_path == "/ckpt/j1"
        params = {"save_path": "/scratch/j1"}
        await api.deliver(Directive(id="d1", ts=time.time(), action="save", job="j1", params=params))
        await until(client.should_save)
        assert client.save_path == "/scratch/j1"
    finally:
        client.close()


# --- which filesystems are in trouble (pure) ----------------------------------------------------------


def test_troubles_open_on_the_event_and_end_on_its_recovery() -> None:
    view = view_with(
        jobs={"7": ["n1"]},
        history=[
            fs_event("n1", Kind.FS_READONLY, 10.0, mount="/ckpt", fstype="ext4", jobs=["7"]),
            fs_event("n1", Kind.NETFS, 11.0, fs="nfs", server="nfs01", state="not_responding"),
            fs_event(
                "n1", Kind.FS_FILL, 12.0, path="/data", level="critical", used_pct=96.0, reason="threshold"
            ),
            fs_event(
                "n1", Kind.FS_FILL, 13.0, path="/full", level="critical", used_pct=99.9, reason="threshold"
            ),
        ],
    )
    assert [(t.state, t.where) for t in troubles(view, ["n1"], 20.0)] == [
        ("read_only", "/ckpt"),
        ("unresponsive", "nfs01"),
        ("full", "/full"),  # a critical 96 % still takes a save
    ]
    trouble = save_trouble(view, "7", 20.0)
    assert trouble is not None and trouble.state == "read_only"
    assert save_trouble(view, "7", 20.0 + 7 * 3600) is None  # forgotten after MEMORY_S
    view.apply_event(fs_event("n1", Kind.NETFS, 30.0, fs="nfs", server="nfs01", state="recovered"))
    assert [t.where for t in troubles(view, ["n1"], 31.0)] == ["/ckpt", "/full"]


# --- the decision stage: fallback or no save ---------------------------------------------------------


def cluster(fallback: str | None) -> ClusterState:
    state = view_with(nodes=["n1", "n2"])
    for rank, node in enumerate(("n1", "n2")):
        info = RankInfo(rank=rank, checkpoint_dir="/ckpt/7", fallback_checkpoint_dir=fallback)
        state.apply_presence(node, "7", JobPresence(job="7", node=node, ranks=[info]))
    state.apply_event(fs_event("n2", Kind.FS_READONLY, 100.0, mount="/ckpt", fstype="ext4"))
    return state


def restart(**params: object) -> ActionRequest:
    return ActionRequest(kind=ActionKind.CHECKPOINT_RESTART, target="7", reason="xid 79", params=dict(params))


def test_a_save_onto_a_read_only_checkpoint_dir_goes_to_the_declared_fallback() -> None:
    asked = guard(restart(exclude=["n2"]), cluster("/scratch/7"), 101.0)
    assert asked.params["save_path"] == "/scratch/7" and "save" not in asked.params
    assert asked.params["exclude"] == ["n2"]
    assert "saving to its fallback /scratch/7" in asked.reason and asked.reason.startswith("xid 79; ")


def test_without_a_fallback_the_job_stops_without_a_save_and_the_reason_says_so() -> None:
    asked = guard(restart(), cluster(None), 101.0)
    assert asked.params["save"] is False and asked.params["save_trouble"] == "read_only"
    assert "no save" in asked.reason and "filesystem /ckpt is read-only on n2" in asked.reason
    assert "stopped without a save" in asked.params["no_save_reason"]
    on_the_broken_fs = guard(restart(), cluster("/ckpt/elsewhere"), 101.0)
    assert on_the_broken_fs.params["save"] is False  # a fallback on the same filesystem is no fallback


def test_healthy_filesystems_and_other_actions_are_left_alone() -> None:
    state = cluster(None)
    assert guard(restart(), state, 100.0 + 7 * 3600) == restart()
    drain = ActionRequest(kind=ActionKind.DRAIN_NODE, target="n2", reason="x")
    assert guard(drain, state, 101.0) is drain


class _Job:
    def __init__(self) -> None:
        self.state = ClusterState()
        info = RankInfo(rank=0, step=10)
        self.state.apply_presence("n1", "7", JobPresence(job="7", node="n1", ranks=[info]))
        self.directives: list[Directive] = []
        self.scheduler = FakeScheduler()
        self.scheduler.add_job("7", ["n1"])

    async def publish(self, topic: str, payload: bytes) -> None:
        directive = decode(payload, Directive)
        self.directives.append(directive)
        if directive.action == "stop":
            self.state.apply_presence("n1", "7", None)

    async def run(self, **params: object) -> dict[str, object]:
        executor = CheckpointRestart(
            publish=self.publish,
            state=self.state,
            acks=AckBook(),
            scheduler=self.scheduler,
            save_deadline_s=1,
            stop_deadline_s=1,
            resume_deadline_s=0,
        )
        record = ActionRecord(id="act-1", request=restart(**params), state=ActionState.RUNNING)
        return await executor(record)


async def test_the_executor_stops_without_a_save_and_without_a_requeue_when_asked() -> None:
    job = _Job()
    detail = await job.run(save=False, no_save_reason="no save: /ckpt is read-only", exclude=["n1"])
    assert [d.action for d in job.directives] == ["stop"]  # no save directive at all
    assert detail["save_skipped"] == "no save: /ckpt is read-only" and detail["stopped"] is True
    assert job.scheduler.jobs["7"].restarts == 1  # moved, resumes from its last checkpoint
    job = _Job()
    detail = await job.run(save=False, requeue=False)
    assert [d.action for d in job.directives] == ["stop"] and detail["requeued"] is None
    assert job.scheduler.jobs["7"].restarts == 0


# --- the shared filesystem rule ------------------------------------------------------------------------


def netfs(node: str, ts: float, state: str) -> Event:
    return fs_event(node, Kind.NETFS, ts, fs="nfs", server="nfs01", state=state)


def test_a_shared_outage_on_many_nodes_is_one_notify_and_no_drain() -> None:
    nodes = [f"n{i}" for i in range(1, 9)]
    view = view_with(jobs={"7": nodes[:4], "8": nodes[4:]})
    down = [netfs(n, 100.0 + i, "not_responding") for i, n in enumerate(nodes)]
    up = [netfs(n, 400.0 + i, "recovered") for i, n in enumerate(nodes)]
    actions = evaluate_rule(shared_fs, [*down, *up], view)
    assert [(a.kind, a.target) for a in actions] == [("notify", "n1"), ("notify", "n8")]
    assert actions[0].reason.startswith("shared filesystem outage: nfs server nfs01 not responding")
    assert "recovered" in actions[1].reason


def test_a_mount_read_only_on_enough_nodes_is_shared_and_a_local_one_is_left_to_the_storage_rules() -> None:
    view = view_with(nodes=["n1", "n2", "n3"])
    events = [
        fs_event(n, Kind.FS_READONLY, 10.0 + i, mount="/data", fstype="ext4")
        for i, n in enumerate(view.online_nodes())
    ]
    actions = evaluate_rule(shared_fs, events, view)
    assert [(a.kind, a.target) for a in actions] == [("notify", "n3")]  # the third node makes it shared
    lone = evaluate_rule(shared_fs, fs_event("n9", Kind.FS_READONLY, 5.0, mount="/local", fstype="xfs"))
    assert lone == []


def test_the_state_keeps_which_nodes_each_filesystem_is_in_trouble_on() -> None:
    view = view_with(nodes=["n1", "n2"])
    for node in ("n1", "n2"):
        view.apply_event(netfs(node, 10.0, "not_responding"))
        view.apply_event(netfs(node, 11.0, "not_responding"))  # "still trying": the same trouble
    view.apply_event(fs_event("n2", Kind.FS_READONLY, 12.0, mount="/scratch", fstype="xfs"))
    open_ = view.filesystem_troubles()
    assert {key: sorted(nodes) for key, nodes in open_.items()} == {
        "netfs:nfs01": ["n1", "n2"],
        "ro:/scratch": ["n2"],
    }
    assert open_["netfs:nfs01"]["n1"].ts == 10.0  # since the first report
    view.apply_event(netfs("n1", 20.0, "recovered"))
    view.apply_event(fs_event("n2", Kind.FS_READONLY, 21.0, mount="/scratch", state="rw"))
    assert {key: sorted(nodes) for key, nodes in view.filesystem_troubles().items()} == {
        "netfs:nfs01": ["n2"]
    }


def test_a_mount_the_operator_lists_as_shared_is_shared_whatever_its_fstype() -> None:
    mounts = parse_mounts(MOUNTS, shared=["/local scratch/"])
    assert [m.shared for m in mounts] == [False, True, True, True]
    event = fs_event("n1", Kind.FS_READONLY, 1.0, device="nvme1n1", fstype="xfs")
    related = relate(event, {}, mounts)
    assert related.data["shared"] is True and related.data["mount"] == "/local scratch"
