"""PresenceMemory: the ledger keeps each job's membership on a node (ranks, allocation), written when
it changes, never on a heartbeat, without steps; loaded back into the state; what the scheduler no
longer runs is dropped. The restart it is for is ``tests/contract/test_coordinator_restart_order.py``."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import ApiConfig, Config, CoordinatorConfig
from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.coordinator.intake.presence_memory import PresenceMemory, membership
from ftd.coordinator.ledger.sqlite import Ledger, SqliteStore
from ftd.coordinator.model.state import ClusterState
from ftd.coordinator.wiring import build
from ftd.events import JobAllocation, JobPresence, RankInfo
from tests.unit.helpers import until


def presence(
    node: str, job: str, *ranks: tuple[int, int], allocation: JobAllocation | None = None
) -> JobPresence:
    """``ranks``: (rank, step) pairs."""
    infos = [RankInfo(rank=r, pid=100 + r, step=step, last_beat=float(step)) for r, step in ranks]
    return JobPresence(job=job, node=node, ranks=infos, ts=1.0, allocation=allocation)


async def test_written_on_membership_changes_only_and_without_steps() -> None:
    store = SqliteStore(Ledger(":memory:"))
    memory = PresenceMemory(store, ClusterState())
    await memory.observe("node-1", "7", presence("node-1", "7", (0, 10)))
    for step in range(11, 40):  # heartbeats: newer steps, same ranks
        await memory.observe("node-1", "7", presence("node-1", "7", (0, step)))
    assert memory.writes == 1
    await memory.observe("node-1", "7", presence("node-1", "7", (0, 41), (1, 41)))  # a rank joined
    await memory.observe("node-2", "7", presence("node-2", "7", (2, 41)))
    assert memory.writes == 3
    [one, two] = await store.presences()
    assert [(r.rank, r.pid, r.step, r.last_beat) for r in one.ranks] == [
        (0, 100, None, None),
        (1, 101, None, None),
    ]
    assert two.node == "node-2"

    await memory.observe("node-2", "7", None)  # the job left node-2
    await memory.observe("node-2", "7", None)  # said again: nothing left to drop
    await memory.observe("node-3", "9", JobPresence(job="9", node="node-3"))  # never kept: no write
    assert memory.writes == 4
    assert [(p.node, p.job) for p in await store.presences()] == [("node-1", "7")]


async def test_loaded_into_the_state_then_what_stopped_is_forgotten() -> None:
    ledger = Ledger(":memory:")
    store = SqliteStore(ledger)
    prolog = JobAllocation(user="ann", uid=1000)
    before = PresenceMemory(store, ClusterState())
    for p in (
        presence("node-1", "7", (0, 5)),
        presence("node-2", "7", (1, 5)),
        presence("node-1", "8", (0, 9)),
        presence("node-3", "9", allocation=prolog),
    ):
        await before.observe(p.node, p.job, p)

    state = ClusterState()
    after = PresenceMemory(store, state)  # a restart: a new memory over the same ledger
    assert await after.load() == 4
    assert state.jobs_on_node("node-1") == ["7", "8"] and state.jobs_on_node("node-3") == ["9"]
    assert state.jobs["7"].ranks == {0, 1}

    # The scheduler runs job 7 on node-1 only now, job 9 still; job 8 ended.
    running = {"7": frozenset({"node-1"}), "9": frozenset({"node-3"})}
    assert await after.forget_stopped(running.get) == 2
    assert state.jobs_on_node("node-1") == ["7"] and state.jobs_on_node("node-2") == []
    assert "8" not in state.jobs
    assert [(p.node, p.job) for p in await store.presences()] == [("node-1", "7"), ("node-3", "9")]


class NoBulkCall(FakeScheduler):
    """A scheduler that can only be asked one job at a time (as Kubernetes' is)."""

    running_job_nodes = None


async def test_without_a_bulk_call_each_remembered_job_is_looked_up_at_start(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for p in (
        presence("node-1", "7", (0, 5)),
        presence("node-1", "8", (0, 5)),
        presence("node-2", "7", (1, 5)),
    ):
        ledger.save_presence(membership(p))
    scheduler = NoBulkCall()
    scheduler.add_job("7", ["node-1"])  # 7 now runs on node-1 only; 8 ended
    config = Config(coordinator=CoordinatorConfig(ledger_path=str(ledger.path), api=ApiConfig(enabled=False)))
    coordinator = build(
        config, bus=MemoryBus(MemoryBroker(), client_id="coordinator"), scheduler=scheduler, ledger=ledger
    )
    run = asyncio.create_task(coordinator.run())
    try:
        await until(lambda: len(ledger.presences()) == 1)
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await coordinator.close()
    assert sorted(args for op, args in scheduler.calls if op == "job_nodes") == [("7",), ("8",)]
    assert (
        coordinator.state.jobs_on_node("node-1") == ["7"] and coordinator.state.jobs_on_node("node-2") == []
    )
