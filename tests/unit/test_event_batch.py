"""Batched events (ftd/v1/nodes/{node}/events/batch): decoded, node-checked, all-or-nothing, committed per
chunk with the event loop running between chunks, within the node's rate, refused whole over the size
limit -- and every event in one receipted, committed or rejected."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ftd.bus import topics
from ftd.bus.base import Message
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import parse_config
from ftd.coordinator.daemon import Coordinator
from ftd.coordinator.intake.admission import MAX_BATCH_BYTES
from ftd.coordinator.wiring import build
from ftd.events import Kind, encode, make_event
from tests.unit.helpers import loop_turns


def _coordinator(tmp_path: Path, **limits: float) -> Coordinator:
    config = parse_config(f'[coordinator]\nledger_path = "{tmp_path}/l.sqlite"\nscheduler = "none"\n')
    return build(config, bus=MemoryBus(MemoryBroker()), scheduler=None, **limits)


def _batch(*events: object) -> bytes:
    return b"[" + b",".join(encode(e) for e in events) + b"]"  # type: ignore[arg-type]


async def test_batch_is_recorded_and_deduplicated(tmp_path: Path) -> None:
    c = _coordinator(tmp_path)
    events = [make_event("node-1", Kind.GPU_HEALTH, data={"i": i}) for i in range(5)]
    await c.handle_message(Message(topics.node_event_batch("node-1"), _batch(*events)))
    assert c.engine.counters["events"] == 5 and c.bad_messages == 0
    assert {e.id for e in await c.ledger.events(limit=10)} == {e.id for e in events}
    assert not c.ledger.ledger._db.in_transaction  # committed
    await c.handle_message(Message(topics.node_event_batch("node-1"), _batch(*events[:2])))  # redelivery
    assert c.engine.counters["events"] == 5 and c.engine.counters["duplicates"] == 2
    await c.ledger.close()


async def test_batch_with_a_foreign_or_bad_event_is_rejected_whole(tmp_path: Path) -> None:
    c = _coordinator(tmp_path)
    good = make_event("node-1", Kind.GPU_HEALTH)
    forged = make_event("node-2", Kind.XID, data={"code": 79})
    await c.handle_message(Message(topics.node_event_batch("node-1"), _batch(good, forged)))
    await c.handle_message(Message(topics.node_event_batch("node-1"), b'[{"id": 1}]'))
    await c.handle_message(Message(topics.node_event_batch("node-1"), encode(good)))  # not a list
    assert c.bad_messages == 3 and c.engine.counters["events"] == 0
    [summary] = await c.ledger.events()  # nothing of the batches, only what the coordinator made of them
    assert summary.kind == Kind.BAD_INPUT and summary.node == "node-1" and summary.count == 3
    assert summary.data["rejected_reasons"] == {"foreign_node": 1, "invalid": 2}
    # The events of the refused batch are receipted as rejected: an agent would resend them forever.
    receipt = c.receipts.pending["node-1"]
    assert set(receipt.rejected) == {good.id, forged.id} and receipt.ids == []
    assert "in a batch under node 'node-1'" in receipt.rejected[good.id]
    await c.ledger.close()


async def test_oversized_batch_is_refused_unread_and_its_events_receipted_rejected(tmp_path: Path) -> None:
    c = _coordinator(tmp_path)
    events = [make_event("node-1", Kind.GPU_HEALTH, data={"pad": "x" * 1000}) for _ in range(5000)]
    payload = _batch(*events)
    assert len(payload) > MAX_BATCH_BYTES
    assert await c.handle_message(Message(topics.node_event_batch("node-1"), payload))
    assert c.bad_messages == 1 and c.engine.counters["events"] == 0
    [summary] = await c.ledger.events()
    assert summary.data["rejected_reasons"] == {"oversized": 1}
    assert summary.data["largest_bytes"] == len(payload)
    assert set(c.receipts.pending["node-1"].rejected) == {e.id for e in events}
    await c.ledger.close()


async def test_large_batch_is_handled_in_chunks_with_the_loop_running_between(tmp_path: Path) -> None:
    c = _coordinator(tmp_path)
    events = [make_event("node-1", Kind.GPU_HEALTH, data={"i": i}) for i in range(900)]
    async with loop_turns() as turns:
        await asyncio.sleep(0)
        handled = await c.handle(Message(topics.node_event_batch("node-1"), _batch(*events)))
    assert handled
    assert c.engine.counters["events"] == 900 and c.bad_messages == 0
    assert c.receipts.pending["node-1"].ids == [e.id for e in events]
    # 900 events: 4 chunks checked, 4 handled; the loop got a turn between each (7 yields), the
    # ticker ran at least that often.
    assert turns.count >= 7
    await c.ledger.close()


async def test_batch_over_the_node_rate_is_folded_and_all_of_it_receipted(tmp_path: Path) -> None:
    c = _coordinator(tmp_path, node_rate=1e-6, node_burst=100, urgent_reserve=0)
    events = [make_event("node-1", Kind.GPU_HEALTH, data={"i": i}) for i in range(700)]
    assert await c.handle_message(Message(topics.node_event_batch("node-1"), _batch(*events)))
    # 100 within the burst, and the first over it (its signature is new in the window: never folded)
    assert c.engine.counters["events"] == 101
    assert {e.id for e in await c.ledger.events(limit=1000) if e.kind != Kind.BAD_INPUT} == {
        e.id for e in events[:101]
    }
    [summary] = [e for e in await c.ledger.events(limit=1000) if e.kind == Kind.BAD_INPUT]
    assert summary.data["folded"] == 599 and summary.data["folded_kinds"] == {"gpu_health": 599}
    assert sorted(c.receipts.pending["node-1"].ids) == sorted(e.id for e in events)
    assert c.bad_messages == 0
    await c.ledger.close()
