"""How long each running job has left before its scheduler time limit, for the cost models that weigh
a job's remaining time (the ``straggler`` rule's: is swapping a slow node worth it?).

What: :meth:`JobTimeLeft.remaining` answers from a cache, never waiting on the scheduler; a job seen
for the first time, or whose answer is older than ``max_age_s``, is looked up in the background
(:meth:`JobTimeLeft.want`: one lookup per job at a time, through the scheduler's ``job_info``; Slurm:
``TimeLimit`` minus ``RunTime`` of ``scontrol show job``). Between lookups the answer counts down with
the clock. None -- no scheduler, no limit, a lookup that failed or has not come back -- means the caller
uses its configured assumption and says so.

Why a cache: presences arrive many times a second; a scheduler call per presence would load
slurmctld, and a rule must never wait on one. Memory is bounded by ``max_jobs`` (the least recently
wanted forgotten).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable

from ftd.coordinator.actions.scheduler import Scheduler, SchedulerError
from ftd.logs import get_logger

__all__ = ["JobTimeLeft"]

log = get_logger(__name__)


class JobTimeLeft:
    """Each job's time left before its limit, as the scheduler last said, counted down since."""

    def __init__(
        self,
        scheduler: Scheduler | None,
        *,
        max_age_s: float = 60.0,
        max_jobs: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scheduler = scheduler
        self.max_age_s = max_age_s
        self.max_jobs = max_jobs
        self._clock = clock
        self._known: OrderedDict[str, tuple[float, float | None]] = OrderedDict()  # job -> (when, left)
        self._asking: dict[str, asyncio.Task[None]] = {}

    def remaining(self, job: str) -> float | None:
        """Seconds ``job`` has left (never below 0), or None when the scheduler has not said."""
        known = self._known.get(job)
        if known is None:
            return None
        when, left = known
        return None if left is None else max(0.0, left - (self._clock() - when))

    def want(self, job: str) -> None:
        """Look ``job`` up in the background when its answer is missing or older than ``max_age_s``."""
        if self.scheduler is None or job in self._asking:
            return
        known = self._known.get(job)
        if known is not None:
            self._known.move_to_end(job)
            if self._clock() - known[0] < self.max_age_s:
                return
        task = asyncio.get_running_loop().create_task(self._ask(job), name=f"time-left-{job}")
        self._asking[job] = task
        task.add_done_callback(lambda _done: self._asking.pop(job, None))

    async def _ask(self, job: str) -> None:
        assert self.scheduler is not None
        try:
            info = await self.scheduler.job_info(job)
        except (TimeoutError, SchedulerError, OSError) as exc:
            log.info("job_time_left_unknown", job=job, why=str(exc)[:200])
            self._store(job, None)
            return
        self._store(job, info.time_left_s)

    def _store(self, job: str, left: float | None) -> None:
        self._known[job] = (self._clock(), left)
        self._known.move_to_end(job)
        while len(self._known) > self.max_jobs:
            self._known.popitem(last=False)

    def forget(self, job: str) -> None:
        self._known.pop(job, None)

    async def close(self) -> None:
        tasks = list(self._asking.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
