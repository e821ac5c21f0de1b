"""The spool file itself: append, replay, truncate, compact, quarantine.

What: :class:`SpoolFile`, the on-disk half of the :class:`~ftd.agent.spool.Outbox` (the format is
:mod:`ftd.agent.spool.records`). Appends are one ``os.write`` to the page cache (plus
``fdatasync`` with ``fsync``); a rewrite (compaction, recovery, a damaged or old-format file) goes
through a temp file and a rename, flushed to disk. Why apart: this is where storage faults happen,
and the rule for them is local: a failed append (``ENOSPC``, ``EDQUOT``, ``EIO``, or a short write
that cannot be finished) is cut back with ``ftruncate`` to the last whole record, so no torn record
is left to look like corruption, and the error is raised for the outbox to go memory-only.

A damaged file found at start is renamed aside to ``<name>.corrupt-<unix time>`` (kept for
inspection and reported as a :class:`~ftd.agent.spool.records.SpoolDamage`), and a fresh file holding
the salvaged entries replaces it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from pathlib import Path

from ftd.agent.spool.records import MAGIC, Entry, SpoolDamage, put_record, scan_spool
from ftd.fileio import write_atomic
from ftd.logs import get_logger

log = get_logger(__name__)

__all__ = ["SpoolFile"]


class SpoolFile:
    """The on-disk half of the outbox: append, replay, truncate, compact, quarantine.

    Any :class:`OSError` from writing leaves the file as it was before the failed call (a partial
    append is cut back) and the descriptor closed; :meth:`restore` starts again from scratch.
    """

    def __init__(self, path: Path, *, fsync: bool, compact_bytes: int) -> None:
        self.path = path
        self.fsync = fsync
        self.compact_bytes = compact_bytes
        self.damage: list[SpoolDamage] = []
        self.size = 0
        self._fd = -1

    def load(self) -> tuple[list[Entry], int, bool]:
        """Replay the existing file, quarantining it if damaged: (live entries, next seq, whether
        it must be rewritten before appending). Raises :class:`OSError` if it cannot be read."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        scan = scan_spool(data)
        if scan.damaged:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            os.replace(self.path, aside)
            damage = SpoolDamage(
                str(aside),
                scan.problem or "",
                len(scan.entries),
                scan.records,
                scan.skipped_bytes,
                scan.regions,
            )
            self.damage.append(damage)
            log.error(
                "spool_damaged_quarantined",
                path=str(self.path),
                moved_to=damage.quarantined,
                problem=damage.problem,
                salvaged=damage.salvaged,
                records=damage.records,
                skipped_bytes=damage.skipped_bytes,
            )
        rewrite = scan.damaged or scan.version != 2 or not data or len(data) > self.compact_bytes
        return scan.entries, scan.top + 1, rewrite

    def restore(self, entries: list[Entry], *, rewrite: bool = True) -> None:
        """(Re)start appending; with ``rewrite``, to a fresh file holding only ``entries``."""
        self.close()
        if rewrite:
            records = [put_record(e) for e in entries]
            need = len(MAGIC) + sum(len(r) for r in records)
            disk = os.statvfs(self.path.parent)
            if disk.f_bavail * disk.f_frsize < need:
                raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: the spool needs {need} bytes")
            self._rewrite(records)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.size = os.fstat(self._fd).st_size

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1

    def append(self, record: bytes) -> None:
        """Write ``record`` whole (a short write is continued), or cut the file back and raise."""
        if self._fd < 0:
            raise OSError(errno.EBADF, "spool file not open")
        view = memoryview(record)
        try:
            while view:
                written = os.write(self._fd, view)
                if written <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                view = view[written:]
            if self.fsync:
                os.fdatasync(self._fd)
        except OSError:
            self._cut_back()
            raise
        self.size += len(record)

    def _cut_back(self) -> None:
        """Undo a partial append: truncate to the last whole record (shrinking needs no space)."""
        try:
            os.ftruncate(self._fd, self.size)
        except OSError as exc:  # the next restore() rewrites the file; a restart resynchronises
            log.error("spool_cut_back_failed", path=str(self.path), size=self.size, error=str(exc))
        self.close()

    def truncate(self) -> None:
        try:
            os.ftruncate(self._fd, len(MAGIC))
        except OSError:
            self.close()
            raise
        self.size = len(MAGIC)

    def _rewrite(self, records: list[bytes]) -> None:
        # Always flushed (file, then directory), whatever ``fsync`` says for appends: a rewrite is
        # rare and replaces every entry at once, so a power cut must not find it half written.
        write_atomic(self.path, MAGIC + b"".join(records), fsync=True)

    def compact(self, entries: list[Entry]) -> None:
        self.restore(entries)
