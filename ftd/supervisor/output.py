"""Every rank's output with its node and rank in front of each line (issue #33).

What: :func:`pump` copies one rank's stdout or stderr, line by line, to the supervisor's own, each line
prefixed ``[node-3 rank 12] ``, from a daemon thread that ends when the rank closes the pipe. Why:
``srun`` merges every task's output into one stream, and a hang or an NCCL error printed by one of
thousands of ranks is only evidence when it says which one printed it ("Connect to ... failed" from
rank 12 on node-3 blames a peer of node-3). Lines are written whole under one lock per stream, so two
ranks never interleave inside a line; a line longer than :data:`MAX_LINE` bytes is cut into pieces,
each prefixed. A warm interpreter (``--warm``) is pumped from its start, under ``[node warm] `` until
the supervisor gives it its rank (:class:`Prefix`). Standard library only (``ftd run`` ships in the
trainer-only wheel).
"""

from __future__ import annotations

import contextlib
import sys
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, BinaryIO

__all__ = ["MAX_LINE", "Prefix", "label", "pump"]

MAX_LINE = 64 * 1024
_LOCKS: dict[int, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def label(node: str, rank: str) -> bytes:
    """The prefix of one rank's lines: ``[node rank R] ``."""
    return f"[{node} rank {rank}] ".encode(errors="replace")


class Prefix:
    """A prefix that may change while its pump runs: a warm interpreter's lines (its imports') say
    ``[node warm] `` until it is given its rank, then ``[node rank R] ``."""

    def __init__(self, value: bytes) -> None:
        self.value = value  # replaced whole (one assignment): a line gets the old or the new one


def warm_label(node: str) -> bytes:
    """The prefix of a warm interpreter's lines before it has a rank: ``[node warm] ``."""
    return f"[{node} warm] ".encode(errors="replace")


def _lock_for(sink: BinaryIO) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(id(sink), threading.Lock())


def _copy(prefix: bytes | Prefix, source: IO[bytes], sink: BinaryIO) -> None:
    lock = _lock_for(sink)
    try:
        while True:
            line = source.readline(MAX_LINE)
            if not line:
                return
            if not line.endswith(b"\n"):
                line += b"\n"  # a cut line, or the last one without its newline
            head = prefix.value if isinstance(prefix, Prefix) else prefix
            with lock:
                try:
                    sink.write(head + line)
                    sink.flush()
                except (OSError, ValueError):  # our own output is gone: keep draining the rank's pipe
                    pass
    finally:
        with contextlib.suppress(OSError):
            source.close()


def pump(prefix: bytes | Prefix, source: IO[bytes], sink: BinaryIO | None = None) -> threading.Thread:
    """Copy ``source`` (a rank's pipe) to ``sink`` (default: this process's stdout) with ``prefix``
    (its value at each line, for a :class:`Prefix`) before every line, in a daemon thread; returns the
    thread."""
    out = sink if sink is not None else sys.stdout.buffer
    thread = threading.Thread(target=_copy, args=(prefix, source, out), name="ftd-run-output", daemon=True)
    thread.start()
    return thread
