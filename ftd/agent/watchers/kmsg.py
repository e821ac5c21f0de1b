"""Kernel-log watcher: follows ``/dev/kmsg`` (or a file, or a FIFO) and emits one Event per kernel event.

Sources, chosen by what ``path`` is:

* **character device** (``/dev/kmsg``): opened non-blocking, registered with ``loop.add_reader`` so a
  new record is read as soon as the kernel writes it. Each ``read()`` returns one record and needs a
  buffer of at least 8 KiB. ``EPIPE`` means the ring buffer overwrote records we had not read yet: it
  is logged with a count and reading goes on.
* **regular file**: followed like ``tail -F`` by :class:`ftd.agent.follow.FileFollower`: appended
  lines are read, truncation (size below our offset) restarts at 0, rotation (a new inode at
  ``path``) drains the old file then opens the new one; while nothing is at ``path`` the old file
  stays open and the new one is awaited. Regular files cannot be watched with ``add_reader``
  (always "ready"), so an idle file is polled every ``poll_interval`` seconds (25 ms: new-line
  latency well under 60 ms, ~40 cheap syscalls a second when idle).
* **FIFO**: opened read-write (so it never reports EOF when a writer goes away, which would make
  ``add_reader`` spin) and read through ``add_reader``; no position is saved (a FIFO has none; with
  storm control, its checkpoint still is).

Position across restarts (``checkpoint``, a :class:`~ftd.agent.watchers.kmsg_checkpoint.KmsgCheckpoint`
that keeps it in a file; without one it lives in memory only): for the device, the boot id and the
last sequence number handled; for a file, its inode and the byte offset of the first line not fully
handled (``done``, when present, counts the events of that line already handled: a line checkpointed
between two of its events). Without saved state, ``from_start=False`` starts at
the end (the device's ``SEEK_END``, the file's current size); ``from_start=True`` reads everything
there is. After a reboot (boot id changed) saved device state is ignored and the whole ring buffer is
read; after a rotation while the agent was down the new file is read from its start.

When the position is written, and what else the file holds:

* **with storm control** (``storm=``, the agent's case; it must have been made with the same
  checkpoint) the file is also storm control's checkpoint: it holds
  :meth:`StormControl.snapshot <ftd.agent.storm.StormControl.snapshot>` (pending repeat counts,
  events about to be published) under ``"storm"``, restored when storm control is made, and storm
  control writes it before it publishes anything (see :mod:`ftd.agent.storm` for why). The watcher
  offers every event to storm control (:meth:`StormControl.offer <ftd.agent.storm.StormControl.offer>`;
  ``emit`` is not used) and has it send a staged one at once. Before an event is offered the
  position already counts it as handled, so a checkpoint taken while publishing it does not make it
  read again. Besides, the file is written after every read
  batch that moved the position, and every 8,192 lines within a long one. A ``kill -9`` therefore
  leaves a position past which nothing was published: the lines after it are read again, and
  their repeats counted again, into the restored pending counts.
* **without** (tests, tools) events go to ``emit`` and the watcher writes the file itself after every
  read batch and every 8,192 lines; lines read again after a kill give events with the same ids.

The file survives a kill (the page cache keeps it); with the checkpoint's ``fsync`` (the agent passes
the spool's ``fsync``: both or neither) every write is also flushed to disk, so a power cut cannot
leave an older checkpoint behind a newer spool.

Event ids are derived from the source position (boot id + sequence, or inode + offset, and the
event's index in its line), so an event read twice carries the same id and the coordinator drops
the duplicate. A FIFO's events get fresh ids (it has no position).

Repeats (the Xid storm fast path): a candidate line whose message text the parser has seen before
(:meth:`KmsgParser.cached <ftd.agent.kmsg_parse.KmsgParser.cached>`: only the prefix is parsed)
and whose event storm control still has an open window for is offered as a
:class:`~ftd.agent.storm.Repeat` (kept on the parser's template) and counted without building the
event; storm control builds it (the same event the full path builds) only if that repeat ends up in
a summary or a checkpoint.
Noise lines and repeats are handled without an ``await``; the loop yields to the event loop every
512 lines.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ftd.agent.follow import FileFollower, Rotation
from ftd.agent.kmsg_parse import KernelEvent, KmsgParser, Template, is_candidate
from ftd.agent.storm import Repeat, StormControl, Verdict, identity
from ftd.agent.watchers.kmsg_checkpoint import KmsgCheckpoint
from ftd.catalog import load_xid_catalog
from ftd.events import Event, Kind, make_event, new_id
from ftd.logs import get_logger

__all__ = ["KmsgWatcher", "kernel_event_to_event"]

log = get_logger(__name__)

_RECORD_BUF = 16384  # /dev/kmsg needs >= 8192 per read (one record, up to ~8 KiB with dictionary)
_CHUNK = 1 << 20
_YIELD_EVERY = 512  # lines between forced yields to the event loop
_COMMIT_EVERY = 16 * _YIELD_EVERY  # lines between position writes within one long read batch
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_FOLDED, _STAGED = Verdict.FOLDED, Verdict.STAGED

Emit = Callable[[Event], Awaitable[None]]


def kernel_event_to_event(
    node: str, kev: KernelEvent, *, event_id: str | None = None, ts: float | None = None
) -> Event:
    """Wrap a parsed kernel event in the bus envelope (``source="kmsg"``, ``None`` values dropped)."""
    data: dict[str, Any] = {
        "code": kev.code,
        "pci": kev.pci,
        "pid": kev.pid,
        "process": kev.process,
        "action": kev.action,
        "message": kev.message,
        "uuid": kev.uuid,
        "line": kev.line,
        "seq": kev.seq,
        "kernel_ts": kev.ts,
    }
    for key, value in kev.data.items():  # a host family's own fields (docs/signals.md)
        data.setdefault(key, value)
    if kev.kind is Kind.XID:
        data["catalog_version"] = load_xid_catalog().version
    if kev.extra:
        data["extra"] = dict(kev.extra)
    data = {key: value for key, value in data.items() if value is not None}
    return make_event(node, kev.kind, severity=kev.severity, source="kmsg", data=data, id=event_id, ts=ts)


def _boot_id() -> str:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


class KmsgWatcher:
    """Follow a kernel-log source and emit events; see the module docstring for the contract."""

    def __init__(
        self,
        path: str,
        node: str,
        emit: Emit,
        checkpoint: KmsgCheckpoint | None = None,
        from_start: bool = False,
        *,
        poll_interval: float = 0.025,
        parser: KmsgParser | None = None,
        storm: StormControl | None = None,
    ) -> None:
        if storm is not None and checkpoint is not storm.checkpoint:
            raise ValueError("the kmsg watcher and its storm control must share one checkpoint")
        self.path = path
        self.node = node
        self._emit = emit  # without storm control; with it, events are offered to it
        self.from_start = from_start
        self.poll_interval = poll_interval
        self.parser = parser or KmsgParser()
        self.lines = 0  # input lines/records seen (also the parser's line numbers)
        self.events = 0
        self.overruns = 0  # /dev/kmsg records lost to EPIPE
        # How late the newest /dev/kmsg record was when read: CLOCK_MONOTONIC minus its kernel
        # timestamp (the agent's metrics: a watcher falling behind a storm). 0 for files and FIFOs.
        self.lag_s = 0.0
        self._storm = storm
        # The position (module docstring): kind, source, mark and done, as the checkpoint loaded it.
        self.checkpoint = checkpoint if checkpoint is not None else KmsgCheckpoint(None)
        self._skip = 0  # events to skip in the first line read after a (re)start: the saved ``done``

    # --- public -----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Watch until cancelled."""
        mode = os.stat(self.path).st_mode
        if stat.S_ISCHR(mode):
            await self._run_device()
        elif stat.S_ISFIFO(mode):
            await self._run_fifo()
        else:
            await self._run_file()

    # --- state ------------------------------------------------------------------------------------

    async def _commit(self) -> None:
        """Save the position (through storm control when there is one: it saves its state with it and
        publishes what it staged)."""
        if self._storm is not None:
            await self._storm.commit(force=True)
        else:
            self.checkpoint.save()

    # --- common -----------------------------------------------------------------------------------

    async def _pause(self) -> None:
        """Every ``_YIELD_EVERY`` lines: a storm of lines must not starve the agent's other tasks."""
        if self.lines % _COMMIT_EVERY == 0:
            await self._commit()
        await asyncio.sleep(0)

    def _quick(self, line: str, base: str | None, pos: int | None) -> bool:
        """Handle a noise line or a repeat storm control can fold, without awaiting; True if done."""
        if not is_candidate(line):
            return True
        storm = self._storm
        if storm is None or self._skip:
            return False
        template = self.parser.cached(line, self.lines)
        if template is None:
            return False
        repeat = template.memo
        if repeat is None:
            repeat = template.memo = self._memo(template)
        if storm.offer(repeat, (template, line, self.lines, base, pos, time.time())) is not _FOLDED:
            return False
        self.events += 1
        return True

    def _memo(self, template: Template) -> Repeat:
        """What :meth:`_quick` offers for a repeat of ``template``: its storm-control key, severity, and
        how to build the event."""
        event = kernel_event_to_event(self.node, template.event, event_id="-")
        return Repeat(identity(event), event.severity, self._repeat)

    def _repeat(self, arg: tuple[Template, str, int, str | None, int | None, float]) -> Event:
        """The event of a repeat :meth:`_quick` folded: the one :meth:`_handle_line` would emit."""
        template, line, lineno, base, pos, ts = arg
        kev = self.parser.expand(template, line, lineno)
        return kernel_event_to_event(self.node, kev, event_id=self._event_id(base, pos, 0), ts=ts)

    def _event_id(self, base: str | None, pos: int | None, index: int) -> str:
        return f"{new_id(self.node)}-{index}" if base is None else f"{base}-{pos}-{index}"

    async def _handle_line(self, line: str, base: str | None, pos: int | None) -> None:
        """Parse one line fully and emit its events (the line is counted in ``self.lines``): to storm
        control when there is one (sent at once when staged), else to ``emit``."""
        kevs = self.parser.feed(line, self.lines)
        at, storm = self.checkpoint, self._storm
        start, skip = at.mark, self._skip
        self._skip = 0
        last = len(kevs) - 1
        for index in range(skip, len(kevs)):
            # Counted as handled before it goes out: storm control checkpoints ahead of publishing it.
            if index == last:
                if pos is not None:
                    at.mark = pos
                at.done = 0
            else:
                at.done = index + 1
            event = kernel_event_to_event(self.node, kevs[index], event_id=self._event_id(base, pos, index))
            try:
                if storm is None:
                    await self._emit(event)
                elif storm.offer(event) is _STAGED:
                    await storm.commit()
            except Exception:
                at.mark, at.done = start, index  # not handled: read it again
                raise
            self.events += 1
        if pos is not None:
            at.mark = pos
        at.done = 0

    # --- /dev/kmsg --------------------------------------------------------------------------------

    async def _run_device(self) -> None:
        boot = _boot_id()
        at = self.checkpoint
        last_seq = at.mark if at.kind == "device" and at.source == boot else None
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            if last_seq is None and not self.from_start and at.kind != "device":
                os.lseek(fd, 0, os.SEEK_END)  # (after a reboot, saved state means: read it all)
            self._skip = at.done if last_seq is not None else 0
            at.kind, at.source, at.mark, at.done = "device", boot, last_seq, self._skip
            await self._device_loop(fd, boot)
        finally:
            os.close(fd)

    async def _device_loop(self, fd: int, boot: str) -> None:
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        loop.add_reader(fd, ready.set)
        base = f"{self.node}-kmsg-{boot[:8] or 'noboot'}"
        try:
            while True:
                await ready.wait()
                ready.clear()
                await self._drain_device(fd, base)
        finally:
            loop.remove_reader(fd)

    async def _drain_device(self, fd: int, base: str) -> None:
        """Read every record available now."""
        handled, newest = False, b""
        quick, at = self._quick, self.checkpoint
        while True:
            try:
                record = os.read(fd, _RECORD_BUF)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    self.overruns += 1
                    log.warning("kmsg_overrun", path=self.path, detail="records overwritten before read")
                    continue
                raise
            if not record:
                break
            newest = record
            seq = _record_seq(record)
            last_seq = at.mark
            if seq is not None and last_seq is not None:
                if seq <= last_seq:
                    continue  # handled before a restart
                if seq > last_seq + 1:
                    log.warning("kmsg_gap", path=self.path, missed=seq - last_seq - 1)
            self.lines += 1
            if self.lines % _YIELD_EVERY == 0:
                await self._pause()
            first = record.split(b"\n", 1)[0].decode("utf-8", errors="replace")
            if quick(first, base, seq):
                if seq is not None:
                    at.mark = seq
            else:
                await self._handle_line(first, base, seq)
            handled = True
        if handled:
            self.lag_s = _record_lag(newest, time.clock_gettime(time.CLOCK_MONOTONIC))
            await self._commit()

    # --- FIFO -------------------------------------------------------------------------------------

    async def _run_fifo(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)  # RDWR: never EOF, so no spinning
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        loop.add_reader(fd, ready.set)
        pending = b""
        quick = self._quick
        try:
            while True:
                await ready.wait()
                ready.clear()
                while True:
                    try:
                        chunk = os.read(fd, _CHUNK)
                    except BlockingIOError:
                        break
                    if not chunk:
                        break
                    pending += chunk
                    lines = pending.split(b"\n")
                    pending = lines.pop()
                    for raw in lines:
                        self.lines += 1
                        if self.lines % _YIELD_EVERY == 0:
                            await self._pause()
                        line = raw.decode("utf-8", errors="replace")
                        if not quick(line, None, None):
                            await self._handle_line(line, None, None)
                await self._commit()
        finally:
            loop.remove_reader(fd)
            os.close(fd)

    # --- regular file -----------------------------------------------------------------------------

    async def _run_file(self) -> None:
        follower = FileFollower(self.path, chunk=_CHUNK)
        follower.open()
        at = self.checkpoint
        mark = at.mark
        if (
            at.kind == "file"
            and at.source == follower.inode
            and mark is not None
            and 0 <= mark <= follower.size()
        ):
            follower.seek(mark)
            self._skip = at.done
        else:
            # Rotated (or truncated) while we were down: the new file is all unread.
            follower.seek(0 if at.kind == "file" or self.from_start else follower.size())
            self._skip = 0
        at.kind, at.source, at.mark, at.done = "file", follower.inode, follower.offset, self._skip
        try:
            while True:
                progressed = await self._drain_file(follower)
                if not progressed and not self._rotated(follower):
                    await asyncio.sleep(self.poll_interval)
        finally:
            follower.close()

    def _rotated(self, follower: FileFollower) -> bool:
        """True when there is more to read after a rotation (the old file's rest, or the new file)."""
        rotation = follower.check_rotation()
        if rotation is Rotation.SWITCHED:
            log.info("kmsg_file_rotated", path=self.path)
            at = self.checkpoint
            at.source, at.mark, at.done, self._skip = follower.inode, 0, 0, 0
        return rotation in (Rotation.DRAIN, Rotation.SWITCHED)

    async def _drain_file(self, follower: FileFollower) -> bool:
        """Handle every complete line available now; True if anything was read."""
        progressed = False
        quick, at = self._quick, self.checkpoint
        while True:
            if follower.check_truncation():
                log.info("kmsg_file_truncated", path=self.path)
                at.mark, at.done, self._skip = 0, 0, 0
            lines = follower.read()
            if not lines:
                if progressed:
                    await self._commit()
                return progressed
            progressed = True
            base = f"{self.node}-kmsg-{follower.inode}"
            for raw, end in lines:
                self.lines += 1
                if self.lines % _YIELD_EVERY == 0:
                    await self._pause()
                line = raw.decode("utf-8", errors="replace")
                if quick(line, base, end):
                    at.mark = end
                else:
                    await self._handle_line(line, base, end)


def _record_lag(record: bytes, now: float) -> float:
    """Seconds between a raw /dev/kmsg record's timestamp (``PRI,SEQ,TS_USEC,...``) and ``now``
    (CLOCK_MONOTONIC, the kernel log's clock); 0 when the record has no readable timestamp."""
    parts = record.split(b",", 3)
    if len(parts) < 4 or not parts[2].isdigit():
        return 0.0
    return max(0.0, now - int(parts[2]) / 1e6)


def _record_seq(record: bytes) -> int | None:
    """The sequence number of a raw /dev/kmsg record (``PRI,SEQ,TS,FLAGS;...``)."""
    parts = record.split(b",", 2)
    if len(parts) < 3 or not parts[1].isdigit():
        return None
    return int(parts[1])
