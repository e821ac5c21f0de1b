"""Job presence for the coordinator, reported by the local API: at once when a rank registers or
leaves, and step progress at most once per :data:`PRESENCE_MIN_INTERVAL_S` per job.

Why throttled: a rank reports its step with every heartbeat (many a second on a fast loop), and the
coordinator needs the step only to know a job trains and where it would resume; the retained
presence message is re-published per job, so one a second is plenty. It sleeps until a step moves:
no wake-ups at all on an idle node.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ftd.events import RankInfo

PRESENCE_MIN_INTERVAL_S = 1.0


class PresenceReports:
    """When to report a job's presence: ``ranks(job)`` reads its ranks, ``hosted(job)`` says whether
    it still has any here, ``report(job, ranks)`` sends it (queued by the local API)."""

    def __init__(
        self,
        ranks: Callable[[str], list[RankInfo]],
        hosted: Callable[[str], bool],
        report: Callable[[str, list[RankInfo]], None],
    ) -> None:
        self._ranks, self._hosted, self._report = ranks, hosted, report
        self._dirty: set[str] = set()
        self._progress = asyncio.Event()  # set when a step moved (a job became dirty)
        self._last: dict[str, float] = {}

    def now(self, job: str) -> None:
        """Report ``job`` at once (a rank registered or left)."""
        ranks = self._ranks(job)
        self._dirty.discard(job)
        self._last[job] = time.monotonic()
        if not ranks:
            self._last.pop(job, None)
        self._report(job, ranks)

    def moved(self, job: str) -> None:
        """A rank of ``job`` reported a new step: reported within the throttle."""
        self._dirty.add(job)
        self._progress.set()

    async def run(self) -> None:
        """Report step progress until cancelled: at most once per interval per job."""
        while True:
            await self._progress.wait()
            await asyncio.sleep(0.2)
            self._progress.clear()
            now = time.monotonic()
            for job in list(self._dirty):
                if not self._hosted(job):
                    self._dirty.discard(job)
                elif now - self._last.get(job, 0.0) >= PRESENCE_MIN_INTERVAL_S:
                    self.now(job)
            if self._dirty:
                self._progress.set()  # a job still waits for its slot
