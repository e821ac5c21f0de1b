"""Per-node fairness (ftd.coordinator.intake.fairness): token buckets, the bad_input book, and a live
coordinator on the in-process bus taking a flood from one node while another node's events are all
decided -- with exact counts of what was handled, folded, receipted and acknowledged."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from ftd.bus import topics
from ftd.bus.base import Message
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import parse_config
from ftd.coordinator.intake.fairness import (
    MAX_ID_SCAN_BYTES,
    InputBook,
    RateLimiter,
    TokenBucket,
    readable_ids,
)
from ftd.coordinator.wiring import build
from ftd.events import Event, Kind, Receipt, Severity, decode, encode, make_event
from tests.unit.helpers import until


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# --- token bucket and limiter --------------------------------------------------------------------


def test_bucket_allows_a_burst_then_the_rate() -> None:
    bucket = TokenBucket(rate=10, burst=5, reserve=0, now=0.0)
    assert [bucket.take(0.0) for _ in range(6)] == [True] * 5 + [False]
    assert not bucket.take(0.05)  # half a token
    assert bucket.take(0.1)  # one more after 1/rate seconds
    assert not bucket.take(0.1)
    assert sum(bucket.take(10.0) for _ in range(100)) == 5  # refills to the burst, no further


def test_urgent_events_have_a_reserve_ordinary_ones_cannot_touch() -> None:
    bucket = TokenBucket(rate=1, burst=3, reserve=2, now=0.0)
    assert sum(bucket.take(0.0) for _ in range(10)) == 3
    assert bucket.take(0.0, urgent=True) and bucket.take(0.0, urgent=True)
    assert not bucket.take(0.0, urgent=True)


def test_limiter_keeps_one_bucket_per_node_and_forgets_full_ones() -> None:
    clock = Clock(0.0)
    limiter = RateLimiter(rate=1, burst=2, reserve=1, clock=clock)
    assert [limiter.admit("a", Severity.INFO) for _ in range(3)] == [True, True, False]
    assert limiter.admit("b", Severity.INFO)  # b has its own bucket
    assert limiter.admit("a", Severity.CRITICAL) and not limiter.admit("a", Severity.ERROR)
    assert len(limiter) == 2
    clock.now = limiter.PRUNE_S + 10  # both refilled: forgotten at the next prune
    limiter.admit("c", Severity.INFO)
    assert len(limiter) == 1


# --- the book ----------------------------------------------------------------------------------


def test_book_folds_and_refuses_into_one_summary_per_node_and_window() -> None:
    clock = Clock()
    book = InputBook(window_s=60, limits={"rate": 1.0}, clock=clock)
    events = [make_event("n1", Kind.GPU_HEALTH, severity=Severity.INFO) for _ in range(3)]
    assert book.fold(events[0])  # opened the window
    assert not book.fold(events[1]) and not book.fold(events[2])
    assert not book.reject("n1", "oversized", "too big", 5000, ids=["x1"])
    assert book.reject("n2", "invalid", "not json", 3)
    [s1, s2] = sorted(book.pending(), key=lambda e: e.node)
    assert s1.kind == Kind.BAD_INPUT and s1.source == "coordinator" and s1.count == 4
    assert s1.data["folded"] == 3 and s1.data["folded_kinds"] == {"gpu_health": 3}
    assert s1.data["rejected_reasons"] == {"oversized": 1} and s1.data["largest_bytes"] == 5000
    assert s1.data["limits"] == {"rate": 1.0}
    assert s2.count == 1 and s2.data["last_error"] == "not json"
    done = book.committed()
    assert done.folded == {"n1": [e.id for e in events]}
    assert done.rejected == {"n1": {"x1": "too big"}}
    assert book.pending() == [] and not book.dirty

    # The same window grows under the same id; after window_s a new one opens.
    clock.now += 30
    book.fold(make_event("n1", Kind.XID, severity=Severity.ERROR))
    [again] = book.pending()
    assert again.id == s1.id and again.data["folded"] == 4
    assert again.data["folded_severities"] == {"info": 3, "error": 1}
    book.committed()
    clock.now += 31
    assert book.fold(make_event("n1", Kind.XID))
    [later] = book.pending()
    assert later.id != s1.id and later.data["folded"] == 1
    assert (book.folded_total, book.rejected_total, book.windows_opened) == (5, 2, 3)


def test_readable_ids_of_refused_payloads() -> None:
    event = make_event("n1", Kind.XID)
    assert readable_ids(encode(event), batch=False) == [event.id]
    assert readable_ids(b"[" + encode(event) + b"," + encode(event) + b"]", batch=True) == [event.id] * 2
    assert readable_ids(b'{"id": 5}', batch=False) == []
    assert readable_ids(b'{"id": "' + b"k" * 1000 + b'"}', batch=False) == []
    assert readable_ids(b'{"id":"a","data":' + b"[" * 50_000 + b"]" * 50_000 + b"}", batch=False) == []
    assert readable_ids(b'{"id":"a"}' + b" " * MAX_ID_SCAN_BYTES, batch=False) == []
    assert readable_ids(b"\xff", batch=True) == []


# --- a live coordinator on the in-process bus --------------------------------------------------


class AckingBus(MemoryBus):
    """The in-process bus, recording what the coordinator acknowledges."""

    def __init__(self, broker: MemoryBroker) -> None:
        super().__init__(broker, client_id="coordinator")
        self.acked: list[Message] = []

    def ack(self, message: Message) -> None:
        self.acked.append(message)


class Node:
    def __init__(self, broker: MemoryBroker, name: str) -> None:
        self.name = name
        self.bus = MemoryBus(broker, client_id=name)
        self.committed: list[str] = []
        self.rejected: dict[str, str] = {}

    async def start(self) -> None:
        await self.bus.subscribe(topics.node_receipts(self.name))
        await self.bus.start()
        self._task = asyncio.create_task(self._receipts())

    async def _receipts(self) -> None:
        async for message in self.bus.messages():
            receipt = decode(message.payload, Receipt, max_bytes=64 << 20)
            self.committed += receipt.ids
            self.rejected.update(receipt.rejected)

    async def send(self, event: Event) -> None:
        await self.bus.publish(topics.node_event(self.name, str(event.kind)), encode(event))

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def test_flooding_node_is_folded_and_receipted_while_the_other_node_is_decided(tmp_path: Path) -> None:
    config = parse_config(
        f'[coordinator]\nledger_path = "{tmp_path}/l.sqlite"\nscheduler = "none"\n'
        "[coordinator.api]\nenabled = false\n"
    )
    broker = MemoryBroker()
    bus = AckingBus(broker)
    # A rate that refills nothing during the test, so the counts are exact: 200 ordinary events,
    # then 50 more of severity error or worse from the reserve.
    coordinator = build(config, bus=bus, scheduler=None, node_rate=1e-6, node_burst=200, urgent_reserve=50)
    decided: list[str] = []
    coordinator.engine.observe(lambda what, p: decided.append(p.id) if what == "event" else None)
    flood, other = Node(broker, "flood"), Node(broker, "quiet")
    await flood.start()
    await other.start()
    run = asyncio.create_task(coordinator.run())
    try:
        await until(lambda: coordinator.bus.connected)
        sent: list[Event] = []
        quiet: list[Event] = []
        for i in range(3000):
            severity = Severity.CRITICAL if i % 10 == 0 else Severity.INFO
            sent.append(make_event("flood", Kind.GPU_HEALTH, severity=severity, data={"i": i}))
            await flood.send(sent[-1])
            if i % 100 == 0:
                quiet.append(make_event("quiet", Kind.THERMAL, data={"i": i}))
                await other.send(quiet[-1])
        await until(lambda: len(flood.committed) == len(sent) and len(other.committed) == len(quiet), 20)
        await until(lambda: len(bus.acked) == len(sent) + len(quiet))

        assert sorted(flood.committed) == sorted(e.id for e in sent) and not flood.rejected
        assert other.committed == [e.id for e in quiet]  # all decided, none folded
        assert [i for i in decided if i.startswith("quiet")] == [e.id for e in quiet]
        stored = [i for i in decided if i.startswith("flood")]
        # The first 200 events; over the rate, every critical one (every 10th: the first 50 from the
        # reserve, the rest because critical is never folded) and the first ordinary one (its
        # signature, gpu_health, was new in the window); the other ordinary ones are folded.
        ordinary = [e.id for e in sent[:200]]
        over = [e.id for e in sent[200:] if e.severity == Severity.CRITICAL or e is sent[201]]
        assert stored == ordinary + over
        assert len(over) == 281 and coordinator.admission.novelty.evaluated_critical == 280 - 50
        [summary] = [
            e for e in await coordinator.ledger.events(node="flood", limit=5000) if e.kind == Kind.BAD_INPUT
        ]
        assert summary.data["folded"] == len(sent) - len(stored) == summary.count
        assert summary.data["rejected"] == 0 and coordinator.bad_messages == 0
        assert coordinator.summary()["folded"] == len(sent) - len(stored)
        assert [e for e in await coordinator.ledger.events(node="quiet") if e.kind == Kind.BAD_INPUT] == []
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await coordinator.close()
        await flood.stop()
        await other.stop()
