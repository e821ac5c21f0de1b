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
  rule records such events without acting on them. Events with no GPU address are never linked. A
  repeat folded into a window stands for its window's first event: a later follow-on names that
  (published) id, never the id of a repeat that was only counted.

Identity keys (node is implicit: one agent, one node):

* ``xid`` / ``sxid``: code + PCI (the message differs line to line: pid, channel, register dumps);
* ``gpu_fallen_off_bus``, ``pcie_aer``: PCI + message;
* ``oom_kill``, ``hung_task``: pid + process (two different victims are two events);
* ``rank_heartbeat_lost`` / ``rank_straggler``: job + rank + pid;
* everything else: kind + every data field except the volatile ones (line number, sequence number,
  timestamps), i.e. only truly identical events collapse.

**One way in, one way out.** Everything enters through :meth:`offer`, which never awaits and never
publishes: it counts the item into its identity's window (:attr:`Verdict.FOLDED`) or stages it to be
sent (:attr:`Verdict.STAGED`: a first occurrence, or any event while storm control is off).
:meth:`commit` sends what is staged: the checkpoint first, then the events downstream. The agent's
watchers go through :meth:`process` (``offer``, then ``commit`` when something was staged); the
kmsg watcher calls the two itself, so that its noise lines and repeats are handled without an
``await``. Windows that end are staged by :meth:`tick` (the agent's periodic task, :meth:`run`).

**Repeats without a full event** (:class:`Repeat`): a watcher that recognises a repeat cheaply (the
kmsg watcher: the same message text as an Xid line parsed before) offers the identity key and a
recipe for the full event instead of the event. It is counted exactly like the event would be; the
recipe is run only for the one repeat a summary (or a checkpoint) needs: the last. While its
identity has no open window the verdict is :attr:`Verdict.UNSEEN` and the watcher offers the full
event. This is what lets a 500,000-line storm be read at several hundred thousand lines a second.

**Durability: a checkpoint written ahead of every publish.** Pending counts live in memory until
their window ends; a ``kill -9`` must neither lose them nor count them twice. The source that can be
read again (the kernel log) keeps its read position in a :class:`Checkpoint` that it shares with
storm control (the agent hands the same one to both); the checkpoint stores, atomically, that
position *and* :meth:`snapshot` (every window with pending repeats, its last repeat, and the events
about to be published). Storm control saves it before it hands anything downstream
(:meth:`commit`): so whatever reached the spool is covered by a checkpoint whose position is past
the lines it came from, and every line past the checkpoint's position has left nothing but
in-memory counts, which a restarted agent rebuilds by reading those lines again. The reader moves
the position; it is never called back. At construction storm control :meth:`restore` s the windows
the checkpoint holds, and :meth:`run` re-publishes its "about to be published" events: if the kill
came after they reached the spool, they go out twice with the same ids, and the coordinator drops
the duplicates (the outbox must take an id it already holds). Counts stay exact after any kill.

Why this and not "never save the read position past a line whose count is only in memory, re-read
from there": with two storms interleaved, a summary of one identity that was published after the
oldest pending line of another would be counted again when those lines are re-read, and whether a
re-read line is a "first occurrence" depends on window timing that a restarted agent cannot replay;
ids derived from the line do not help a summary, which covers many lines. Why not an append-only log
per repeat: one ``write`` per repeat costs more than the rest of a repeat's handling. The checkpoint
is written twice per published batch (a first occurrence, summaries: once listing them, once more
when they are out, so a restart does not publish them again) and once per batch of lines read; it
lists only windows with pending repeats (a few hundred bytes in a storm) and the kmsg checkpoint
overwrites its file in place (about a microsecond).

Limits: repeats from a source that cannot be read again (NVML, logs, heartbeats) that were counted
after the last checkpoint are lost to a ``kill -9`` (checkpoints follow every batch of kernel-log
lines and every tick with something pending, so that is at most about a second's worth); without
a checkpoint (tests) nothing is persisted. Follow-on links are not
checkpointed: a follow-on that arrives after a restart is not linked to a cause seen before it. The
number of tracked identities is bounded (``max_keys``); past it the oldest window is flushed early.
With ``window_s = 0`` storm control is off: every event goes out as it comes, without a checkpoint
(a line read again after a kill yields the same event id, which the coordinator drops).
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from ftd.catalog import load_xid_catalog
from ftd.events import Event, Kind, Severity
from ftd.logs import get_logger

__all__ = ["Checkpoint", "Repeat", "SavedWindow", "StormControl", "StormState", "Verdict", "identity"]

log = get_logger(__name__)

#: Where storm control hands what it lets through (the agent's one door, :mod:`ftd.agent.door`).
Publish = Callable[[Event], Awaitable[None]]

_VOLATILE = frozenset({"line", "seq", "kernel_ts", "ts", "silent_s", "catalog_version"})
_MAX_CAUSES = 64  # per GPU


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


class Verdict(enum.Enum):
    """What :meth:`StormControl.offer` did with an item."""

    FOLDED = "folded"  # counted into its identity's open window: nothing to send now
    STAGED = "staged"  # to be sent: the next commit() sends it (after the checkpoint that lists it)
    UNSEEN = "unseen"  # a Repeat whose identity has no open window: offer the full event instead


_FOLDED, _STAGED, _UNSEEN = Verdict.FOLDED, Verdict.STAGED, Verdict.UNSEEN


@dataclass(frozen=True, slots=True)
class Repeat:
    """A repeat offered without its event: its :func:`identity` key, its severity, and ``build``,
    which makes the event from the ``arg`` given to :meth:`StormControl.offer` with it (the event the
    full path would have offered). A watcher keeps one per message it has parsed before."""

    key: Hashable
    severity: Severity
    build: Callable[[Any], Event]


# A repeat counted without its event: how to build it, and the cause it was linked to.
_Recipe = tuple[Callable[[Any], Event], Any, tuple[str, int] | None]


@dataclass(slots=True)
class _Window:
    first_id: str
    started: float  # monotonic
    windows: int = 0  # summaries published for this identity so far
    pending: int = 0  # repeats not yet published
    last: Event | None = None  # the latest repeat (its data goes into the summary) ...
    recipe: _Recipe | None = None  # ... or how to build it, when it was folded without an event
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
    restored: int = 0  # pending repeats taken over from a checkpoint
    extra: dict[str, int] = field(default_factory=dict)


class SavedWindow(msgspec.Struct, frozen=True, kw_only=True):
    """A window with pending repeats, as a checkpoint keeps it (its key is ``identity(last)``)."""

    first_id: str
    age_s: float  # how long the window had been open
    windows: int
    pending: int
    severity: Severity
    first_ts: float
    last: Event


class StormState(msgspec.Struct, frozen=True, kw_only=True):
    """Storm control's part of a checkpoint: pending counts, and events about to be published."""

    windows: list[SavedWindow] = msgspec.field(default_factory=list)
    unsent: list[Event] = msgspec.field(default_factory=list)


class Checkpoint(Protocol):
    """Where storm control's state is kept with its source's read position (module docstring); the
    kmsg watcher's :class:`~ftd.agent.watchers.kmsg_checkpoint.KmsgCheckpoint`."""

    def saved(self) -> StormState | None:
        """Storm control's state as the last life left it (None: nothing, or unreadable)."""

    def save(self, storm: StormState) -> None:
        """Store ``storm`` together with the source's current position, atomically."""


class StormControl:
    """Sits in front of ``downstream`` (the agent's one door, then its outbox); see the module docstring.

    With a ``checkpoint``, the state it holds is restored here, and it is saved ahead of every
    publish."""

    def __init__(
        self,
        downstream: Publish,
        *,
        window_s: float = 10.0,
        follow_window_s: float = 30.0,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        checkpoint: Checkpoint | None = None,
    ) -> None:
        self._downstream = downstream
        self.window_s = window_s
        self.follow_window_s = follow_window_s
        self.max_keys = max_keys
        self._clock = clock
        self._windows: dict[Hashable, _Window] = {}
        self._pending: dict[Hashable, _Window] = {}  # the windows with pending > 0
        self._unsent: dict[str, Event] = {}  # to publish, once a checkpoint lists them
        self._direct: deque[Event] = deque()  # to publish without a checkpoint (storm control off)
        self._causes: dict[str, list[_Cause]] = {}  # GPU address -> recent Xids, oldest first
        self._follows: dict[int, tuple[int, ...]] = {}  # Xid code -> the codes it follows (catalog)
        self.checkpoint = checkpoint
        self._dirty = False  # state changed since the last checkpoint
        self.stats = StormStats()
        self.enabled = window_s > 0
        saved = checkpoint.saved() if checkpoint is not None else None
        if saved is not None:
            self.restore(saved)

    # --- durability -------------------------------------------------------------------------------

    def snapshot(self) -> StormState:
        """What a checkpoint must hold: windows with pending repeats, and events not yet published."""
        now = self._clock()
        windows = [
            SavedWindow(
                first_id=window.first_id,
                age_s=max(0.0, now - window.started),
                windows=window.windows,
                pending=window.pending,
                severity=window.severity,
                first_ts=window.first_ts,
                last=self._last(window),
            )
            for window in self._pending.values()
        ]
        return StormState(windows=windows, unsent=list(self._unsent.values()))

    def restore(self, state: StormState) -> None:
        """Take over a checkpoint's pending counts and unpublished events (before the first event)."""
        if self._windows or self._unsent:
            raise RuntimeError("restore() must come before the first event")
        now = self._clock()
        for saved in state.windows:
            window = _Window(
                first_id=saved.first_id,
                started=now - saved.age_s,
                windows=saved.windows,
                pending=saved.pending,
                last=saved.last,
                severity=saved.severity,
                first_ts=saved.first_ts,
            )
            key = identity(saved.last)
            self._windows[key] = self._pending[key] = window
            self.stats.restored += saved.pending
        for event in state.unsent:
            self._unsent[event.id] = event
        if state.windows or state.unsent:
            log.info("storm_state_restored", pending=self.stats.restored, unsent=len(state.unsent))

    async def commit(self, *, force: bool = False) -> None:
        """Send what is staged: write the checkpoint (if anything changed, or ``force``), then publish
        what it lists, then write it again. Events staged while storm control is off go out first,
        without a checkpoint."""
        direct = self._direct
        while direct:
            await self._publish(direct.popleft())
        checkpoint = self.checkpoint
        if checkpoint is not None and (force or self._dirty or self._unsent):
            checkpoint.save(self.snapshot())
            self._dirty = False
        if self._unsent:
            for event_id, event in list(self._unsent.items()):
                await self._publish(event)
                self._unsent.pop(event_id, None)
            if checkpoint is not None:
                checkpoint.save(self.snapshot())  # a restart need not publish them again

    # --- the event path ---------------------------------------------------------------------------

    def offer(self, item: Event | Repeat, arg: Any = None) -> Verdict:
        """Take one event, or one :class:`Repeat` (built, if ever, from ``arg``); never awaits.

        An event is staged (a first occurrence: send it with :meth:`commit`) or folded into its
        identity's window. A repeat is folded only while that window is open; else the verdict is
        :attr:`Verdict.UNSEEN` and nothing was counted: offer the full event.
        ``item.build(arg)`` is called at most once, and only if this repeat is still the last when a
        summary or a checkpoint needs it."""
        if type(item) is not Repeat:
            assert isinstance(item, Event)
            return self._admit(item)
        # A repeat without its event (the storm fast path): counted here, as _admit() would count it.
        key = item.key
        window = self._windows.get(key)
        if window is None:
            return _UNSEEN
        now = self._clock()
        if now - window.started >= self.window_s:
            return _UNSEEN
        cause = None
        if type(key) is tuple and key[0] is Kind.XID:  # (kind, code, gpu): see identity()
            _, code, gpu = key
            recent = self._causes.get(gpu)
            follows = self._follows.get(code)
            if (  # the plain storm: this code alone on its GPU, not following itself, not expired
                recent is not None
                and len(recent) == 1
                and recent[0].code == code
                and follows is not None
                and code not in follows
                and recent[0].at >= now - self.follow_window_s
            ):
                recent[0].at = now  # what _link_ids() would do, and it would find no cause
            else:
                cause = self._link_ids(gpu, code, window.first_id, now, search=True)
        # _count(), inlined: this runs once per line of a storm
        if not window.pending:
            self._pending[key] = window
        window.pending += 1
        severity = item.severity
        if severity is not window.severity and severity.rank > window.severity.rank:
            window.severity = severity
        window.last, window.recipe = None, (item.build, arg, cause)
        stats = self.stats
        stats.seen += 1
        stats.folded += 1
        self._dirty = True
        return _FOLDED

    async def process(self, event: Event) -> None:
        """Offer ``event`` and send it at once if it was staged: the path of the agent's watchers."""
        if self.offer(event) is _STAGED:
            await self.commit()

    __call__ = process

    def _admit(self, event: Event) -> Verdict:
        """Stage ``event`` (a first occurrence) or fold it into its identity's window."""
        self.stats.seen += 1
        now = self._clock()
        if not self.enabled:
            if event.kind is Kind.XID:
                event = self._link(event, now, event.id)
            self._direct.append(event)
            return _STAGED
        key = identity(event)
        window = self._windows.get(key)
        if window is not None and now - window.started >= self.window_s:
            self._close_window(key, window, now)
            window = self._windows.get(key)
        if event.kind is Kind.XID:
            event = self._link(event, now, event.id if window is None else window.first_id)
        if window is None:
            if len(self._windows) >= self.max_keys:
                self._flush_key(next(iter(self._windows)), retire=True)
            self._windows[key] = _Window(first_id=event.id, started=now, first_ts=event.ts)
            self._unsent[event.id] = event
            return _STAGED
        self._count(key, window, event.count, event.severity)
        window.last, window.recipe = event, None
        return _FOLDED

    async def tick(self) -> None:
        """Close every window that has ended (publishing its summary). Called periodically."""
        now = self._clock()
        for key, window in list(self._windows.items()):
            if now - window.started >= self.window_s:
                self._close_window(key, window, now)
        self._expire_causes(now)
        await self.commit()

    async def run(self, interval: float | None = None) -> None:
        """Publish what a checkpoint left unpublished, then :meth:`tick` forever (every quarter
        window, at most every second)."""
        period = interval or max(0.05, min(1.0, self.window_s / 4 if self.window_s > 0 else 1.0))
        await self.commit()
        while True:
            await asyncio.sleep(period)
            await self.tick()

    async def close(self) -> None:
        """Publish every pending summary now (shutdown)."""
        for key in list(self._windows):
            self._flush_key(key, retire=True)
        await self.commit()

    @property
    def pending(self) -> int:
        return sum(w.pending for w in self._pending.values())

    # --- internals --------------------------------------------------------------------------------

    async def _publish(self, event: Event) -> None:
        self.stats.published += 1
        await self._downstream(event)

    def _count(self, key: Hashable, window: _Window, count: int, severity: Severity) -> None:
        if not window.pending:
            self._pending[key] = window
        window.pending += count
        if severity.rank > window.severity.rank:
            window.severity = severity
        self.stats.folded += count
        self._dirty = True

    def _last(self, window: _Window) -> Event:
        """The window's latest repeat as an event (building it from its recipe, once)."""
        if window.recipe is not None:
            build, arg, cause = window.recipe
            event = build(arg)
            if cause is not None:
                data = {**event.data, "caused_by": cause[0], "caused_by_code": cause[1]}
                event = msgspec.structs.replace(event, data=data)
            window.last, window.recipe = event, None
        assert window.last is not None, "a window with pending repeats has a last one"
        return window.last

    def _close_window(self, key: Hashable, window: _Window, now: float) -> None:
        if window.pending:
            self._flush_key(key, retire=False)
            window.started = now  # still storming: stay hot, one summary per window
        else:
            del self._windows[key]

    def _flush_key(self, key: Hashable, *, retire: bool) -> None:
        """Stage the summary of ``key``'s pending repeats (published by the next :meth:`commit`)."""
        window = self._windows.get(key)
        if window is None:
            return
        if retire:
            del self._windows[key]
        if not window.pending:
            return
        last = self._last(window)
        window.windows += 1
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
        window.pending, window.last, window.recipe, window.severity = 0, None, None, Severity.INFO
        del self._pending[key]
        self._unsent[summary.id] = summary
        self._dirty = True
        self.stats.summaries += 1

    def _link(self, event: Event, now: float, cause_id: str) -> Event:
        """Set ``caused_by`` on a follow-on Xid; remember this Xid (as ``cause_id``) as a cause."""
        data = event.data
        cause = self._link_ids(
            data.get("pci") or data.get("uuid"),
            data.get("code"),
            cause_id,
            now,
            search="caused_by" not in data,
        )
        if cause is None:
            return event
        return msgspec.structs.replace(
            event, data={**data, "caused_by": cause[0], "caused_by_code": cause[1]}
        )

    def _link_ids(
        self, gpu: Any, code: Any, cause_id: str, now: float, *, search: bool
    ) -> tuple[str, int] | None:
        """Record Xid ``code`` on ``gpu`` (as ``cause_id``); return (id, code) of the cause it follows."""
        if type(gpu) is not str or type(code) is not int:
            return None
        recent = self._causes.get(gpu)
        if recent is None:
            recent = self._causes[gpu] = []
        cutoff = now - self.follow_window_s
        while recent and recent[0].at < cutoff:
            recent.pop(0)
        found = None
        if search:
            follows = self._follows.get(code)
            if follows is None:
                follows = self._follows[code] = load_xid_catalog().get(code).follows
            if follows:
                for cause in reversed(recent):
                    if cause.code in follows and cause.id != cause_id:
                        found = (cause.id, cause.code)
                        self.stats.linked += 1
                        break
        if recent and recent[-1].code == code:
            recent[-1].at = now  # a repeat: keep the first id, refresh its time
            return found
        recent.append(_Cause(code=code, id=cause_id, at=now))
        if len(recent) > _MAX_CAUSES:
            del recent[:-_MAX_CAUSES]
        return found

    def _expire_causes(self, now: float) -> None:
        cutoff = now - self.follow_window_s
        for gpu in [g for g, recent in self._causes.items() if not recent or recent[-1].at < cutoff]:
            del self._causes[gpu]
