"""End-to-end receipts in the agent's outbox: an event is done on the coordinator's receipt, never on
the broker's PUBACK alone; unreceipted events are sent again, survive a restart, and are bounded."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from ftd.agent.spool import Outbox, Outgoing, read_spool
from ftd.bus.memory import MemoryBroker, MemoryBus


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _bus_pair() -> tuple[MemoryBroker, MemoryBus, MemoryBus]:
    broker = MemoryBroker()
    sub, pub = MemoryBus(broker, client_id="sub"), MemoryBus(broker, client_id="pub")
    await sub.subscribe("t/#")
    await sub.start()
    await pub.start()
    return broker, sub, pub


async def _drain(bus: MemoryBus) -> list[bytes]:
    got: list[bytes] = []
    with contextlib.suppress(TimeoutError):
        while True:
            message = await asyncio.wait_for(bus._queue.get(), 0.05)
            got.append(message.payload)
    return got


async def _published(outbox: Outbox, count: int) -> None:
    for _ in range(200):
        if outbox.sent >= count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"only {outbox.sent} of {count} published")


async def test_an_event_stays_spooled_after_puback_until_its_receipt(tmp_path: Path) -> None:
    _, sub, pub = await _bus_pair()
    spool = tmp_path / "outbox.spool"
    outbox = Outbox(pub, path=spool)
    task = asyncio.create_task(outbox.run())
    for i in range(3):
        outbox.put(Outgoing("t/e", f"e{i}".encode(), receipt_id=f"e{i}"))
    outbox.put(Outgoing("t/ack", b"ack"))  # no receipt id: done on PUBACK
    await _published(outbox, 4)
    assert await _drain(sub) == [b"e0", b"e1", b"e2", b"ack"]
    assert len(outbox) == 3 and outbox.awaiting_receipt == 3
    live, _, problem = read_spool(spool.read_bytes())
    assert problem is None and sorted(e.receipt_id or "" for e in live) == ["e0", "e1", "e2"]

    assert outbox.receipted(["e1", "e1", "unknown"]) == 1  # repeats and strangers are harmless
    live, _, _ = read_spool(spool.read_bytes())
    assert sorted(e.receipt_id or "" for e in live) == ["e0", "e2"]
    assert outbox.rejected({"e2": "event for node 'x' published under node 'y'"}) == 1
    assert len(outbox) == 1 and outbox.receipted_count == 1 and outbox.rejected_count == 1
    task.cancel()
    outbox.close()


async def test_unreceipted_events_are_resent_in_order_when_overdue_or_on_coordinator_online() -> None:
    _, sub, pub = await _bus_pair()
    clock = Clock()
    outbox = Outbox(pub, receipt_timeout_s=30.0, clock=clock)
    task = asyncio.create_task(outbox.run())
    for i in range(3):
        outbox.put(Outgoing("t/e", f"e{i}".encode(), receipt_id=f"e{i}"))
    await _published(outbox, 3)
    await _drain(sub)
    outbox.receipted(["e1"])
    clock.now += 10
    assert outbox.resend_unreceipted(30.0) == 0  # not overdue yet
    clock.now += 25
    assert outbox.resend_unreceipted(30.0) == 2
    await _published(outbox, 5)
    assert await _drain(sub) == [b"e0", b"e2"]
    assert outbox.resend_unreceipted() == 2  # the coordinator (re)announced itself: everything again
    await _published(outbox, 7)
    assert await _drain(sub) == [b"e0", b"e2"]
    outbox.receipted(["e0", "e2"])
    assert len(outbox) == 0 and outbox.resent == 4
    task.cancel()


async def test_a_restarted_agent_resends_what_was_acknowledged_by_the_broker_but_never_receipted(
    tmp_path: Path,
) -> None:
    _, sub, pub = await _bus_pair()
    spool = tmp_path / "outbox.spool"
    first = Outbox(pub, path=spool)
    task = asyncio.create_task(first.run())
    for i in range(5):
        first.put(Outgoing("t/e", f"e{i}".encode(), priority=2, receipt_id=f"e{i}"))
    await _published(first, 5)
    first.receipted(["e0", "e3"])
    task.cancel()
    first.close()  # the agent dies: the broker had all 5, the coordinator committed 2

    second = Outbox(pub, path=spool)
    assert second.replayed == 3
    task = asyncio.create_task(second.run())
    await _published(second, 3)
    assert (await _drain(sub))[-3:] == [b"e1", b"e2", b"e4"]
    second.receipted(["e1", "e2", "e4"])
    assert len(second) == 0
    task.cancel()
    second.close()


async def test_the_bound_counts_events_awaiting_receipts_and_drops_low_severity_first() -> None:
    broker, _, pub = await _bus_pair()
    outbox = Outbox(pub, max_entries=3)
    task = asyncio.create_task(outbox.run())
    outbox.put(Outgoing("t/e", b"info", priority=0, receipt_id="info"))
    outbox.put(Outgoing("t/e", b"crit-1", priority=3, receipt_id="crit-1"))
    await _published(outbox, 2)  # both wait for receipts now (the coordinator is away)
    broker.go_down()
    outbox.put(Outgoing("t/e", b"crit-2", priority=3, receipt_id="crit-2"))
    outbox.put(Outgoing("t/e", b"crit-3", priority=3, receipt_id="crit-3"))  # evicts the awaiting info
    assert len(outbox) == 3 and outbox.dropped == 1
    assert outbox.receipted(["info"]) == 0  # it was dropped, counted, and is gone
    task.cancel()


async def test_an_event_id_already_held_is_not_queued_twice_and_does_not_kill_the_publisher() -> None:
    """A restarted agent may re-publish an event its spool still holds (storm checkpoint replay):
    before, the second put overwrote the id index and the publisher died with KeyError."""
    _, sub, pub = await _bus_pair()
    outbox = Outbox(pub)
    task = asyncio.create_task(outbox.run())
    outbox.put(Outgoing("t/e", b"e0", receipt_id="e0"))
    outbox.put(Outgoing("t/e", b"e0", receipt_id="e0"))  # still queued
    await _published(outbox, 1)
    outbox.put(Outgoing("t/e", b"e0", receipt_id="e0"))  # now awaiting its receipt
    outbox.put(Outgoing("t/e", b"e1", receipt_id="e1"))
    await _published(outbox, 2)
    assert not task.done() and await _drain(sub) == [b"e0", b"e1"]
    assert outbox.receipted(["e0", "e1"]) == 2 and len(outbox) == 0
    task.cancel()
