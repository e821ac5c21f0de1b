"""Storm control: identical events inside a window collapse into one, with an exact count.

A sick GPU can print hundreds of thousands of identical Xid 45/95 lines; publishing each would flood
the bus and the coordinator. Sitting between the watchers and the outbox, :class:`StormControl`

* publishes the **first** occurrence of an event at once (it is the one the e2e latency is measured
  on, so the fast path is one dict lookup);
* **counts** the repeats of the same *identity* (see :func:`identity`) that arrive within
  ``window_s`` of that first one, and publishes them as **one summary event** when the window ends
  (or on :meth:`close`), with ``count`` = the exact number of repeats folded into it and
  ``data["repeat_of"]`` = the id of the first event. The sum of ``count`` over everything published
  therefore equals the number of events the watchers emitted;
* while a storm goes on, the identity stays "hot": every window yields one summary, never a new
  "first". A window that ends without repeats retires the identity, so the next occurrence is again
  published immediately;
* **links follow-on Xids to their cause**: an Xid whose catalog entry ``follows`` a code seen on the
  same GPU (PCI address, or UUID when the line had none) within ``follow_window_s`` gets
  ``data["caused_by"]`` = the id of that earlier event (and ``caused_by_code``). The coordinator's Xid
  rule records such events without acting on them. Events with no GPU address are never linked.

Identity keys (node is implicit: one agent, one node):

* ``xid`` / ``sxid``: code + PCI (the message differs line to line: pid, channel, register dumps);
* ``gpu_fallen_off_bus``, ``pcie_aer``: PCI + message;
* ``oom_kill``, ``hung_task``: pid + process (two different victims are two events);
* ``rank_heartbeat_lost`` / ``rank_straggler``: job + rank + pid;
* everything else: kind + every data field except the volatile ones (line number, sequence number,
  timestamps), i.e. only truly identical events collapse.

Limits: repeats are held in memory until their window ends, so a ``kill -9`` of the agent loses the
count of the repeats of the current window (never a first occurrence: those are in the durable spool
before :meth:`process` returns). The number of tracked identities is bounded (``max_keys``); past it
the oldest window is flushed early.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ftd.agent.watchers.base import Emit
from ftd.catalog import load_xid_catalog
from ftd.events import Event, Kind, Severity
from ftd.logs import get_logger

__all__ = ["StormControl", "identity"]

log = get_logger(__name__)

_VOLATILE = frozenset({"line", "seq", "kernel_ts", "ts", "silent_s", "catalog_version"})


def _freeze(value: Any) -> Hashable:
    if isinstance(value, dict):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, Hashable):
        return value
    return repr(value)


def identity(event: Event) -> Hashable:
    """The storm-control key of ``event``: events with equal keys are "the same event" repeated."""
    data = event.data
    kind = event.kind
    if kind in (Kind.XID, Kind.SXID):
        return (kind, data.get("code"), data.get("pci") or data.get("uuid"))
    if kind in (Kind.GPU_FALLEN_OFF_BUS, Kind.PCIE_AER):
        return (kind, data.get("pci"), data.get("message"))
    if kind in (Kind.OOM_KILL, Kind.HUNG_TASK):
        return (kind, data.get("pid"), data.get("process"))
    if kind in (Kind.RANK_HEARTBEAT_LOST, Kind.RANK_STRAGGLER):
        return (kind, data.get("job"), data.get("rank"), data.get("pid"))
    return (kind, event.source, _freeze({k: v for k, v in data.items() if k not in _VOLATILE}))


@dataclass(slots=True)
class _Window:
    first_id: str
    started: float  # monotonic
    windows: int = 0  # summaries published for this identity so far
    pending: int = 0  # repeats not yet published
    last: Event | None = None  # the latest repeat (its data goes into the summary)
    severity: Severity = Severity.INFO
    first_ts: float = 0.0


@dataclass(slots=True)
class _Cause:
    code: int
    id: str
    at: float  # monotonic


@dataclass(slots=True)
class StormStats:
    seen: int = 0
    published: int = 0
    summaries: int = 0
    folded: int = 0  # repeats folded into summaries (published or pending)
    linked: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class StormControl:
    """Sits in front of ``downstream`` (normally the agent's outbox); see the module docstring."""

    def __init__(
        self,
        downstream: Emit,
        *,
        window_s: float = 10.0,
        follow_window_s: float = 30.0,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._downstream = downstream
        self.window_s = window_s
        self.follow_window_s = follow_window_s
        self.max_keys = max_keys
        self._clock = clock
        self._windows: dict[Hashable, _Window] = {}
        self._causes: dict[str, list[_Cause]] = {}  # GPU address -> recent Xids, oldest first
        self.stats = StormStats()
        self.enabled = window_s > 0

    # --- the event path ---------------------------------------------------------------------------

    async def process(self, event: Event) -> None:
        """Publish ``event`` now (a first occurrence) or fold it into its identity's window."""
        self.stats.seen += 1
        now = self._clock()
        if event.kind is Kind.XID:
            event = self._link(event, now)
        if not self.enabled:
            await self._publish(event)
            return
        key = identity(event)
        window = self._windows.get(key)
        if window is not None and now - window.started >= self.window_s:
            await self._close_window(key, window, now)
            window = self._windows.get(key)
        if window is None:
            if len(self._windows) >= self.max_keys:
                oldest = next(iter(self._windows))
                await self._flush_key(oldest, retire=True)
            self._windows[key] = _Window(first_id=event.id, started=now, first_ts=event.ts)
            await self._publish(event)
            return
        window.pending += event.count
        window.last = event
        if event.severity.rank > window.severity.rank:
            window.severity = event.severity
        self.stats.folded += event.count

    __call__ = process

    async def tick(self) -> None:
        """Close every window that has ended (publishing its summary). Called periodically."""
        now = self._clock()
        for key, window in list(self._windows.items()):
            if now - window.started >= self.window_s:
                await self._close_window(key, window, now)
        self._expire_causes(now)

    async def run(self, interval: float | None = None) -> None:
        """Call :meth:`tick` forever (every quarter window, at most every second)."""
        period = interval or max(0.05, min(1.0, self.window_s / 4 if self.window_s > 0 else 1.0))
        while True:
            await asyncio.sleep(period)
            await self.tick()

    async def close(self) -> None:
        """Publish every pending summary now (shutdown)."""
        for key in list(self._windows):
            await self._flush_key(key, retire=True)

    @property
    def pending(self) -> int:
        return sum(w.pending for w in self._windows.values())

    # --- internals --------------------------------------------------------------------------------

    async def _publish(self, event: Event) -> None:
        self.stats.published += 1
        await self._downstream(event)

    async def _close_window(self, key: Hashable, window: _Window, now: float) -> None:
        if window.pending:
            await self._flush_key(key, retire=False)
            window.started = now  # still storming: stay hot, one summary per window
        else:
            del self._windows[key]

    async def _flush_key(self, key: Hashable, *, retire: bool) -> None:
        window = self._windows.get(key)
        if window is None:
            return
        if retire:
            del self._windows[key]
        if not window.pending or window.last is None:
            return
        window.windows += 1
        last = window.last
        data = dict(last.data)
        data["repeat_of"] = window.first_id
        data["first_ts"] = window.first_ts
        data["window_s"] = self.window_s
        summary = msgspec.structs.replace(
            last,
            id=f"{window.first_id}-r{window.windows}",
            severity=window.severity if window.severity.rank > last.severity.rank else last.severity,
            data=data,
            count=window.pending,
        )
        window.pending, window.last, window.severity = 0, None, Severity.INFO
        self.stats.summaries += 1
        await self._publish(summary)

    def _link(self, event: Event, now: float) -> Event:
        """Set ``caused_by`` on a follow-on Xid; remember this Xid as a possible cause."""
        data = event.data
        gpu = data.get("pci") or data.get("uuid")
        code = data.get("code")
        if not isinstance(gpu, str) or not isinstance(code, int):
            return event
        recent = self._causes.setdefault(gpu, [])
        cutoff = now - self.follow_window_s
        while recent and recent[0].at < cutoff:
            recent.pop(0)
        if "caused_by" not in data:
            follows = load_xid_catalog().get(code).follows
            if follows:
                for cause in reversed(recent):
                    if cause.code in follows and cause.id != event.id:
                        event = msgspec.structs.replace(
                            event, data={**data, "caused_by": cause.id, "caused_by_code": cause.code}
                        )
                        self.stats.linked += 1
                        break
        if not recent or recent[-1].code != code:
            recent.append(_Cause(code=code, id=event.id, at=now))
        else:
            recent[-1].at = now  # a repeat: keep the first id, refresh its time
        if len(recent) > 64:
            del recent[:-64]
        return event

    def _expire_causes(self, now: float) -> None:
        cutoff = now - self.follow_window_s
        for gpu in [g for g, recent in self._causes.items() if not recent or recent[-1].at < cutoff]:
            del self._causes[gpu]
