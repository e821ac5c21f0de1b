"""Per-node fairness at the coordinator's door: a token bucket per node, and the book of what each
node sent that the coordinator did not store as sent, committed as one ``bad_input`` event per node
and window.

Why admission at the door and not per-node queues: the broker hands the coordinator one FIFO stream
and lets only ``max_inflight_messages`` (20 in Mosquitto's default and in ``deploy/mosquitto``)
unacknowledged messages out at a time, and the coordinator acknowledges a message only after
committing it. A message parked in a per-node queue holds one of those slots, so a flooding node
would fill them all and stall every node behind it in the broker. What keeps another node's events
moving is draining the stream faster than the flood fills it: a node within its rate is handled in
full, as before; the excess costs only a decode and a count.

* :class:`TokenBucket` (one per node, :class:`RateLimiter`): ``rate`` events/s, bursts of ``burst``;
  on top, ``reserve`` tokens only events of severity error and above may take, so a node's
  low-severity chatter cannot crowd out its own Xid 79. Past the reserve too, a critical event and
  the first of each signature in the window are still decided: novelty is never folded
  (:mod:`ftd.coordinator.intake.novelty`).
* :class:`InputBook`: what a node's events over its rate (*folded*: counted by kind and severity,
  receipted as committed, never evaluated one by one) and its refused messages (*rejected*: counted
  by reason -- ``oversized``, ``invalid``, ``foreign_node``, ``error`` -- never stored) add up to in
  the current window. The coordinator commits each node's open summary (:meth:`InputBook.pending`,
  an Event whose ``count`` is the total) with :meth:`~ftd.coordinator.ledger.sqlite.Ledger.record_summary`,
  then receipts the events in it and acknowledges their messages (:meth:`InputBook.committed`). A
  window closes ``window_s`` after it opened; the next fold or refusal opens a new one.

The limits are per node: many nodes flooding at once can still outrun the coordinator (a global
budget would be the next step); a node can only speak for itself (the broker's ACL), so the buckets
and the book hold at most one entry per node that sent something lately.

Counts are at least once: an event folded, committed and then delivered again (the coordinator died
before acknowledging it, or the node resent it because the receipt was lost) is counted again.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

import msgspec

from ftd.events import Event, Kind, Severity

#: Default per-node limits (constructor arguments of the Coordinator; no config key yet). The burst
#: lets an agent resend what it spooled through a coordinator or broker outage without folding (its
#: storm control keeps that to hundreds); each event within it costs the full handling (~0.1 ms), so
#: a flood's first burst delays other nodes by about that much once. An agent's steady state is a
#: few events a minute: the rate only has to be far above that and far below the coordinator's.
NODE_RATE = 100.0  # events/s a node may sustain
NODE_BURST = 1000.0  # events a node may send at once
URGENT_RESERVE = 1000.0  # further tokens only events of severity >= error may take
WINDOW_S = 60.0  # one bad_input summary per node per this many seconds

_ERROR_RANK = Severity.ERROR.rank

#: A refused payload up to this size is read once more for the ids of the events in it, so they can be
#: receipted as rejected (an agent would otherwise resend them forever); a larger one is only counted.
MAX_ID_SCAN_BYTES = 16 << 20
MAX_REJECTED_IDS = 50_000  # more ids than this in one refused message: none is receipted
_MAX_ID_CHARS = 256


class _IdOnly(msgspec.Struct):
    id: Annotated[str, msgspec.Meta(max_length=_MAX_ID_CHARS)]


_id_decoder = msgspec.json.Decoder(_IdOnly)
_ids_decoder = msgspec.json.Decoder(list[_IdOnly])


def readable_ids(payload: bytes, *, batch: bool) -> list[str]:
    """The ``id`` of each event in a refused payload (a JSON list of them if ``batch``), read without
    the rest of its fields; [] when the payload is too big or the ids cannot be read."""
    if len(payload) > MAX_ID_SCAN_BYTES:
        return []
    try:
        if batch:
            ids = [item.id for item in _ids_decoder.decode(payload)]
            return ids if len(ids) <= MAX_REJECTED_IDS else []
        return [_id_decoder.decode(payload).id]
    except Exception:  # whatever the payload is (too deep, not JSON, no ids): nothing to receipt
        return []


class TokenBucket:
    """``rate`` tokens/s up to ``burst + reserve``; an ordinary take leaves ``reserve`` for urgent ones."""

    __slots__ = ("burst", "rate", "reserve", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, reserve: float, now: float) -> None:
        self.rate, self.burst, self.reserve = rate, burst, reserve
        self.tokens = burst + reserve
        self.stamp = now

    def take(self, now: float, *, urgent: bool = False) -> bool:
        """Spend one token if the bucket allows this event; False when it is over the rate."""
        self.tokens = min(self.burst + self.reserve, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= (1.0 if urgent else 1.0 + self.reserve):
            self.tokens -= 1.0
            return True
        return False

    def full(self, now: float) -> bool:
        return self.tokens + (now - self.stamp) * self.rate >= self.burst + self.reserve


class RateLimiter:
    """One :class:`TokenBucket` per node. Full buckets are forgotten now and then (a new bucket is
    full too), so the map stays as small as the set of nodes that sent something lately."""

    def __init__(
        self,
        rate: float = NODE_RATE,
        burst: float = NODE_BURST,
        reserve: float = URGENT_RESERVE,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate <= 0 or burst < 1 or reserve < 0:
            raise ValueError("rate must be > 0, burst >= 1, reserve >= 0")
        self.rate, self.burst, self.reserve = rate, burst, reserve
        self.clock = clock
        self._buckets: dict[str, TokenBucket] = {}
        self._next_prune = clock() + self.PRUNE_S

    PRUNE_S = 60.0

    def admit(self, node: str, severity: Severity) -> bool:
        """Whether ``node`` may have one more event of ``severity`` handled in full now."""
        now = self.clock()
        if now >= self._next_prune:
            self._prune(now)
        bucket = self._buckets.get(node)
        if bucket is None:
            bucket = self._buckets[node] = TokenBucket(self.rate, self.burst, self.reserve, now)
        return bucket.take(now, urgent=severity.rank >= _ERROR_RANK)

    def _prune(self, now: float) -> None:
        self._next_prune = now + self.PRUNE_S
        for node in [n for n, b in self._buckets.items() if b.full(now)]:
            del self._buckets[node]

    def __len__(self) -> int:
        return len(self._buckets)


@dataclass
class _Window:
    """One node's open summary: what it sent and was folded or refused since ``start``."""

    id: str
    start: float
    updated: float = 0.0
    folded: int = 0
    folded_kinds: Counter[str] = field(default_factory=Counter)
    folded_severities: Counter[str] = field(default_factory=Counter)
    rejected: int = 0
    rejected_reasons: Counter[str] = field(default_factory=Counter)
    largest_bytes: int = 0
    last_error: str = ""
    # Since the last commit: ids to receipt once the summary holding them is committed.
    folded_ids: list[str] = field(default_factory=list)
    rejected_ids: dict[str, str] = field(default_factory=dict)
    dirty: bool = False


