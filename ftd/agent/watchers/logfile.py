"""Training-log watcher: follow files and globs, match pattern tables, flag logs that stop growing.

* **Following**: every entry of ``agent.logs.paths`` is a file or a glob; a glob is re-expanded on
  every rescan, so new files (``rank7.log``, the next run's log) are picked up and read from their
  start, while files present when the agent starts are read from their end (like ``tail -F``).
  Each file is read by a :class:`ftd.agent.follow.FileFollower`: truncation (size below our offset)
  restarts at 0; rotation (a new inode at the path) drains the old file then opens the new one; a
  deleted file is dropped once drained.
* **Change notification**: watchdog (inotify on Linux) watches the parent directory of every entry
  and wakes the loop; wake-ups are coalesced (at most one drain per ``_MIN_WAKE_S``) so a chatty log
  costs little. Without watchdog, or when inotify is out of watches, the loop polls every
  ``rescan_s``; it always rescans the globs and checks staleness at that period anyway.
* **Patterns**: data, in ``ftd/catalog/log_patterns.toml`` (or ``patterns_file``), loaded by
  :mod:`ftd.catalog.log_patterns`: name, regex, severity. A match emits ``log_pattern`` with
  ``file``, ``line`` (1-based, counted from the start of the file when known; ``None`` for a large
  file joined at its end), ``offset``, ``pattern`` and ``text`` (the line, truncated to 512
  characters), ``xid`` when the table says which Xid the line reports, and ``peer_address`` when the
  line blames another rank by address (:func:`ftd.culprit.peers.parse_peer_error`). Per (file, pattern) at
  most one event per ``rate_limit_s``; the next event carries the number suppressed in between
  (``suppressed``).
* **Stale**: a followed log that has not grown for ``stale_after_s`` is a hang suspect: one
  ``log_stale`` per episode (re-armed when it grows).
* **Bad input**: lines are cut at ``max_line_bytes`` (the rest is skipped up to the next newline,
  never buffered), bytes that are not UTF-8 are replaced, lines with NUL bytes are counted as binary;
  ``stats`` counts lines, matches, long lines, binary lines, truncations and rotations.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import time
from collections.abc import Callable
from typing import Any

from ftd.agent.follow import FileFollower, Rotation
from ftd.agent.watchers.base import Emit
from ftd.catalog.log_patterns import LogPattern, load_patterns
from ftd.config import LogsConfig
from ftd.culprit.peers import parse_peer_error
from ftd.events import Kind, Severity, make_event
from ftd.logs import get_logger

__all__ = ["LogWatcher"]

log = get_logger(__name__)

_CHUNK = 1 << 16
_MIN_WAKE_S = 0.05
_TEXT_MAX = 512
_COUNT_LINES_MAX = 256 << 20  # files joined at their end: count their lines only below this size


class _Log:
    """One followed log: its file, line numbers, growth time and stale flag."""

    def __init__(self, path: str, now: float, max_line: int) -> None:
        self.path = path
        self.file = FileFollower(path, chunk=_CHUNK, max_line=max_line)
        self.line: int | None = 0  # lines completed so far (None: unknown, joined a big file at its end)
        self.last_growth = now
        self.stale_reported = False

    def open(self, at_end: bool) -> None:
        self.file.open()
        if at_end:
            size = self.file.size()
            self.file.seek(size)
            self.line = _count_lines(self.file.fd, size) if size <= _COUNT_LINES_MAX else None
        else:
            self.line = 0

    def close(self) -> None:
        self.file.close()


def _count_lines(fd: int, size: int) -> int:
    count, pos = 0, 0
    while pos < size:
        chunk = os.pread(fd, min(1 << 20, size - pos), pos)
        if not chunk:
            break
        count += chunk.count(b"\n")
        pos += len(chunk)
    return count


class LogWatcher:
    """See the module docstring."""

    name = "logs"

    def __init__(
        self,
        cfg: LogsConfig,
        node: str,
        emit: Emit,
        *,
        patterns: list[LogPattern] | None = None,
        clock: Callable[[], float] = time.monotonic,
        use_inotify: bool = True,
    ) -> None:
        self.cfg = cfg
        self.node = node
        self._emit = emit
        self.patterns = patterns if patterns is not None else load_patterns(cfg.patterns_file)
        self._clock = clock
        self.use_inotify = use_inotify
        self.followers: dict[str, _Log] = {}
        self.stats: dict[str, int] = dict.fromkeys(
            ("lines", "matches", "suppressed", "long_lines", "binary_lines", "truncations", "rotations"), 0
        )
        self._last_emit: dict[tuple[str, str], float] = {}
        self._suppressed: dict[tuple[str, str], int] = {}
        self._wake: asyncio.Event | None = None
        self._observer: Any = None
        self._watched_dirs: set[str] = set()
        self._started = False
        self.inotify_active = False
        self.last_progress = time.monotonic()

    # --- public -----------------------------------------------------------------------------------

    async def run(self) -> None:
        if not self.cfg.paths:
            log.info("log_watcher_idle", reason="no paths configured (agent.logs.paths)")
            await asyncio.Event().wait()
        self._wake = asyncio.Event()
        if self.use_inotify:
            self._start_observer(asyncio.get_running_loop())
        try:
            await self.scan()
            while True:
                timeout = self._next_timeout()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
                self._wake.clear()
                await self.scan()
                self.last_progress = time.monotonic()
                await asyncio.sleep(_MIN_WAKE_S)  # coalesce bursts of inotify wake-ups
        finally:
            self._stop_observer()
            for follower in self.followers.values():
                follower.close()

    async def scan(self) -> None:
        """Pick up new files, drain every follower, check staleness (one pass)."""
        now = self._clock()
        for path in self._expand():
            if path not in self.followers:
                follower = _Log(path, now, self.cfg.max_line_bytes)
                try:
                    follower.open(at_end=not self._started)
                except OSError:
                    continue
                log.info("log_follow", path=path, from_start=self._started)
                self.followers[path] = follower
        self._started = True
        for path in list(self.followers):
            await self._drain(self.followers[path])
        await self._check_stale(self._clock())

    # --- discovery --------------------------------------------------------------------------------

    def _expand(self) -> list[str]:
        found: list[str] = []
        for entry in self.cfg.paths:
            entry = os.path.expanduser(entry)
            if glob.has_magic(entry):
                found.extend(p for p in sorted(glob.glob(entry)) if os.path.isfile(p))
            elif os.path.isfile(entry):
                found.append(entry)
        if self._observer is not None:
            self._watch_dirs()
        return found

    def _start_observer(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError as exc:
            log.info("log_watcher_polling", reason=f"watchdog not installed: {exc}")
            return
        assert self._wake is not None
        wake: asyncio.Event = self._wake

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                with contextlib.suppress(RuntimeError):  # loop closed
                    loop.call_soon_threadsafe(wake.set)

        try:
            observer = Observer()
            observer.daemon = True
            self._handler = Handler()
            observer.start()
        except Exception as exc:
            log.warning("log_watcher_polling", reason=f"inotify unavailable: {exc}")
            return
        self._observer = observer
        self._watch_dirs()

    def _watch_dirs(self) -> None:
        for entry in self.cfg.paths:
            directory = os.path.dirname(os.path.expanduser(entry)) or "."
            if glob.has_magic(directory) or directory in self._watched_dirs or not os.path.isdir(directory):
                continue  # a glob in the directory part is covered by the rescan period
            try:
                self._observer.schedule(self._handler, directory, recursive=False)
            except Exception as exc:  # out of inotify watches, permission ...
                log.warning("log_watch_failed", directory=directory, error=str(exc))
                continue
            self._watched_dirs.add(directory)
            self.inotify_active = True

    def _stop_observer(self) -> None:
        if self._observer is not None:
            with contextlib.suppress(Exception):
                self._observer.stop()
            self._observer = None

    def _next_timeout(self) -> float:
        timeout = self.cfg.rescan_s
        stale = self.cfg.stale_after_s
        if stale is not None:
            now = self._clock()
            for f in self.followers.values():
                if not f.stale_reported:
                    timeout = min(timeout, max(0.0, f.last_growth + stale - now))
        return max(timeout, 0.01)

    # --- reading ----------------------------------------------------------------------------------

    async def _drain(self, f: _Log) -> None:
        try:
            truncated = f.file.check_truncation()
        except OSError:
            return
        if truncated:
            self.stats["truncations"] += 1
            log.info("log_truncated", path=f.path)
            f.line = 0
        await self._read_available(f)
        # rotation / deletion: is the path still this file?
        rotation = self._rotation(f)
        if rotation is Rotation.DRAIN:
            await self._read_available(f)  # whatever was written before the rename
            rotation = self._rotation(f)
        if rotation is Rotation.SAME or rotation is Rotation.DRAIN:
            return  # DRAIN: the old file is still being written; the next scan goes on
        if rotation is Rotation.GONE:
            await self._read_available(f)
            f.close()
            log.info("log_gone", path=f.path)
            del self.followers[f.path]
            return
        self.stats["rotations"] += 1
        log.info("log_rotated", path=f.path)
        f.line = 0
        await self._read_available(f)

    @staticmethod
    def _rotation(f: _Log) -> Rotation:
        try:
            return f.file.check_rotation()
        except OSError:  # a new file we cannot open: forget it, like a deleted one
            return Rotation.GONE

    async def _read_available(self, f: _Log) -> None:
        chunks = 0
        while True:
            cut_before = f.file.cut_lines
            try:
                lines = f.file.read()
            except OSError:
                return
            if lines is None:
                return
            self.stats["long_lines"] += f.file.cut_lines - cut_before
            f.last_growth = self._clock()
            if f.stale_reported:
                f.stale_reported = False
                log.info("log_growing_again", path=f.path)
            for raw, end in lines:
                if f.line is not None:
                    f.line += 1
                await self._line(f, raw, end)
            chunks += 1
            if chunks % 16 == 0:
                await asyncio.sleep(0)  # a flood must not starve the agent's other tasks

    async def _line(self, f: _Log, raw: bytes, end: int) -> None:
        self.stats["lines"] += 1
        if b"\0" in raw:
            self.stats["binary_lines"] += 1
            raw = raw.replace(b"\0", b"")
        text = raw.decode("utf-8", errors="replace")
        lowered = text.lower()  # once per line, for the patterns' needles
        for pattern in self.patterns:
            if pattern.search(text, lowered):
                await self._match(f, pattern, text, end)
                break  # one event per line: the table is ordered most specific first

    async def _match(self, f: _Log, pattern: LogPattern, text: str, end: int) -> None:
        self.stats["matches"] += 1
        key = (f.path, pattern.name)
        now = self._clock()
        last = self._last_emit.get(key)
        if last is not None and now - last < self.cfg.rate_limit_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            self.stats["suppressed"] += 1
            return
        self._last_emit[key] = now
        data = {
            "file": f.path,
            "line": f.line,
            "offset": end,
            "pattern": pattern.name,
            "text": text[:_TEXT_MAX],
            "suppressed": self._suppressed.pop(key, 0),
        }
        if pattern.xid is not None:
            data["xid"] = pattern.xid  # the Xid this line reports (rule xid_catalog decides it so)
        peer = parse_peer_error(text)
        if peer is not None:
            data["peer_address"] = peer  # the other end this line blames (issue #33: peer naming)
        event = make_event(self.node, pattern.kind, severity=pattern.severity, source="logs", data=data)
        await self._emit(event)

    async def _check_stale(self, now: float) -> None:
        stale = self.cfg.stale_after_s
        if stale is None:
            return
        for f in self.followers.values():
            idle = now - f.last_growth
            if not f.stale_reported and idle >= stale:
                f.stale_reported = True
                data = {
                    "file": f.path,
                    "idle_s": round(idle, 1),
                    "stale_after_s": stale,
                    "offset": f.file.position,
                }
                event = make_event(
                    self.node, Kind.LOG_STALE, severity=Severity.WARNING, source="logs", data=data
                )
                await self._emit(event)
