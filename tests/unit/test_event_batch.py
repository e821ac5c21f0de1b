"""Batched events (ftd/v1/nodes/{node}/events/batch): decoded, node-checked, all-or-nothing, one commit."""

from __future__ import annotations

from pathlib import Path

from ftd.bus import topics
from ftd.bus.base import Message
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import parse_config
from ftd.coordinator.app import Coordinator
from ftd.events import Kind, encode, make_event


def _coordinator(tmp_path: Path) -> Coordinator:
    config = parse_config(f'[coordinator]\nledger_path = "{tmp_path}/l.sqlite"\nscheduler = "none"\n')
    return Coordinator(config, bus=MemoryBus(MemoryBroker()), scheduler=None)


def _batch(*events: object) -> bytes:
    return b"[" + b",".join(encode(e) for e in events) + b"]"  # type: ignore[arg-type]


async def test_batch_is_recorded_and_deduplicated(tmp_path: Path) -> None:
    c = _coordinator(tmp_path)
    events = [make_event("node-1", Kind.GPU_HEALTH, data={"i": i}) for i in range(5)]
    c.handle_message(Message(topics.node_event_batch("node-1"), _batch(*events)))
    assert c.engine.counters["events"] == 5 and c.bad_messages == 0
    assert {e.id for e in c.ledger.events(limit=10)} == {e.id for e in events}
    assert not c.ledger._db.in_transaction  # committed
    c.handle_message(Message(topics.node_event_batch("node-1"), _batch(*events[:2])))  # redelivery
    assert c.engine.counters["events"] == 5 and c.engine.counters["duplicates"] == 2
    c.ledger.close()


async def test_batch_with_a_foreign_or_bad_event_is_rejected_whole(tmp_path: Path) -> None:
    c = _coordinator(tmp_path)
    good = make_event("node-1", Kind.GPU_HEALTH)
    forged = make_event("node-2", Kind.XID, data={"code": 79})
    c.handle_message(Message(topics.node_event_batch("node-1"), _batch(good, forged)))
    c.handle_message(Message(topics.node_event_batch("node-1"), b'[{"id": 1}]'))
    c.handle_message(Message(topics.node_event_batch("node-1"), encode(good)))  # not a list
    assert c.bad_messages == 3 and c.engine.counters["events"] == 0
    assert c.ledger.events() == []
    c.ledger.close()
