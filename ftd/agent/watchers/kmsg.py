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
  ``add_reader`` spin) and read through ``add_reader``; nothing is persisted (a FIFO has no position).

Position across restarts (``state_path``, written atomically with write-then-rename): for the device,
the boot id and the last sequence number handled; for a file, its inode and the byte offset after the
last line handled. The position moves past a record only after ``emit`` has returned for every event
of that record, so a killed agent neither repeats nor misses an event (noise lines are re-read at
worst). Without saved state, ``from_start=False`` starts at the end (the device's ``SEEK_END``, the
file's current size); ``from_start=True`` reads everything there is. After a reboot (boot id changed)
saved device state is ignored and the whole ring buffer is read.

Event ids are derived from the source position (boot id + sequence, or inode + offset), so even a
duplicate that slipped through would carry the same id and be dropped by the coordinator.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog

from ftd.agent.follow import FileFollower, Rotation
from ftd.agent.kmsg_parse import KernelEvent, KmsgParser
from ftd.catalog import load_xid_catalog
from ftd.events import Event, Kind, make_event, new_id

__all__ = ["KmsgWatcher", "kernel_event_to_event"]

log = structlog.get_logger(__name__)

_RECORD_BUF = 16384  # /dev/kmsg needs >= 8192 per read (one record, up to ~8 KiB with dictionary)
_CHUNK = 1 << 20
_YIELD_EVERY = 512  # lines between forced yields to the event loop
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

Emit = Callable[[Event], Awaitable[None]]


def kernel_event_to_event(node: str, kev: KernelEvent, *, event_id: str | None = None) -> Event:
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
    return make_event(node, kev.kind, severity=kev.severity, source="kmsg", data=data, id=event_id)


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
    ) -> None:
        self.path = path
        self.node = node
        self._emit = emit
        self.state_path = state_path
        self.from_start = from_start
        self.poll_interval = poll_interval
        self.parser = parser or KmsgParser()
        self.lines = 0  # input lines/records seen (also the parser's line numbers)
        self.events = 0
        self.overruns = 0  # /dev/kmsg records lost to EPIPE

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

    def _load_state(self) -> dict[str, Any]:
        if self.state_path is None:
            return {}
        try:
            state = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("kmsg_state_unreadable", path=str(self.state_path), error=str(exc))
            return {}
        return state if isinstance(state, dict) else {}

    def _save_state(self, state: dict[str, Any]) -> None:
        if self.state_path is None:
            return
        tmp = self.state_path.with_name(f".{self.state_path.name}.tmp")
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(state))
            os.replace(tmp, self.state_path)
        except OSError as exc:
            log.warning("kmsg_state_write_failed", path=str(self.state_path), error=str(exc))

    # --- common -----------------------------------------------------------------------------------

    async def _handle_line(self, line: str, id_base: str) -> bool:
        """Parse one line and emit its events; True when there were any."""
        self.lines += 1
        if self.lines % _YIELD_EVERY == 0:
            await asyncio.sleep(0)  # a storm of lines must not starve the agent's other tasks
        kevs = self.parser.feed(line, self.lines)
        for index, kev in enumerate(kevs):
            await self._emit(kernel_event_to_event(self.node, kev, event_id=f"{id_base}-{index}"))
            self.events += 1
        return bool(kevs)

    # --- /dev/kmsg --------------------------------------------------------------------------------

    async def _run_device(self) -> None:
        boot = _boot_id()
        state = self._load_state()
        last_seq: int | None = None
        if (
            state.get("kind") == "device"
            and state.get("boot_id") == boot
            and isinstance(state.get("seq"), int)
        ):
            last_seq = state["seq"]
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            if last_seq is None and not self.from_start:
                os.lseek(fd, 0, os.SEEK_END)
            await self._device_loop(fd, boot, last_seq)
        finally:
            os.close(fd)

    async def _device_loop(self, fd: int, boot: str, last_seq: int | None) -> None:
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        loop.add_reader(fd, ready.set)
        tag = boot[:8] or "noboot"
        try:
            while True:
                await ready.wait()
                ready.clear()
                last_seq = await self._drain_device(fd, tag, boot, last_seq)
        finally:
            loop.remove_reader(fd)

    async def _drain_device(self, fd: int, tag: str, boot: str, last_seq: int | None) -> int | None:
        """Read every record available now; return the last sequence number handled."""
        dirty = False
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
            if seq is not None and last_seq is not None and seq <= last_seq:
                continue  # handled before a restart
            if seq is not None and last_seq is not None and seq > last_seq + 1:
                log.warning("kmsg_gap", path=self.path, missed=seq - last_seq - 1)
            first = record.split(b"\n", 1)[0].decode("utf-8", errors="replace")
            had_events = await self._handle_line(first, f"{self.node}-kmsg-{tag}-{seq}")
            if seq is not None:
                last_seq, dirty = seq, True
            if had_events and last_seq is not None:
                self._save_state({"kind": "device", "boot_id": boot, "seq": last_seq})
                dirty = False
        if dirty and last_seq is not None:
            self._save_state({"kind": "device", "boot_id": boot, "seq": last_seq})
        return last_seq

    # --- FIFO -------------------------------------------------------------------------------------

    async def _run_fifo(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)  # RDWR: never EOF, so no spinning
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        loop.add_reader(fd, ready.set)
        pending = b""
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
                        await self._handle_line(raw.decode("utf-8", errors="replace"), new_id(self.node))
        finally:
            loop.remove_reader(fd)
            os.close(fd)

    # --- regular file -----------------------------------------------------------------------------

    async def _run_file(self) -> None:
        follower = FileFollower(self.path, chunk=_CHUNK)
        follower.open()
        state = self._load_state()
        if state.get("kind") == "file" and state.get("inode") == follower.inode:
            offset = state.get("offset")
            follower.seek(offset if isinstance(offset, int) and 0 <= offset <= follower.size() else 0)
        elif state.get("kind") == "file" or self.from_start:
            follower.seek(0)  # rotated while we were down: the new file is all unread
        else:
            follower.seek(follower.size())
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
        return rotation in (Rotation.DRAIN, Rotation.SWITCHED)

    async def _drain_file(self, follower: FileFollower) -> bool:
        """Handle every complete line available now; True if anything was read."""
        progressed = False
        while True:
            if follower.check_truncation():
                log.info("kmsg_file_truncated", path=self.path)
            lines = follower.read()
            if not lines:
                return progressed
            progressed = True
            for raw, end in lines:
                had_events = await self._handle_line(
                    raw.decode("utf-8", errors="replace"), f"{self.node}-kmsg-{follower.inode}-{end}"
                )
                if had_events:
                    self._save_state({"kind": "file", "inode": follower.inode, "offset": end})
            self._save_state({"kind": "file", "inode": follower.inode, "offset": follower.offset})


def _record_seq(record: bytes) -> int | None:
    """The sequence number of a raw /dev/kmsg record (``PRI,SEQ,TS,FLAGS;...``)."""
    parts = record.split(b",", 2)
    if len(parts) < 3 or not parts[1].isdigit():
        return None
    return int(parts[1])
