"""Replacing a file's content all at once: :func:`write_atomic`.

What: the one way the daemons rewrite a small state file (the agent's job list, its condition book,
the spool when it is compacted, the kmsg position). The data goes to a temporary file next to the
target (same directory, hence same filesystem) which is then renamed over it, so a reader, or the
next process after a kill, sees the old content or the new one, never half of it.

Why one helper: the copies had drifted (some fsynced the file, one also the directory, some
neither). The caller states the durability it needs with ``fsync``: ``True`` for data that must
survive a power cut (file flushed before the rename, directory flushed after it, so the rename
itself is on disk); ``False`` for data that only has to survive the process (the page cache keeps
it), which costs no disk flush.

A ground-floor module: standard library only, imported by anything in ``ftd`` and importing nothing
of it. (The trainer client keeps its own copy: it must not import anything outside ``ftd.client``.)
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, fsync: bool, mode: int = 0o666) -> None:
    """Replace ``path``'s content with ``data`` (``str`` is written as UTF-8) in one rename.

    The temporary file is ``.<name>.tmp`` in the same directory, created with ``mode`` (less the
    umask); on any error it is removed and the error raised, leaving ``path`` as it was. With
    ``fsync`` the file is flushed to disk before the rename and its directory after it. The
    directory must exist (:class:`FileNotFoundError` otherwise).
    """
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp")
    payload = data.encode() if isinstance(data, str) else data
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if fsync:
        _fsync_directory(target.parent)


def _fsync_directory(directory: Path) -> None:
    """Flush a directory's entries (a rename in it) to disk."""
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
