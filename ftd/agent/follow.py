"""Follow one regular file by path, like ``tail -F``: the bookkeeping both file-reading watchers share.

Used by the kernel-log watcher (``kern.log`` instead of ``/dev/kmsg``) and the training-log watcher.
A :class:`FileFollower` reads new bytes from the file it has open and hands back complete lines,
each with the byte offset just past its newline; an incomplete last line waits for its newline.

* **Truncation** (``copytruncate``): :meth:`FileFollower.check_truncation` notices the file is
  shorter than what was read and restarts at 0.
* **Rotation** (a new file at ``path``): :meth:`FileFollower.check_rotation` says whether ``path``
  still names the open file; when it names another one, the old file is drained first (``DRAIN``
  while it still has unread bytes), then the new one is followed from its start (``SWITCHED``).
* **Long lines**: with ``max_line``, a line keeps its first ``max_line`` bytes and the rest is
  dropped up to its newline, never buffered (``cut_lines`` counts them).

Why only this much: the watchers differ in everything around it, so that stays with them: when to
look again (kmsg polls every 25 ms, logs wake on inotify), what a vanished path means (kmsg waits
for the file to come back, logs forget it), where to start (a persisted offset, the end, the
start), line numbers, what is logged and counted, and yielding to the event loop.

Synchronous and non-blocking on regular files: a read returns at once with what is there.
"""

from __future__ import annotations

import enum
import operator
import os
from itertools import accumulate, count

__all__ = ["FileFollower", "Rotation"]


class Rotation(enum.Enum):
    """What :meth:`FileFollower.check_rotation` found at ``path``."""

    SAME = "same"  # path still names the open file
    DRAIN = "drain"  # path names another file; the open one still has unread bytes: read them first
    SWITCHED = "switched"  # the old file is closed; the new one is open at its start
    GONE = "gone"  # nothing at path (rotated away and not recreated yet, or deleted)


class FileFollower:
    """Byte-offset bookkeeping for one followed file: complete lines only, truncation and rotation."""

    def __init__(self, path: str, *, chunk: int = 1 << 16, max_line: int | None = None) -> None:
        self.path = path
        self.chunk = chunk  # bytes per read()
        self.max_line = max_line
        self.fd = -1
        self.inode = 0
        self.offset = 0  # byte offset just past the last complete line returned
        self.position = 0  # bytes read so far: offset plus the incomplete line's bytes (dropped ones too)
        self.partial = bytearray()  # the incomplete line read so far (at most max_line bytes)
        self.skipping = False  # inside an over-long line: drop bytes until its newline
        self.cut_lines = 0  # lines cut at max_line, over this follower's life

    def open(self) -> None:
        """Open ``path`` at its start. Raises :class:`OSError` (``FileNotFoundError`` ...)."""
        self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        self.inode = os.fstat(self.fd).st_ino
        self._restart(0)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def seek(self, offset: int) -> None:
        """Read on from ``offset`` (a line start), forgetting any incomplete line."""
        os.lseek(self.fd, offset, os.SEEK_SET)
        self._restart(offset)

    def _restart(self, offset: int) -> None:
        self.offset = self.position = offset
        self.partial.clear()
        self.skipping = False

    def check_truncation(self) -> bool:
        """If the file is now shorter than what was read, restart at 0 and return True."""
        if self.fd < 0 or self.size() >= self.position:
            return False
        self.seek(0)
        return True

    def read(self) -> list[tuple[bytes, int]] | None:
        """Read up to ``chunk`` bytes: the lines they complete (without the newline), each with the
        offset just past it. ``[]``: bytes came but no line ended; ``None``: nothing new (or no file)."""
        if self.fd < 0:
            return None
        chunk = os.read(self.fd, self.chunk)
        if not chunk:
            return None
        base = self.position
        self.position += len(chunk)
        parts = chunk.split(b"\n")
        rest = parts.pop()  # after the last newline: the start of an incomplete line (maybe empty)
        lines: list[tuple[bytes, int]] = []
        if parts:
            if self.partial or self.skipping:  # the first line began in an earlier read
                self._take(parts[0])
                first = bytes(self.partial)
                self.partial.clear()
                self.skipping = False
                lines.append((first, base + len(parts[0]) + 1))
                base += len(parts[0]) + 1
                del parts[0]
            # Offsets without a Python-level loop (a storm is read at several hundred thousand lines
            # a second): the end of line i is base + (lengths of lines 0..i) + (i + 1) newlines.
            ends = map(operator.add, accumulate(map(len, parts)), count(base + 1))
            if self.max_line is not None and parts and max(map(len, parts)) > self.max_line:
                parts = [self._cut(part) for part in parts]
            lines.extend(zip(parts, ends, strict=True))
            self.offset = self.position - len(rest)
        self._take(rest)
        return lines

    def _cut(self, line: bytes) -> bytes:
        if self.max_line is not None and len(line) > self.max_line:
            self.cut_lines += 1
            return line[: self.max_line]
        return line

    def _take(self, piece: bytes) -> None:
        """Add ``piece`` to the incomplete line, up to ``max_line`` bytes."""
        if self.skipping or not piece:
            return
        if self.max_line is not None:
            room = self.max_line - len(self.partial)
            if len(piece) > room:
                self.partial += piece[:room]
                self.skipping = True
                self.cut_lines += 1
                return
        self.partial += piece

    def check_rotation(self) -> Rotation:
        """Does ``path`` still name the open file? If it names another one and the open file has
        been read to its end, switch to the new file (from its start). Call it after reading up to
        EOF. Raises :class:`OSError` other than ``FileNotFoundError`` (e.g. the new file is not
        readable)."""
        try:
            current = os.stat(self.path).st_ino
        except FileNotFoundError:
            return Rotation.GONE
        if current == self.inode and self.fd >= 0:
            return Rotation.SAME
        if self.fd >= 0 and self.size() > self.position:
            return Rotation.DRAIN  # written before the rename: read it before switching
        self.close()
        try:
            self.open()
        except FileNotFoundError:
            return Rotation.GONE
        return Rotation.SWITCHED
