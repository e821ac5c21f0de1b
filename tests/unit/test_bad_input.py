"""The daemons never crash on bad bus input: every bad payload is counted, logged and ignored."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftd.agent.app import Agent
from ftd.bus import topics
from ftd.bus.base import Message
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import AgentConfig, Config, CoordinatorConfig
from ftd.coordinator.app import Coordinator
from ftd.coordinator.ledger import Ledger
from ftd.events import Kind, encode, make_event


def make_coordinator() -> Coordinator:
    config = Config(coordinator=CoordinatorConfig(ledger_path=":memory:", scheduler="none"))
    return Coordinator(config, bus=MemoryBus(MemoryBroker()), scheduler=None, ledger=Ledger(":memory:"))


BAD = [
    (topics.node_event("node-1", "xid"), b"not json"),
    (topics.node_event("node-1", "xid"), b'{"schema":1,"id":"x"}'),  # missing fields
    (topics.node_event("node-1", "xid"), encode(make_event("node-2", Kind.XID))),  # spoofed node
    (
        topics.node_event("node-1", "xid"),
        b'{"schema":1,"id":"x","ts":1,"node":"node-1","kind":"boom","severity":"error","source":"kmsg"}',
    ),  # unknown kind
    (topics.node_status("node-1"), b'{"schema":1,"node":"node-1","state":"maybe"}'),
    (topics.node_job("node-1", "7"), b'{"schema":1,"job":"8","node":"node-1"}'),  # topic mismatch
    (topics.node_acks("node-1"), b"\xff\xfe\x00"),
    ("ftd/v1/nodes/node-1/unknown", b"{}"),
    ("ftd/v1/elsewhere", b"{}"),
    ("other/prefix", b"{}"),
]


def test_every_kind_of_bad_message_is_counted_and_a_good_one_still_works() -> None:
    coordinator = make_coordinator()
    for topic, payload in BAD:
        coordinator.handle_message(Message(topic, payload))
    assert coordinator.bad_messages == len(BAD)
    good = make_event("node-1", Kind.XID, data={"code": 43})
    coordinator.handle_message(Message(topics.node_event("node-1", "xid"), encode(good)))
    assert coordinator.engine.counters["events"] == 1
    assert coordinator.bad_messages == len(BAD)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["events/xid", "status", "jobs/1", "acks", "events/ecc", "directives"]),
    st.binary(max_size=300) | st.text(max_size=300).map(str.encode),
)
def test_fuzzed_payloads_never_raise(suffix: str, payload: bytes) -> None:
    coordinator = make_coordinator()
    coordinator.handle_message(Message(f"ftd/v1/nodes/node-1/{suffix}", payload))


async def test_agent_counts_bad_directives_and_keeps_relaying(tmp_path: Path) -> None:
    broker = MemoryBroker()
    cfg = AgentConfig(
        node="node-1",
        kmsg_path=str(tmp_path / "kmsg"),
        state_dir=str(tmp_path / "state"),
        socket_path=str(tmp_path / "a.sock"),
    )
    (tmp_path / "kmsg").touch()
    agent = Agent(cfg, bus=MemoryBus(broker, client_id="agent"), node="node-1")
    task = asyncio.create_task(agent.run())
    coordinator_bus = MemoryBus(broker, client_id="coordinator")
    await coordinator_bus.start()
    try:
        await agent.bus.wait_connected(5)
        await asyncio.sleep(0.05)
        for payload in (b"garbage", b'{"schema":1,"id":"d","ts":1,"action":"explode"}', b"[]"):
            await coordinator_bus.publish(topics.job_directives("1001"), payload)
        await asyncio.sleep(0.05)
        assert agent.bad_messages == 3
        assert not task.done()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
