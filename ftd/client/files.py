"""The small files the trainer client reads and writes: the resume file, ``/proc`` and cgroup files.

What: :func:`read_text` (a file's text, None when unreadable), :func:`read_step` and
:func:`write_step` (the resume file, :attr:`ftd.client.Client.resume_step`). Why here: the
client is standard library only, so it keeps its own atomic write (temp file, rename: a restarted
rank never reads half a number) instead of the daemons' ``ftd.fileio``; every call is fail-open.
"""

from __future__ import annotations

import logging
import os

__all__ = ["read_step", "read_text", "write_step"]

_log = logging.getLogger("ftd.client")


def read_text(path: str) -> str | None:
    """The text of ``path``, or None when it cannot be read."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def read_step(path: str) -> int | None:
    """The step in a resume file; None when there is none (absent, unreadable, not an integer)."""
    text = read_text(path)
    try:
        return int(text.strip()) if text else None
    except ValueError:
        _log.warning("ftd client: ignoring resume file %s: not a step number", path)
        return None


def write_step(path: str, step: int) -> None:
    """Write the resume file atomically (a restarted rank never reads half a number); fail-open."""
    try:
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(f"{step}\n")
        os.replace(tmp, path)
    except OSError:
        _log.warning("ftd client: could not write the resume file %s", path, exc_info=True)
