"""The agent's one door (issue #31 item 2): every event leaves through :class:`ftd.agent.door.Door`,
which adds the job and rank of the trainer rank whose pid it names and the mount it concerns.

The real-parts proof is tests/e2e/test_kernel_segfault_rank.py (a real agent, Mosquitto, coordinator
and segfaulting ranks); here: the enrichment as a property, the memory of ranks that left, and a
real agent (in-memory bus, a real trainer client on its socket) whose kernel-log watcher's first
event *and* storm control's summary of its repeats both carry the rank's job.
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from ftd.agent.door import RANK_KINDS, enriched
from ftd.agent.kmsg_parse.parser import parse_lines
from ftd.agent.local_api.owners import RankOwners
from ftd.agent.save_path import FS_KINDS, Mount
from ftd.agent.watchers.kmsg import kernel_event_to_event
from ftd.client import Client
from ftd.config import AgentConfig
from ftd.config.schema import StormConfig
from ftd.events import Kind, RankInfo, make_event
from tests.agent_on_bus import agent_on_bus
from tests.unit.helpers import until

SEGFAULT = (
    "[ 812.004518] python[{pid}]: segfault at 0 ip 00007f3a2c1d2e3f sp 00007ffd4b5a6c70 error 4"
    " in libnccl.so.2.18.3[7f3a2c000000+1d2e000]\n"
)

owners_st = st.dictionaries(
    st.integers(1, 50), st.tuples(st.sampled_from(["j1", "j2", "job-3"]), st.integers(0, 7)), max_size=6
)
data_st = st.fixed_dictionaries(
    {"pid": st.one_of(st.integers(1, 50), st.none(), st.text(max_size=3), st.booleans())},
    optional={"job": st.sampled_from(["named", ""]), "library": st.sampled_from(["libnccl.so.2", "dash"])},
)


@given(owners=owners_st, data=data_st, kind=st.sampled_from(sorted(Kind)))
def test_only_a_named_pid_of_a_known_rank_adds_its_job_and_rank_and_nothing_is_overwritten(
    owners: dict[int, tuple[str, int]], data: dict[str, object], kind: Kind
) -> None:
    event = make_event("n1", kind, data=data)
    asked: list[str] = []

    def ranks() -> dict[str, list[RankInfo]]:
        asked.append("ranks")
        return {}

    def mounts() -> list[Mount]:
        asked.append("mounts")
        return []

    out = enriched(event, owner_of=owners.get, ranks=ranks, mounts=mounts)
    pid = data["pid"]
    owner = owners.get(pid) if isinstance(pid, int) and not isinstance(pid, bool) else None
    if kind in RANK_KINDS and "job" not in data and owner is not None:
        assert out.data == {**data, "job": owner[0], "rank": owner[1]}
        assert (out.id, out.kind, out.ts, out.count) == (event.id, event.kind, event.ts, event.count)
    elif kind not in FS_KINDS:
        assert out is event  # nothing added, nothing copied
    assert {k: out.data[k] for k in data} == data  # what the event said stays as it said it
    assert asked == (["ranks", "mounts"] if kind in FS_KINDS else [])  # asked only where needed


def test_a_kernel_read_only_remount_gets_its_mount_and_the_jobs_saving_there() -> None:
    """Kernel-log filesystem events skipped the enrichment too (kmsg never went through emit): at the
    door the device the kernel names becomes the mount, its type, and the jobs whose ranks save there."""
    [kev] = parse_lines(["[ 90.100000] EXT4-fs (nvme0n1p1): Remounting filesystem read-only"])
    event = kernel_event_to_event("n1", kev)
    mounts = [
        Mount("/dev/nvme0n1p1", "/ckpt", "ext4", frozenset({"ro"})),
        Mount("/dev/sda1", "/", "ext4", frozenset({"rw"})),
    ]
    ranks = {
        "j1": [RankInfo(rank=0, checkpoint_dir="/ckpt/j1")],
        "j2": [RankInfo(rank=0, checkpoint_dir="/x")],
    }
    out = enriched(event, owner_of=lambda pid: None, ranks=lambda: ranks, mounts=lambda: mounts)
    assert (out.kind, out.data["mount"], out.data["fstype"], out.data["jobs"]) == (
        Kind.FS_READONLY,
        "/ckpt",
        "ext4",
        ["j1"],
    )


def test_a_rank_that_left_is_still_the_owner_of_its_pid_for_keep_s() -> None:
    now = [100.0]
    live: list[tuple[int, tuple[str, int]]] = [(11, ("j1", 0)), (12, ("j1", 1))]
    owners = RankOwners(lambda: live, keep_s=60.0, max_kept=2, clock=lambda: now[0])
    assert owners.owner(12) == ("j1", 1) and owners.owner(13) is None
    live.remove((12, ("j1", 1)))
    owners.left(12, ("j1", 1))
    now[0] += 59.0
    assert owners.owner(12) == ("j1", 1)  # its segfault line read after its connection closed
    live.append((12, ("j2", 4)))  # the pid is a live rank again: the live one answers
    assert owners.owner(12) == ("j2", 4)
    live.clear()
    now[0] += 2.0
    assert owners.owner(12) is None  # gone for longer than keep_s
    owners.left(None, ("j1", 5))  # a rank without a pid leaves nothing to find
    for pid in (21, 22, 23):
        owners.left(pid, ("j3", pid))
    assert [owners.owner(p) for p in (21, 22, 23)] == [None, ("j3", 22), ("j3", 23)]  # bounded


async def test_the_kernel_logs_first_segfault_and_storm_controls_summary_both_carry_the_job(
    tmp_path: Path,
) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.touch()
    cfg = AgentConfig(
        node="n1",
        kmsg_path=str(kmsg),
        state_dir=str(tmp_path / "s"),
        socket_path=str(tmp_path / "a.sock"),
        storm=StormConfig(window_s=0.3),
    )
    async with agent_on_bus(cfg, [Kind.SEGFAULT]) as running:
        agent, got = running.agent, running.received
        client = Client(job="j-nccl", rank=2, socket_path=cfg.socket_path)
        try:
            await until(lambda: client.connected, within=10)
            with kmsg.open("a") as f:
                f.write(SEGFAULT.format(pid=os.getpid()) * 3)  # a first occurrence and two repeats
            await until(lambda: len(got) == 2, within=10)
            first, summary = running.events
            assert first.count == 1 and summary.count == 2 and summary.data["repeat_of"] == first.id
            for event in (first, summary):
                assert (event.data["job"], event.data["rank"], event.data["pid"]) == (
                    "j-nccl",
                    2,
                    os.getpid(),
                )
            published = {
                k: n for k, n in agent.events_by_kind.items() if k != "inventory"
            }  # its start report
            assert published == {"segfault": 2}
        finally:
            client.close()


def test_no_agent_module_but_the_door_addresses_an_event_to_the_bus() -> None:
    """The one door stays the only one: any other agent module naming an event topic would publish
    events that skip the enrichment (the defect of issue #31 item 2, where kmsg events did)."""
    agent = Path(__file__).resolve().parents[2] / "ftd" / "agent"
    naming = sorted(
        str(path.relative_to(agent))
        for path in agent.rglob("*.py")
        if any(name in path.read_text() for name in ("node_event(", "node_event_batch(", "EVENT_BATCH"))
    )
    assert naming == ["door.py"]
