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

Position across restarts (``state_path``, written atomically with write-then-rename): for the device,
the boot id and the last sequence number handled; for a file, its inode and the byte offset of the
first line not fully handled (``done``, when present, counts the events of that line already handled:
a line checkpointed between two of its events). Without saved state, ``from_start=False`` starts at
the end (the device's ``SEEK_END``, the file's current size); ``from_start=True`` reads everything
there is. After a reboot (boot id changed) saved device state is ignored and the whole ring buffer is
read; after a rotation while the agent was down the new file is read from its start.

When the position is written, and what else the file holds:

* **with storm control** (``storm=``, the agent's case) the file is also storm control's checkpoint:
  it holds :meth:`StormControl.snapshot <ftd.agent.storm.StormControl.snapshot>` (pending repeat
  counts, events about to be published) under ``"storm"``, restored on start, and storm control
  writes it before it publishes anything (see :mod:`ftd.agent.storm` for why). Before an event is
  handed to storm control the in-memory position already counts it as handled, so a checkpoint taken
  while publishing it does not make it read again. Besides, the file is written after every read
  batch that moved the position, and every 8,192 lines within a long one. A ``kill -9`` therefore
  leaves a position past which nothing was published: the lines after it are read again, and
  their repeats counted again, into the restored pending counts.
* **without** (tests, tools) it is written after every read batch and every 8,192 lines; lines read
  again after a kill give events with the same ids.

The file survives a kill (the page cache keeps it); with ``fsync`` (the agent passes the spool's
``fsync``: both or neither) every write is also flushed to disk, so a power cut cannot leave an older
checkpoint behind a newer spool.

Event ids are derived from the source position (boot id + sequence, or inode + offset, and the
event's index in its line), so an event read twice carries the same id and the coordinator drops
the duplicate. A FIFO's events get fresh ids (it has no position).

Repeats (the Xid storm fast path): a candidate line whose message text the parser has seen before
(:meth:`KmsgParser.cached <ftd.agent.kmsg_parse.KmsgParser.cached>`: only the prefix is parsed)
and whose event storm control still has an open window for is counted by
:meth:`StormControl.fold <ftd.agent.storm.StormControl.fold>` without building the event; storm
control builds it (the same event the full path builds) only if that repeat ends up in a summary.
Noise lines and repeats are handled without an ``await``; the loop yields to the event loop every
512 lines.
"""

from __future__ import annotations

import asyncio
import errno
import io
import os
import stat
import time
from collections.abc import Awaitable, Callable, Hashable
from pathlib import Path
from typing import Any

import msgspec

from ftd.agent.follow import FileFollower, Rotation
from ftd.agent.kmsg_parse import KernelEvent, KmsgParser, Template, is_candidate
from ftd.agent.storm import StormControl, StormState, identity
from ftd.catalog import load_xid_catalog
from ftd.events import Event, Kind, Severity, make_event, new_id
from ftd.fileio import write_atomic
from ftd.logs import get_logger

__all__ = ["KmsgWatcher", "kernel_event_to_event"]

log = get_logger(__name__)

_RECORD_BUF = 16384  # /dev/kmsg needs >= 8192 per read (one record, up to ~8 KiB with dictionary)
_CHUNK = 1 << 20
_YIELD_EVERY = 512  # lines between forced yields to the event loop
_COMMIT_EVERY = 16 * _YIELD_EVERY  # lines between position writes within one long read batch
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

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
        state_path: Path | None = None,
        from_start: bool = False,
        *,
        poll_interval: float = 0.025,
        parser: KmsgParser | None = None,
        storm: StormControl | None = None,
        fsync: bool = False,
    ) -> None:
        self.path = path
        self.fsync = fsync  # flush the position file to disk on every write (as the spool's ``fsync``)
        self.node = node
        self._emit = emit
        self.state_path = state_path
        self.from_start = from_start
        self.poll_interval = poll_interval
        self.parser = parser or KmsgParser()
        self.lines = 0  # input lines/records seen (also the parser's line numbers)
        self.events = 0
        self.overruns = 0  # /dev/kmsg records lost to EPIPE
        self._storm = storm
        # The position (module docstring), kept in memory and written by _write_state().
        self._kind: str | None = None  # "file" | "device" once known
        self._source: int | str | None = None  # the file's inode, the device's boot id
        self._mark: int | None = None  # file: offset of the first line not fully handled; device: last seq
        self._done = 0  # events of the line after the mark already handled
        self._skip = 0  # events to skip in the first line read after a (re)start: the saved ``done``
        self._write_failed = False
        self._file: _StateFile | None = None
        self._load_state()
        if storm is not None and state_path is not None:
            storm.attach(self._write_state)

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

    def _load_state(self) -> None:
        """Take the saved position, and hand storm control its saved state (once, at construction)."""
        if self.state_path is None:
            return
        try:
            state = msgspec.json.decode(self.state_path.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, msgspec.DecodeError) as exc:
            log.warning("kmsg_state_unreadable", path=str(self.state_path), error=str(exc))
            return
        if not isinstance(state, dict):
            return
        done = state.get("done", 0)
        self._done = done if isinstance(done, int) and done > 0 else 0
        if state.get("kind") == "file":
            self._kind, self._source = "file", state.get("inode")
            offset = state.get("offset")
            self._mark = offset if isinstance(offset, int) else None
        elif state.get("kind") == "device":
            self._kind, self._source = "device", state.get("boot_id")
            seq = state.get("seq")
            self._mark = seq if isinstance(seq, int) else None
        saved = state.get("storm")
        if self._storm is not None and saved is not None:
            try:
                self._storm.restore(msgspec.convert(saved, StormState))
            except (msgspec.ValidationError, ValueError) as exc:  # counts lost, but the agent runs
                log.error("kmsg_storm_state_unreadable", path=str(self.state_path), error=str(exc)[:300])

    def _write_state(self) -> None:
        """Write the position (and storm control's snapshot) atomically: write a temp file, rename."""
        if self.state_path is None or (self._kind is None and self._storm is None):
            return
        state: dict[str, Any] = {}
        if self._mark is not None:
            if self._kind == "file":
                state = {"kind": "file", "inode": self._source, "offset": self._mark}
            elif self._kind == "device":
                state = {"kind": "device", "boot_id": self._source, "seq": self._mark}
            if state and self._done:
                state["done"] = self._done
        if self._storm is not None:
            state["storm"] = self._storm.snapshot()
        if self._file is None:
            self._file = _StateFile(self.state_path, fsync=self.fsync)
        try:
            self._file.write(msgspec.json.encode(state))
        except OSError as exc:
            self._file.close()  # start over with a fresh file next time
            if not self._write_failed:  # once per failure spell: a full disk must not flood the log
                log.warning("kmsg_state_write_failed", path=str(self.state_path), error=str(exc))
            self._write_failed = True
        else:
            self._write_failed = False

    async def _commit(self) -> None:
        """Save the position (through storm control when attached: it publishes what it staged)."""
        if self._storm is not None:
            await self._storm.commit(force=True)
        else:
            self._write_state()

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
        memo = template.memo
        if memo is None:
            memo = template.memo = self._memo(template)
        key, severity = memo
        if not storm.fold(key, severity, self._repeat, (template, line, self.lines, base, pos, time.time())):
            return False
        self.events += 1
        return True

    def _memo(self, template: Template) -> tuple[Hashable, Severity]:
        """What :meth:`_quick` needs of a template: its storm-control key and severity."""
        event = kernel_event_to_event(self.node, template.event, event_id="-")
        return identity(event), event.severity

    def _repeat(self, arg: tuple[Template, str, int, str | None, int | None, float]) -> Event:
        """The event of a repeat :meth:`_quick` folded: the one :meth:`_handle_line` would emit."""
        template, line, lineno, base, pos, ts = arg
        kev = self.parser.expand(template, line, lineno)
        return kernel_event_to_event(self.node, kev, event_id=self._event_id(base, pos, 0), ts=ts)

    def _event_id(self, base: str | None, pos: int | None, index: int) -> str:
        return f"{new_id(self.node)}-{index}" if base is None else f"{base}-{pos}-{index}"

    async def _handle_line(self, line: str, base: str | None, pos: int | None) -> None:
        """Parse one line fully and emit its events (the line is counted in ``self.lines``)."""
        kevs = self.parser.feed(line, self.lines)
        start, skip = self._mark, self._skip
        self._skip = 0
        last = len(kevs) - 1
        for index in range(skip, len(kevs)):
            # Counted as handled before it goes out: storm control checkpoints ahead of publishing it.
            if index == last:
                if pos is not None:
                    self._mark = pos
                self._done = 0
            else:
                self._done = index + 1
            event = kernel_event_to_event(self.node, kevs[index], event_id=self._event_id(base, pos, index))
            try:
                await self._emit(event)
            except Exception:
                self._mark, self._done = start, index  # not handled: read it again
                raise
            self.events += 1
        if pos is not None:
            self._mark = pos
        self._done = 0

    # --- /dev/kmsg --------------------------------------------------------------------------------

    async def _run_device(self) -> None:
        boot = _boot_id()
        last_seq = self._mark if self._kind == "device" and self._source == boot else None
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            if last_seq is None and not self.from_start and self._kind != "device":
                os.lseek(fd, 0, os.SEEK_END)  # (after a reboot, saved state means: read it all)
            self._skip = self._done if last_seq is not None else 0
            self._kind, self._source, self._mark, self._done = "device", boot, last_seq, self._skip
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
        handled = False
        quick = self._quick
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
            seq = _record_seq(record)
            last_seq = self._mark
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
                    self._mark = seq
            else:
                await self._handle_line(first, base, seq)
            handled = True
        if handled:
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
        mark = self._mark
        if (
            self._kind == "file"
            and self._source == follower.inode
            and mark is not None
            and 0 <= mark <= follower.size()
        ):
            follower.seek(mark)
            self._skip = self._done
        else:
            # Rotated (or truncated) while we were down: the new file is all unread.
            follower.seek(0 if self._kind == "file" or self.from_start else follower.size())
            self._skip = 0
        self._kind, self._source, self._mark, self._done = "file", follower.inode, follower.offset, self._skip
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
            self._source, self._mark, self._done, self._skip = follower.inode, 0, 0, 0
        return rotation in (Rotation.DRAIN, Rotation.SWITCHED)

    async def _drain_file(self, follower: FileFollower) -> bool:
        """Handle every complete line available now; True if anything was read."""
        progressed = False
        quick = self._quick
        while True:
            if follower.check_truncation():
                log.info("kmsg_file_truncated", path=self.path)
                self._mark, self._done, self._skip = 0, 0, 0
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
                    self._mark = end
                else:
                    await self._handle_line(line, base, end)


_PAGE = 4096


class _StateFile:
    """The position file, written often (storm control checkpoints ahead of every publish).

    Replacing it (write a temp file, rename) costs ~100 us on ext4; so once it exists it is
    overwritten in place with one ``pwrite`` at offset 0 (under 1 us), padded with spaces to the
    file's length (JSON allows trailing whitespace), which a kill cannot tear: content of at most a
    page, written by one call, is copied whole or not at all (the kernel looks for a fatal signal
    before each page it copies). A reader running at the same moment may see a mix (it reads again).
    Larger content, and every write when ``fsync`` is set (durable across a power cut: file and
    directory flushed, as the spool does), replace the file instead."""

    def __init__(self, path: Path, *, fsync: bool) -> None:
        self.path = path
        self.fsync = fsync
        self._handle: io.FileIO | None = None  # open for overwriting (closed with the object)
        self._size = 0

    def write(self, data: bytes) -> None:
        if self.fsync or len(data) > _PAGE or self._handle is None:
            self._replace(data)
            return
        if len(data) < self._size:
            data = data.ljust(self._size)
        if os.pwrite(self._handle.fileno(), data, 0) != len(data):
            self._replace(data.rstrip())
            return
        self._size = len(data)

    def _replace(self, data: bytes) -> None:
        self.close()
        try:
            write_atomic(self.path, data, fsync=self.fsync, mode=0o644)
        except FileNotFoundError:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, data, fsync=self.fsync, mode=0o644)
        if not self.fsync and len(data) <= _PAGE:
            self._handle = io.FileIO(self.path, "r+")
            self._size = len(data)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def _record_seq(record: bytes) -> int | None:
    """The sequence number of a raw /dev/kmsg record (``PRI,SEQ,TS,FLAGS;...``)."""
    parts = record.split(b",", 2)
    if len(parts) < 3 or not parts[1].isdigit():
        return None
    return int(parts[1])
