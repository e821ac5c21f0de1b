"""The daemons never crash on bad bus input: every bad payload is counted, logged and ignored; the
coordinator also reports it in the node's ``bad_input`` summary and receipts the events it could read
as rejected."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftd.agent.wiring import build_agent
from ftd.bus import topics
from ftd.bus.base import Message
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import AgentConfig, Config, CoordinatorConfig
from ftd.coordinator.daemon import Coordinator
from ftd.coordinator.ledger.sqlite import Ledger
from ftd.coordinator.wiring import build
from ftd.events import MAX_PAYLOAD_BYTES, Event, Kind, Severity, encode, make_event
from tests.properties import examples


def make_coordinator() -> Coordinator:
    config = Config(coordinator=CoordinatorConfig(ledger_path=":memory:", scheduler="none"))
    return build(config, bus=MemoryBus(MemoryBroker()), scheduler=None, ledger=Ledger(":memory:"))


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


async def test_every_kind_of_bad_message_is_counted_and_a_good_one_still_works() -> None:
    coordinator = make_coordinator()
    for topic, payload in BAD:
        assert await coordinator.handle_message(Message(topic, payload))  # refused for good: acknowledge it
    assert coordinator.bad_messages == len(BAD)
    good = make_event("node-1", Kind.XID, data={"code": 43})
    await coordinator.handle_message(Message(topics.node_event("node-1", "xid"), encode(good)))
    assert coordinator.engine.counters["events"] == 1
    assert coordinator.bad_messages == len(BAD)
    # Those under node-1's topics are reported in its bad_input summary; the foreign topics have no
    # node to charge them to and are only counted.
    [summary] = await summaries(coordinator, "node-1")
    assert summary.source == "coordinator" and summary.severity == Severity.WARNING
    assert summary.data["rejected"] == len(BAD) - 2 == summary.count
    assert summary.data["rejected_reasons"] == {"foreign_node": 1, "invalid": len(BAD) - 3}


async def summaries(coordinator: Coordinator, node: str) -> list[Event]:
    return [e for e in await coordinator.ledger.events(limit=1000, node=node) if e.kind == Kind.BAD_INPUT]


def deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def event_json(**fields: Any) -> bytes:
    doc = json.loads(encode(make_event("node-1", Kind.XID, data={"code": 43})))
    doc.update(fields)
    return json.dumps(doc).encode()


# (topic suffix, payload, reason in the summary, event id receipted as rejected or None)
POISON: list[tuple[str, bytes, str, str | None]] = [
    (
        "events/xid",
        event_json(id="deep", data="D").replace(b'"D"', b'{"a":' + deep(1000) + b"}"),
        "invalid",
        None,
    ),
    ("events/xid", deep(100_000), "invalid", None),
    ("events/batch", deep(100_000), "invalid", None),
    ("status", b'{"schema":1,"node":"node-1","state":' + deep(5000) + b"}", "invalid", None),
    ("acks", deep(1000), "invalid", None),
    ("jobs/7", b'{"schema":1,"job":"7","node":"node-1","ranks":' + deep(1000) + b"}", "invalid", None),
    (
        "events/xid",
        event_json(id="data-17-deep", data=json.loads('{"a":' * 17 + "1" + "}" * 17)),  # one too deep
        "invalid",
        "data-17-deep",
    ),
    (
        "events/log_pattern",
        event_json(id="huge", data={"line": "x" * MAX_PAYLOAD_BYTES}),
        "oversized",
        "huge",
    ),
    (
        "status",
        b'{"schema":1,"node":"node-1","state":"online","pad":"' + b"x" * MAX_PAYLOAD_BYTES + b'"}',
        "oversized",
        None,
    ),
    ("events/xid", event_json(id="ts-str", ts="yesterday"), "invalid", "ts-str"),
    ("events/xid", event_json(id="data-list", data=[1, 2]), "invalid", "data-list"),
    ("events/xid", event_json(id="schema-2", schema=2), "invalid", "schema-2"),
    ("events/xid", event_json(id="k" * 300, ts="now"), "invalid", None),  # an id too long to echo back
    ("events/xid", event_json(id=7), "invalid", None),
    ("events/xid", b"null", "invalid", None),
    ("events/xid", b"\xff\xfe", "invalid", None),
    (
        "events/xid",
        b'{"schema":1,"id":"nan","ts":1e999999,"node":"node-1","kind":"xid","severity":"error","source":"k"}',
        "invalid",
        "nan",
    ),
    ("events/xid", event_json(id="spoof", node="node-2"), "foreign_node", "spoof"),
]


async def test_poison_is_contained_counted_summarised_and_receipted() -> None:
    """Depth, size and types: every decoding failure is contained, counted once, reported in the
    node's bad_input summary by reason, never stored; events with a readable id are receipted as
    rejected so the agent does not resend them forever."""
    coordinator = make_coordinator()
    for suffix, payload, _reason, _id in POISON:
        assert await coordinator.handle_message(Message(f"ftd/v1/nodes/node-1/{suffix}", payload))
    assert coordinator.bad_messages == len(POISON)
    assert coordinator.engine.counters["events"] == 0
    [summary] = await summaries(coordinator, "node-1")
    assert summary.data["rejected"] == len(POISON)
    assert summary.data["rejected_reasons"] == dict(Counter(reason for _s, _p, reason, _i in POISON))
    assert summary.data["largest_bytes"] == max(len(p) for _s, p, _r, _i in POISON)
    receipt = coordinator.receipts.pending["node-1"]
    assert receipt.ids == []
    assert set(receipt.rejected) == {i for _s, _p, _r, i in POISON if i is not None}
    assert "over the limit" in receipt.rejected["huge"]
    assert "published under node 'node-1'" in receipt.rejected["spoof"]
    assert await coordinator.ledger.events(limit=100) == [summary]  # nothing of the poison itself


async def test_a_failing_handler_is_contained_and_its_event_receipted_rejected(monkeypatch: Any) -> None:
    coordinator = make_coordinator()

    async def explode(event: Event) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(coordinator.engine, "handle_event", explode)
    event = make_event("node-1", Kind.XID, data={"code": 43})
    assert await coordinator.handle_message(Message(topics.node_event("node-1", "xid"), encode(event)))
    assert coordinator.bad_messages == 1
    assert coordinator.receipts.pending["node-1"].rejected == {event.id: "RuntimeError: bug"}
    [summary] = await summaries(coordinator, "node-1")
    assert summary.data["rejected_reasons"] == {"error": 1}


async def test_a_storage_error_leaves_the_message_for_redelivery(monkeypatch: Any) -> None:
    coordinator = make_coordinator()

    async def broken(event: Event) -> bool:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(coordinator.ledger, "record_event", broken)
    event = make_event("node-1", Kind.XID, data={"code": 43})
    assert not await coordinator.handle_message(Message(topics.node_event("node-1", "xid"), encode(event)))
    assert coordinator.storage_errors == 1 and coordinator.bad_messages == 0
    assert "node-1" not in coordinator.receipts.pending


@settings(max_examples=examples(300), suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["events/xid", "events/batch", "status", "jobs/1", "acks", "events/ecc", "directives"]),
    st.binary(max_size=300) | st.text(max_size=300).map(str.encode),
)
def test_fuzzed_payloads_never_raise(suffix: str, payload: bytes) -> None:
    async def handle() -> None:
        coordinator = make_coordinator()
        assert await coordinator.handle_message(Message(f"ftd/v1/nodes/node-1/{suffix}", payload))
        assert coordinator.bad_messages == (0 if not payload and suffix in ("status", "jobs/1") else 1)

    asyncio.run(handle())


async def test_agent_counts_bad_directives_and_keeps_relaying(tmp_path: Path) -> None:
    broker = MemoryBroker()
    cfg = AgentConfig(
        node="node-1",
        kmsg_path=str(tmp_path / "kmsg"),
        state_dir=str(tmp_path / "state"),
        socket_path=str(tmp_path / "a.sock"),
    )
    (tmp_path / "kmsg").touch()
    agent = build_agent(cfg, bus=MemoryBus(broker, client_id="agent"), node="node-1")
    task = asyncio.create_task(agent.run())
    coordinator_bus = MemoryBus(broker, client_id="coordinator")
    await coordinator_bus.start()
    try:
        await agent.bus.wait_connected(5)
        await asyncio.sleep(0.05)
        for payload in (b"garbage", b'{"schema":1,"id":"d","ts":1,"action":"explode"}', b"[]"):
            await coordinator_bus.publish(topics.node_job_directives("node-1"), payload)
        await asyncio.sleep(0.05)
        assert agent.bad_messages == 3
        assert not task.done()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
