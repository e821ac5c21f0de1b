"""The agent's outbox: everything the agent publishes waits here until it has been taken care of.

Bounded and ordered. A single publisher task sends the oldest entry and waits for the PUBACK; while
the bus is down it waits for the reconnect and retries, so a broker outage delays events but loses
none until the bound is hit.

**End-to-end receipts** (docs/architecture.md §11.1): an entry with a ``receipt_id`` (every event) is *not*
done on the broker's PUBACK: a broker that is killed loses what it held in memory, and a coordinator whose
session did not exist yet never gets it. It waits, still spooled, until the coordinator's
:class:`~ftd.events.Receipt` names it (:meth:`Outbox.receipted`: the event is in the ledger), and is sent
again when the coordinator (re)announces itself online (:meth:`Outbox.resend_unreceipted`) or when no receipt
came within ``receipt_timeout_s``. The coordinator drops the duplicates by id and receipts them again. Entries
without a receipt id (acks, job presence) are done on PUBACK. At the bound the oldest *low-severity* entry is
dropped first (info, then warning, ...), and every drop is counted (the agent reports the count as an
``agent_health`` event).

**Durable spool** (``path`` given): every *durable* entry is appended to an on-disk log *before*
:meth:`Outbox.put` returns, and a tombstone is appended once it is done (receipted, or acknowledged
for entries without a receipt id, or dropped for space). On start the log is replayed: entries without
a tombstone (not done when the previous agent died) are queued first, in their original order, and re-
published; the coordinator drops the duplicates by event id. So an agent killed during a broker outage
loses nothing that had reached its spool.

Housekeeping: when nothing is queued or awaiting a receipt and the file has grown past 64 KiB it is
truncated back to its header; when it is larger than ``compact_bytes`` and mostly tombstones it is
rewritten with only the live entries. The live size is bounded by ``max_bytes`` as well as
``max_entries``. The file and its format are :mod:`ftd.agent.spool.file` and
:mod:`ftd.agent.spool.records`; a damaged file is put aside at start and its intact entries
salvaged (:attr:`Outbox.damage`; the agent publishes a ``spool_corrupt`` ``agent_health`` event).

Storage faults (docs/architecture.md §11.2: reported, never fatal): a failed write (``ENOSPC``, ``EDQUOT``,
``EIO``; a short write is continued and, when the rest cannot be written, is one) is cut back to the last good
offset with ``ftruncate``, so no torn record is ever left to look like corruption, and the outbox goes
*memory-only*: entries are still queued, published and receipted, but not written, and nothing is lost while
the agent runs (:attr:`Outbox.spool_error`, :attr:`Outbox.spool_outages`; the agent reports
``spool_unavailable`` once per outage). Every ``spool_retry_s`` (on the next put, or when the agent calls
:meth:`Outbox.check_spool`) it tries to go back: if ``statvfs`` shows room for them, the entries held are
rewritten to a fresh file (temp file, ``rename``) and appending resumes (:attr:`Outbox.spool_recoveries`). An
agent killed during an outage loses what it held only in memory (nothing else is possible on a full disk);
what reached the file before the outage is replayed, and entries finished during the outage may come back once
as duplicates. Failing to open or rewrite the file at start is the same outage, with the replayed entries held
in memory; only an unreadable file or an uncreatable ``state_dir`` raises :class:`OSError` from the
constructor.

Non-durable entries (``Outgoing.durable=False``: retained job presence and node status, whose replay
after a restart would resurrect stale state) are held in memory only.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ftd.agent.spool.file import SpoolFile
from ftd.agent.spool.records import Entry, SpoolDamage, del_record, put_record
from ftd.bus.base import Bus, BusUnavailable
from ftd.logs import get_logger

log = get_logger(__name__)

__all__ = ["Outbox", "Outgoing"]

TRUNCATE_AT = 64 << 10
RETRY_PAUSE_S = 0.05  # a publish failed while the bus said "connected": wait this long, then retry


@dataclass(frozen=True, slots=True)
class Outgoing:
    topic: str
    payload: bytes
    retain: bool = False
    priority: int = 1  # 0 info .. 3 critical; the lowest is dropped first when full
    durable: bool = True  # spooled to disk (when the outbox has a spool)
    receipt_id: str | None = None  # done on the coordinator's receipt for this id, not on PUBACK


class Outbox:
    """Ordered, bounded, acknowledged publishing; durable when given a spool ``path``."""

    def __init__(
        self,
        bus: Bus,
        *,
        max_entries: int = 10000,
        path: Path | str | None = None,
        max_bytes: int = 64 << 20,
        fsync: bool = False,
        compact_bytes: int = 4 << 20,
        receipt_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        spool_retry_s: float = 2.0,
    ) -> None:
        self._bus = bus
        self._max = max_entries
        self._max_bytes = max_bytes
        self.receipt_timeout_s = receipt_timeout_s
        self.spool_retry_s = spool_retry_s
        self._clock = clock
        self._queue: deque[Entry] = deque()
        self._awaiting: dict[str, Entry] = {}  # receipt id -> entry published, not yet receipted
        self._queued_ids: dict[str, Entry] = {}  # receipt id -> entry still in the queue
        self._bytes = 0
        self._ready = asyncio.Event()
        self._seq = 1
        self.sent = 0
        self.dropped = 0
        self.replayed = 0
        self.receipted_count = 0
        self.rejected_count = 0
        self.resent = 0
        self.spool_error: str | None = None  # set while the spool is unavailable (memory-only)
        self.last_spool_error = ""  # the error that started the latest outage
        self.spool_outages = 0
        self.spool_recoveries = 0
        self._outage_started = 0.0
        self._retry_at = 0.0
        self._spool: SpoolFile | None = None
        if path is not None:
            self._spool = SpoolFile(Path(path), fsync=fsync, compact_bytes=compact_bytes)
            entries, self._seq, rewrite = self._spool.load()
            for entry in entries:
                self._enqueue(entry)
            self.replayed = len(entries)
            try:
                self._spool.restore(entries, rewrite=rewrite)
            except OSError as exc:
                self._spool_down(exc)
            if entries:
                log.info("spool_replayed", entries=len(entries))
                self._ready.set()

    @property
    def damage(self) -> list[SpoolDamage]:
        """Spool files found damaged at start (renamed aside), with what was salvaged from each."""
        return list(self._spool.damage) if self._spool else []

    @property
    def quarantined(self) -> list[str]:
        """Spool files found damaged and renamed aside at start."""
        return [d.quarantined for d in self.damage]

    @property
    def problems(self) -> list[str]:
        return [d.problem for d in self.damage]

    @property
    def durable(self) -> bool:
        """Whether durable entries reach the disk now (a spool, and not in an outage)."""
        return self._spool is not None and self.spool_error is None

    def _spool_down(self, exc: OSError) -> None:
        """A spool write failed (the file is as before it): hold everything in memory from now on."""
        now = self._clock()
        self._retry_at = now + self.spool_retry_s
        if self.spool_error is None:
            self.spool_outages += 1
            self.last_spool_error = str(exc)
            self._outage_started = now
            log.error(
                "spool_unavailable_memory_only",
                path=str(self._spool.path) if self._spool else None,
                error=str(exc),
                held=len(self),
            )
        self.spool_error = str(exc)
        if self._spool is not None:
            self._spool.close()

    def check_spool(self) -> bool:
        """In an outage, try (at most every ``spool_retry_s``) to go back to durable spooling by
        rewriting every entry held to a fresh file. Returns whether the spool is durable now."""
        spool = self._spool
        if spool is None:
            return False
        if self.spool_error is None:
            return True
        now = self._clock()
        if now < self._retry_at:
            return False
        self._retry_at = now + self.spool_retry_s
        held = [e for e in (*self._awaiting.values(), *self._queue) if e.seq]
        try:
            spool.restore(held)
        except OSError as exc:
            self.spool_error = str(exc)
            spool.close()
            return False
        self.spool_error = None
        self.spool_recoveries += 1
        log.warning(
            "spool_recovered",
            path=str(spool.path),
            rewritten=len(held),
            outage_s=round(now - self._outage_started, 1),
        )
        return True

    def _spool_write(self, record: bytes) -> None:
        """Append ``record`` unless in an outage; a failure starts one."""
        if self._spool is None or self.spool_error is not None:
            return
        try:
            self._spool.append(record)
        except OSError as exc:
            self._spool_down(exc)

    def __len__(self) -> int:
        """Entries not done yet: queued, or published and waiting for their receipt."""
        return len(self._queue) + len(self._awaiting)

    def oldest_age(self, now: float) -> float:
        """Seconds the oldest entry not done yet has been held (monotonic ``now``); 0 when empty."""
        held = [e.held_since for e in (*self._queue, *self._awaiting.values())]
        return max(0.0, now - min(held)) if held else 0.0

    @property
    def awaiting_receipt(self) -> int:
        return len(self._awaiting)

    def _enqueue(self, entry: Entry) -> None:
        self._queue.append(entry)
        self._bytes += entry.size
        if entry.receipt_id is not None:
            self._queued_ids[entry.receipt_id] = entry

    def _oldest_lowest(self) -> Entry:
        """The drop victim: lowest priority first, then the oldest (awaiting ones were sent first)."""
        candidates = [*self._awaiting.values(), *self._queue]
        return min(enumerate(candidates), key=lambda pair: (pair[1].priority, pair[0]))[1]

    def _remove(self, entry: Entry) -> None:
        """Take ``entry`` out of wherever it waits (queue or receipt wait)."""
        if entry.receipt_id is not None and self._awaiting.get(entry.receipt_id) is entry:
            del self._awaiting[entry.receipt_id]
            return
        if entry.receipt_id is not None and self._queued_ids.get(entry.receipt_id) is entry:
            del self._queued_ids[entry.receipt_id]
        self._queue.remove(entry)

    def put(self, item: Outgoing) -> None:
        rid = item.receipt_id
        if rid is not None and (rid in self._queued_ids or rid in self._awaiting):
            return  # already held (an event re-published after a restart): one copy, one receipt
        entry = Entry(item.topic, item.payload, item.retain, item.priority, 0, item.receipt_id)
        while len(self) and (len(self) >= self._max or self._bytes + entry.size > self._max_bytes):
            victim = self._oldest_lowest()
            self.dropped += 1
            if victim.priority > item.priority:  # everything waiting matters more
                log.warning("outbox_full_dropping_new", topic=item.topic, dropped=self.dropped)
                return
            log.warning("outbox_full_dropping_oldest", topic=victim.topic, dropped=self.dropped)
            self._remove(victim)
            self._forget(victim)
        if self._spool is not None and item.durable:
            entry.seq = self._seq  # durable: written now, or by check_spool() after an outage
            self._seq += 1
            self.check_spool()  # in an outage, try to end it first (at most every spool_retry_s)
            self._spool_write(put_record(entry))
        self._enqueue(entry)
        self._ready.set()

    def receipted(self, ids: Iterable[str]) -> int:
        """The coordinator committed these events: they are done. Returns how many were ours."""
        done = 0
        for rid in ids:
            entry = self._awaiting.get(rid) or self._queued_ids.get(rid)
            if entry is None:
                continue  # a receipt repeated, or for an entry dropped for space
            self._remove(entry)
            self._forget(entry)
            done += 1
        self.receipted_count += done
        return done

    def rejected(self, reasons: Mapping[str, str]) -> int:
        """The coordinator will never take these: stop resending them, and say why in the log."""
        done = 0
        for rid, why in reasons.items():
            entry = self._awaiting.get(rid) or self._queued_ids.get(rid)
            if entry is None:
                continue
            log.error("event_rejected_by_coordinator", event_id=rid, topic=entry.topic, reason=why)
            self._remove(entry)
            self._forget(entry)
            done += 1
        self.rejected_count += done
        return done

    def resend_unreceipted(self, older_than_s: float = 0.0) -> int:
        """Queue again (in their original order, ahead of newer entries) the published entries whose
        receipt has not come for ``older_than_s`` seconds; 0 = all of them (the coordinator came up)."""
        cutoff = self._clock() - older_than_s
        again = [e for e in self._awaiting.values() if e.sent_at <= cutoff]
        if not again:
            return 0
        for entry in again:
            del self._awaiting[entry.receipt_id or ""]
            entry.sent_at = 0.0
        for entry in reversed(again):
            self._queue.appendleft(entry)
            if entry.receipt_id is not None:
                self._queued_ids[entry.receipt_id] = entry
        self.resent += len(again)
        self._ready.set()
        return len(again)

    def _forget(self, entry: Entry) -> None:
        """``entry`` is done (acknowledged, receipted or dropped): tombstone it on disk."""
        self._bytes -= entry.size
        spool = self._spool
        if spool is None or self.spool_error is not None:
            return  # in an outage: the rewrite that ends it leaves this entry out
        try:
            if not self._queue and not self._awaiting and spool.size > TRUNCATE_AT:
                spool.truncate()
            elif entry.seq:
                spool.append(del_record(entry.seq))
                if spool.size > spool.compact_bytes and self._bytes * 4 < spool.size:
                    spool.compact([e for e in (*self._awaiting.values(), *self._queue) if e.seq])
        except OSError as exc:
            self._spool_down(exc)

    async def run(self) -> None:
        """Publish queued messages in order, forever."""
        while True:
            if not self._queue:
                self._ready.clear()
                await self._ready.wait()
                continue
            item = self._queue[0]
            try:
                await self._bus.publish(item.topic, item.payload, retain=item.retain)
            except BusUnavailable:
                # Never retry without yielding: a bus that failed a publish while it still said
                # "connected" made this loop spin and stop the whole agent (issue #31).
                if self._bus.connected:
                    await asyncio.sleep(RETRY_PAUSE_S)
                else:
                    await self._bus.wait_connected(timeout=1.0)
                continue
            self.sent += 1
            # The head may have been dropped or receipted while we awaited; move only what we sent.
            if not self._queue or self._queue[0] is not item:
                continue
            self._queue.popleft()
            if item.receipt_id is None:
                self._forget(item)
                continue
            del self._queued_ids[item.receipt_id]
            item.sent_at = self._clock()
            self._awaiting[item.receipt_id] = item

    async def flush(self, timeout: float) -> bool:
        """Wait until everything queued so far has been published; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._queue:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    def close(self) -> None:
        """Close the spool file (unacknowledged entries stay in it for the next start)."""
        if self._spool is not None:
            self._spool.close()
