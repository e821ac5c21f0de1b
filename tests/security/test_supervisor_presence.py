"""A rank supervisor's presence (``ftd run``, issue #24) speaks for a job like ranks do: a presence
with only a supervisor -- a hot spare's -- is believed from a node of the job's allocation and
refused (a placement violation) from any other, through the real Coordinator's message handling."""

from __future__ import annotations

import time

from ftd.bus import topics
from ftd.bus.base import Message
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import ApiConfig, Config, CoordinatorConfig
from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.coordinator.ledger.sqlite import Ledger
from ftd.coordinator.wiring import build
from ftd.events import JobPresence, SupervisorInfo, encode


def spare_presence(node: str, job: str) -> Message:
    info = SupervisorInfo(role="spare", state="idle", preflight="ok", nodes=1)
    body = JobPresence(job=job, node=node, supervisor=info, ts=time.time())
    return Message(topics.node_job(node, job), encode(body), retain=True)


async def test_a_spares_presence_counts_only_from_the_jobs_allocation() -> None:
    scheduler = FakeScheduler()
    scheduler.add_job("77", ["node-1", "node-2"])  # node-2: the spare, in the allocation
    scheduler.add_node("node-9")
    config = Config(coordinator=CoordinatorConfig(ledger_path=":memory:", api=ApiConfig(enabled=False)))
    c = build(config, bus=MemoryBus(MemoryBroker()), scheduler=scheduler, ledger=Ledger(":memory:"))
    assert await c.handle(spare_presence("node-2", "77"))
    assert c.state.jobs["77"].spares == ["node-2"] and c.state.jobs["77"].nodes == []
    before = c.placement.violations
    assert await c.handle(spare_presence("node-9", "77"))  # forged: node-9 is not the job's
    assert c.placement.violations == before + 1
    assert c.state.jobs["77"].spares == ["node-2"]
    remembered = await c.ledger.presences()  # a restarted coordinator knows the spare at once
    assert [(p.node, p.supervisor.role if p.supervisor else None) for p in remembered] == [
        ("node-2", "spare")
    ]
