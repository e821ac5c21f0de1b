"""Announced interruptions the batch scheduler knows about a running job (issue #37, Slurm): the job
is being preempted, its time limit is near, or a maintenance reservation takes its nodes before it
ends. Each becomes one ``Kind.INTERRUPTION`` event whose data is an :class:`~ftd.events.Interruption`,
so the decision against the deadline has one input whatever announced it.

What: :func:`interruptions_of` and :func:`maintenance_of` are the pure part: from one
:class:`JobInfo` (Slurm: ``scontrol show job``'s ``PreemptTime`` and ``EndTime``, read by
:mod:`ftd.coordinator.actions.slurm`, the one scontrol parser), the reservations and the clock, the
interruptions that hold now, each with a stable ``ref`` so a notice seen on every poll is one
interruption. :class:`SchedulerInterruptions` is the poller: the jobs the coordinator sees running are
:meth:`~SchedulerInterruptions.watch`-ed; every ``interval_s`` the reservations are listed once
(``scontrol show reservation``) and the jobs are looked up one at a time through the scheduler seam
(never more than one ``scontrol`` in flight; rules and message handlers never wait on it), and each
new interruption is handed to ``emit`` once. A scheduler that reads its job's pods (Kubernetes:
``job_interruptions``, a pod being deleted or carrying ``DisruptionTarget``) is asked the same way.
With ``every_job`` the poller also watches every running job the scheduler lists (Slurm:
``running_job_nodes``), so jobs without the client are announced too. Failed lookups are counted
and logged; a job stays
watched until ``max_failures`` in a row (a job purged from slurmctld after ``MinJobAge`` is "Invalid
job id" for ever); a job the scheduler no longer shows running is dropped.

Why the deadline is what it is (checked on Slurm 22.05, ``PreemptType=preempt/partition_prio``,
``PreemptMode=REQUEUE``, partition ``GraceTime=20``): when a job is chosen for preemption slurmctld sets
``PreemptTime`` and rewrites the job's ``EndTime`` to ``PreemptTime + GraceTime``; the job stays
RUNNING until then. So a preempted job's deadline is its ``EndTime`` as shown (``preempt_grace_s``
from the configuration only where ``EndTime`` is missing), and while ``PreemptTime`` is set the
``EndTime`` is the preemption's, not a time limit's. A job at its limit gets SIGTERM at ``EndTime``
and SIGKILL ``KillWait`` later (``kill_wait_s``). See docs/deadlines.md "Slurm".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec

from ftd.coordinator.actions.scheduler import JobInfo, Reservation, Scheduler, SchedulerError
from ftd.events import Event, Interruption, Kind, Severity
from ftd.logs import get_logger

__all__ = [
    "InterruptionPolicy",
    "SchedulerInterruptions",
    "interruption_event",
    "interruptions_of",
    "maintenance_of",
]

log = get_logger(__name__)

_RUNNING = frozenset({"RUNNING", "CONFIGURING", "SUSPENDED", "SIGNALING"})


@dataclass(frozen=True, slots=True)
class InterruptionPolicy:
    """What counts as announced and how long the scheduler lets the job live after the notice."""

    time_limit_window_s: float = 180.0  # EndTime within this: a slurm_time_limit interruption
    preempt_grace_s: float = 0.0  # GraceTime, used only where the preempted job shows no EndTime
    kill_wait_s: float = 0.0  # slurm.conf KillWait: SIGTERM at EndTime, SIGKILL this much later


def interruptions_of(info: JobInfo, now: float, policy: InterruptionPolicy) -> list[Interruption]:
    """The interruptions announced for ``info``'s job at ``now`` (epoch s); empty when it is not
    running or nothing is announced. Pure."""
    if info.state not in _RUNNING:
        return []
    found: list[Interruption] = []
    if info.preempt_time is not None:
        rewritten = info.end_time is not None and info.end_time >= info.preempt_time
        found.append(
            Interruption(
                source="slurm_preempt",
                deadline=info.end_time
                if rewritten and info.end_time is not None
                else (info.preempt_time + policy.preempt_grace_s),
                notice_at=info.preempt_time,
                job=info.job,
                ref=f"slurm-preempt-{info.job}-{int(info.preempt_time)}",
                detail="EndTime (PreemptTime + GraceTime)"
                if rewritten
                else f"PreemptTime + configured GraceTime {policy.preempt_grace_s:g}s",
            )
        )
        return found  # its EndTime is now the preemption's, not a time limit's
    if info.end_time is not None and info.end_time - now <= policy.time_limit_window_s:
        found.append(
            Interruption(
                source="slurm_time_limit",
                deadline=info.end_time + policy.kill_wait_s,
                notice_at=now,
                job=info.job,
                ref=f"slurm-time-limit-{info.job}-{int(info.end_time)}",
                detail=f"EndTime + KillWait {policy.kill_wait_s:g}s",
            )
        )
    return found


def maintenance_of(info: JobInfo, reservations: list[Reservation], now: float) -> list[Interruption]:
    """The maintenance reservations (Slurm ``Flags=MAINT``) on any of the running job's nodes that
    start before the job would end (its ``EndTime``; any time for a job without one) and have not
    ended: each a ``slurm_maintenance`` interruption whose deadline is the reservation's start. Pure."""
    if info.state not in _RUNNING:
        return []
    found = []
    for r in reservations:
        if not r.maintenance or not set(r.nodes) & set(info.nodes):
            continue
        if (r.end is not None and r.end <= now) or (info.end_time is not None and r.start >= info.end_time):
            continue
        found.append(
            Interruption(
                source="slurm_maintenance",
                deadline=r.start,
                notice_at=now,
                job=info.job,
                ref=f"slurm-maint-{r.name}-{int(r.start)}-{info.job}",
                detail=f"reservation {r.name} on {','.join(sorted(set(r.nodes) & set(info.nodes)))}",
            )
        )
    return found