@dataclass(frozen=True)
class Committed:
    """What became durable with a commit of the pending summaries, per node: the ids of folded
    events (receipt them as committed) and of refused ones (receipt them as rejected, with why)."""

    folded: dict[str, list[str]]
    rejected: dict[str, dict[str, str]]


class InputBook:
    """Per-node summaries of folded and refused input (see the module docstring)."""

    def __init__(
        self,
        *,
        window_s: float = WINDOW_S,
        limits: dict[str, float] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.window_s = window_s
        self.limits = dict(limits or {})  # recorded in each summary, so a reader knows the rate applied
        self.clock = clock
        self._open: dict[str, _Window] = {}
        self.folded_total = 0
        self.rejected_total = 0
        self.windows_opened = 0

    def _window(self, node: str) -> tuple[_Window, bool]:
        now = self.clock()
        window = self._open.get(node)
        opened = window is None or (not window.dirty and now - window.start >= self.window_s)
        if window is None or opened:
            window = self._open[node] = _Window(id=f"{node}-bad-input-{int(now * 1000):x}", start=now)
            self.windows_opened += 1
        window.updated = now
        window.dirty = True
        return window, opened

    def fold(self, event: Event) -> bool:
        """Count ``event`` (over its node's rate) into its node's summary, to be receipted after the
        commit; True when this opened the node's window (worth one log line)."""
        window, opened = self._window(event.node)
        window.folded += 1
        window.folded_kinds[str(event.kind)] += 1
        window.folded_severities[str(event.severity)] += 1
        window.folded_ids.append(event.id)
        self.folded_total += 1
        return opened

    def reject(self, node: str, reason: str, error: str, size: int, ids: list[str] | None = None) -> bool:
        """Count one refused message of ``node``; ``ids`` (events it carried, when they could be read)
        are receipted as rejected, with ``error``, after the commit. True when this opened the window."""
        window, opened = self._window(node)
        window.rejected += 1
        window.rejected_reasons[reason] += 1
        window.largest_bytes = max(window.largest_bytes, size)
        window.last_error = error[:300]
        for event_id in ids or ():
            window.rejected_ids[event_id] = error[:300]
        self.rejected_total += 1
        return opened

    @property
    def dirty(self) -> bool:
        return any(w.dirty for w in self._open.values())

    def pending(self) -> list[Event]:
        """The summaries changed since the last commit, as the events to store (same id each time)."""
        return [self._summary(node, w) for node, w in self._open.items() if w.dirty]

    def committed(self) -> Committed:
        """The summaries from :meth:`pending` are in the ledger: hand over their ids, close old windows."""
        now = self.clock()
        folded: dict[str, list[str]] = {}
        rejected: dict[str, dict[str, str]] = {}
        for node, window in list(self._open.items()):
            if window.folded_ids:
                folded[node], window.folded_ids = window.folded_ids, []
            if window.rejected_ids:
                rejected[node], window.rejected_ids = window.rejected_ids, {}
            window.dirty = False
            if now - window.start >= self.window_s:
                del self._open[node]
        return Committed(folded=folded, rejected=rejected)

    def _summary(self, node: str, window: _Window) -> Event:
        return Event(
            id=window.id,
            ts=window.start,
            node=node,
            kind=Kind.BAD_INPUT,
            severity=Severity.WARNING,
            source="coordinator",
            count=max(1, window.folded + window.rejected),
            data={
                "window_start": window.start,
                "updated": window.updated,
                "window_s": self.window_s,
                "folded": window.folded,
                "folded_kinds": dict(window.folded_kinds),
                "folded_severities": dict(window.folded_severities),
                "rejected": window.rejected,
                "rejected_reasons": dict(window.rejected_reasons),
                "largest_bytes": window.largest_bytes,
                "last_error": window.last_error,
                "limits": self.limits,
            },
        )
