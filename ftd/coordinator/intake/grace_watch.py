"""The grace audit at a job's start (issue #37 item 5): the first time the coordinator looks a running
job up, it compares what Slurm grants that job after a notice (``KillWait``; its partition's
``GraceTime`` when the partition can be preempted) with the save time, and logs one
``grace_too_short`` warning per layer too short, naming the setting to change
(:func:`ftd.coordinator.decide.grace_audit.audit_grace`).

Why here and once: the settings are the site's and change rarely; they are read at most every
``refresh_s`` (two ``scontrol`` calls), and each job is audited once, so a bad partition is named for
each job it would cost a checkpoint, not on every poll. The save time is ``save_s`` (the configured
``coordinator.save_deadline_s``) until the job's own saves are measured (``measured``: the slowest
level's p95 of the save-time model, fed by acknowledged saves and the checkpoint tier's events); the
first time a job has a measured save time it is audited once more against it (``source`` in the log
says which), so a job whose real saves outgrow a grace the configured number fitted is named too.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from ftd.coordinator.actions.scheduler import JobInfo, SchedulerError
from ftd.coordinator.decide.grace_audit import GraceFinding, SlurmGrace, audit_grace, audit_pod_grace
from ftd.logs import get_logger

__all__ = ["GraceWatch", "PodGraceWatch"]

log = get_logger(__name__)


class GraceWatch:
    """Audits each job once against the scheduler's grace settings (cached ``refresh_s``)."""

    def __init__(
        self,
        read_grace: Callable[[], Awaitable[SlurmGrace]],
        save_s: float,
        *,
        refresh_s: float = 3600.0,
        max_jobs: int = 4096,
        clock: Callable[[], float] = time.monotonic,
        measured: Callable[[str], float | None] = lambda job: None,
    ) -> None:
        self.read_grace = read_grace
        self.save_s = save_s
        self.measured = measured
        self.refresh_s = refresh_s
        self.max_jobs = max_jobs
        self._clock = clock
        self._grace: tuple[float, SlurmGrace] | None = None
        self._audited: dict[str, str] = {}  # job -> the save time it was audited with: configured|measured

    async def job_seen(self, info: JobInfo) -> list[GraceFinding]:
        """Audit ``info``'s job if it was not yet (or only against the configured save time, and its
        own saves are measured now); its findings (each also logged)."""
        measured = self.measured(info.job)
        source = "measured" if measured is not None else "configured"
        done = self._audited.get(info.job)
        if done == "measured" or (done == "configured" and source == "configured"):
            return []
        if len(self._audited) >= self.max_jobs:
            self._audited.clear()  # bounded: an old job audited again at worst
        self._audited[info.job] = source
        save_s = measured if measured is not None else self.save_s
        findings = await self._findings(info, save_s)
        for f in findings:
            log.warning(
                "grace_too_short",
                job=info.job,
                partition=info.partition,
                setting=f.setting,
                why=f.message,
                save_s=round(save_s, 3),
                source=source,
            )
        return findings

    async def _findings(self, info: JobInfo, save_s: float) -> list[GraceFinding]:
        """Slurm: KillWait and the job's partition's GraceTime (when preemptible)."""
        grace = await self._settings()
        if grace is None:
            return []
        part = grace.partitions.get(info.partition)
        mine = SlurmGrace(grace.kill_wait_s, {info.partition: part} if part is not None else {})
        return audit_grace(mine, save_s)

    async def _settings(self) -> SlurmGrace | None:
        now = self._clock()
        if self._grace is not None and now - self._grace[0] < self.refresh_s:
            return self._grace[1]
        try:
            grace = await self.read_grace()
        except (TimeoutError, SchedulerError, OSError) as exc:
            log.info("grace_settings_unknown", why=str(exc)[:200])
            return None
        self._grace = (now, grace)
        return grace


class PodGraceWatch(GraceWatch):
    """The same audit on Kubernetes: the job's pods' ``terminationGracePeriodSeconds`` (the shortest)
    against its save time; ``read_pod_grace`` is the seam's :meth:`pod_grace`."""

    def __init__(
        self,
        read_pod_grace: Callable[[str], Awaitable[float | None]],
        save_s: float,
        *,
        max_jobs: int = 4096,
        measured: Callable[[str], float | None] = lambda job: None,
    ) -> None:
        super().__init__(_no_slurm_settings, save_s, max_jobs=max_jobs, measured=measured)
        self.read_pod_grace = read_pod_grace

    async def _findings(self, info: JobInfo, save_s: float) -> list[GraceFinding]:
        try:
            grace = await self.read_pod_grace(info.job)
        except (TimeoutError, SchedulerError, OSError) as exc:
            log.info("grace_settings_unknown", job=info.job, why=str(exc)[:200])
            return []
        return [] if grace is None else audit_pod_grace(grace, save_s)


async def _no_slurm_settings() -> SlurmGrace:
    return SlurmGrace(None, {})
