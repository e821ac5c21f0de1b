"""Whose process a pid is: the registered ranks, and the ranks that left a short while ago.

What: :class:`RankOwners`, pid -> (job, rank) of the ranks registered with the local API, plus a
bounded memory of the ranks whose connection closed within the last ``keep_s`` seconds.

Why the memory: a rank that segfaults dies, and its socket closes, right after the kernel printed the
``segfault at`` line naming its pid. The agent sees the closed connection at once; the kernel-log
watcher may read the line later (it polls a file, falls behind in a storm of lines, or simply comes
second in the same turn of the event loop). Without the memory that event would carry no job and the
coordinator's ``host`` rule could not take the application-fault path for it (issue #31). A pid the
kernel hands to another process within ``keep_s`` is still named as the rank's: pids are reused only
after the whole pid space went round, and the answer is only a hint the rules weigh.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

__all__ = ["Owner", "RankOwners"]

Owner = tuple[str, int]
"""The (job, rank) of a trainer rank."""


class RankOwners:
    """The owner of a pid among the live ranks (read through ``live``) and those that left lately."""

    def __init__(
        self,
        live: Callable[[], Iterable[tuple[int, Owner]]],
        *,
        keep_s: float = 300.0,
        max_kept: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._live = live
        self._keep_s = keep_s
        self._max_kept = max_kept
        self._clock = clock
        self._left: OrderedDict[int, tuple[Owner, float]] = OrderedDict()  # pid -> owner, when it left

    def left(self, pid: int | None, owner: Owner) -> None:
        """The rank ``owner`` with process ``pid`` left (its connection closed)."""
        if pid is None:
            return
        self._left.pop(pid, None)
        self._left[pid] = (owner, self._clock())
        while len(self._left) > self._max_kept:
            self._left.popitem(last=False)

    def owner(self, pid: int) -> Owner | None:
        """(job, rank) of the live rank with ``pid``, else of the one that left within ``keep_s``."""
        for live_pid, owner in self._live():
            if live_pid == pid:
                return owner
        self._expire()
        kept = self._left.get(pid)
        return kept[0] if kept is not None else None

    def _expire(self) -> None:
        oldest = self._clock() - self._keep_s
        while self._left:
            pid, (_, at) = next(iter(self._left.items()))
            if at >= oldest:
                return
            del self._left[pid]