def interruption_event(it: Interruption, node: str, now: float) -> Event:
    """The ``Kind.INTERRUPTION`` event the coordinator feeds its rules for ``it``; ``node`` is one of
    the job's nodes (events are per node; the job is in the data)."""
    return Event(
        id=f"coordinator-{it.ref}",
        ts=now,
        node=node,
        kind=Kind.INTERRUPTION,
        severity=Severity.WARNING,
        source="coordinator",
        data=msgspec.structs.asdict(it),
    )


class SchedulerInterruptions:
    """Polls the watched jobs' scheduler records, one at a time, and emits each interruption once."""

    def __init__(
        self,
        scheduler: Scheduler | None,
        emit: Callable[[Event], Awaitable[object]],
        *,
        policy: InterruptionPolicy | None = None,
        interval_s: float = 15.0,
        max_jobs: int = 4096,
        max_failures: int = 10,
        on_running: Callable[[JobInfo], Awaitable[object]] | None = None,
        every_job: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.scheduler = scheduler
        self.emit = emit
        self.policy = policy or InterruptionPolicy()
        self.interval_s = interval_s
        self.max_jobs = max_jobs
        self.max_failures = max_failures
        self.on_running = on_running  # each running job's record, every poll (the grace audit)
        # also watch every running job the scheduler lists (jobs without the client), each poll
        self.every_job = every_job
        self._failing: dict[str, int] = {}  # job -> lookups failed in a row
        self._clock = clock
        self._watched: dict[str, str] = {}  # job -> a node it runs on
        self._seen: dict[str, set[str]] = {}  # job -> refs already emitted
        self.failures = 0  # lookups that failed (scontrol refused, timed out, could not start)

    def watch(self, job: str, node: str) -> None:
        """Look ``job`` (running on ``node``) up from the next poll on; bounded by ``max_jobs``."""
        if self.scheduler is None or job in self._watched or len(self._watched) >= self.max_jobs:
            return
        self._watched[job] = node

    def forget(self, job: str) -> None:
        self._watched.pop(job, None)
        self._seen.pop(job, None)
        self._failing.pop(job, None)

    @property
    def watched(self) -> tuple[str, ...]:
        return tuple(self._watched)

    async def poll_once(self) -> int:
        """Look every watched job up (sequentially); emit the new interruptions; their count."""
        if self.scheduler is None:
            return 0
        emitted = 0
        if self.every_job:
            await self._discover()
        reservations = await self._reservations() if self._watched else []
        for job, node in list(self._watched.items()):
            try:
                info = await self.scheduler.job_info(job)
            except (TimeoutError, SchedulerError, OSError) as exc:
                self.failures += 1
                in_a_row = self._failing[job] = self._failing.get(job, 0) + 1
                gave_up = in_a_row >= self.max_failures
                log.info(
                    "interruption_lookup_failed",
                    job=job,
                    failures=self.failures,
                    in_a_row=in_a_row,
                    decision="stop watching the job" if gave_up else "retry next poll",
                    why=str(exc)[:200],
                )
                if gave_up:
                    self.forget(job)
                continue
            self._failing.pop(job, None)
            if info.state not in _RUNNING:
                log.info("interruption_watch_ended", job=job, state=info.state)
                self.forget(job)
                continue
            if self.on_running is not None:
                await self.on_running(info)
            now = self._clock()
            seen = self._seen.setdefault(job, set())
            announced = [*interruptions_of(info, now, self.policy), *maintenance_of(info, reservations, now)]
            announced += await self._pod_interruptions(job)
            for it in announced:
                if it.ref in seen:
                    continue
                seen.add(it.ref)
                where = info.nodes[0] if info.nodes else node
                log.warning(
                    "interruption_announced",
                    job=job,
                    source=it.source,
                    deadline=it.deadline,
                    left_s=round(it.deadline - now, 1),
                    ref=it.ref,
                )
                await self.emit(interruption_event(it, where, now))
                emitted += 1
        return emitted

    async def _discover(self) -> None:
        """Watch every running job the scheduler lists (one listing: Slurm's ``scontrol show job -o``),
        not only those whose ranks an agent reported: a job without the client is saved by the signal
        convention (``coordinator.slurm.clientless``). A scheduler without a listing: nothing."""
        listing = getattr(self.scheduler, "running_job_nodes", None)
        if listing is None:
            return
        try:
            running = dict(await listing())
        except (TimeoutError, SchedulerError, OSError) as exc:
            self.failures += 1
            log.info("interruption_listing_failed", failures=self.failures, why=str(exc)[:200])
            return
        for job, nodes in running.items():
            if nodes:
                self.watch(job, nodes[0])

    async def _pod_interruptions(self, job: str) -> list[Interruption]:
        """What a scheduler that reads its job's pods announces (Kubernetes: a pod being deleted, a
        ``DisruptionTarget`` condition); none from a scheduler without it, or on a failed lookup."""
        reader = getattr(self.scheduler, "job_interruptions", None)
        if reader is None:
            return []
        try:
            return list(await reader(job))
        except (TimeoutError, SchedulerError, OSError) as exc:
            self.failures += 1
            log.info("interruption_pods_failed", job=job, failures=self.failures, why=str(exc)[:200])
            return []

    async def _reservations(self) -> list[Reservation]:
        """The scheduler's reservations, once per poll (a scheduler without them: none)."""
        listing = getattr(self.scheduler, "list_reservations", None)
        if listing is None:
            return []
        try:
            return list(await listing())
        except (TimeoutError, SchedulerError, OSError) as exc:
            self.failures += 1
            log.info("interruption_reservations_failed", failures=self.failures, why=str(exc)[:200])
            return []

    async def run(self) -> None:
        """Poll every ``interval_s`` until cancelled; a poll never overlaps the next."""
        while True:
            await self.poll_once()
            await asyncio.sleep(self.interval_s)
