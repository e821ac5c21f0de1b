"""The coordinator's Slurm interruption source end to end in one process (issue #37): a job's
presence makes it watched; the scheduler's preemption becomes one ``Kind.INTERRUPTION`` event that the
engine records like every event the coordinator writes itself (node_offline, rank_slow)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec

from ftd.bus import topics
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import ApiConfig, Config, CoordinatorConfig, SlurmConfig
from ftd.config.schema import SlurmInterruptionsConfig
from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.coordinator.ledger.sqlite import Ledger
from ftd.coordinator.wiring import build
from ftd.events import Interruption, JobPresence, Kind, RankInfo, encode
from tests.unit.helpers import until


async def test_a_preempted_running_job_becomes_one_interruption_event(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    scheduler = FakeScheduler()
    scheduler.add_job("7", ["node-1"], time_limit_s=3600)
    slurm = SlurmConfig(interruptions=SlurmInterruptionsConfig(interval_s=0.01))
    config = Config(
        coordinator=CoordinatorConfig(ledger_path=str(ledger.path), api=ApiConfig(enabled=False), slurm=slurm)
    )
    broker = MemoryBroker()
    coordinator = build(
        config, bus=MemoryBus(broker, client_id="coordinator"), scheduler=scheduler, ledger=ledger
    )
    agent = MemoryBus(broker, client_id="agent")
    await agent.start()
    run = asyncio.create_task(coordinator.run())

    def interruptions() -> list[Interruption]:
        found = [e for e in ledger.events(limit=1000) if e.kind == Kind.INTERRUPTION]
        return [msgspec.convert(e.data, Interruption) for e in found]

    try:
        presence = JobPresence(
            job="7", node="node-1", ranks=[RankInfo(rank=0, pid=10, step=1, last_beat=1.0)], ts=1.0
        )
        await agent.publish(topics.node_job("node-1", "7"), encode(presence), retain=True)
        await until(lambda: coordinator.interruptions.watched == ("7",))
        await asyncio.sleep(0.05)  # several polls: an hour left is nothing to announce
        assert interruptions() == []
        scheduler.preempt_job("7", grace_s=20)
        await until(lambda: bool(interruptions()))
        await asyncio.sleep(0.05)  # more polls: the same preemption is not announced twice
        announced = interruptions()
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await coordinator.close()
        await agent.stop()
    [it] = announced
    assert it.source == "slurm_preempt" and it.job == "7" and it.deadline - it.notice_at == 20.0
