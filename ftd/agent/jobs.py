"""Jobs the scheduler's own hooks report on this node: Slurm's Prolog and Epilog (``deploy/slurm``).

What: the Prolog (``ftd slurm prolog``, run as root by slurmd when a job starts on the node) sends
``job_start`` over the agent's local socket with what Slurm tells it (job id, user, GPUs from
``SLURM_JOB_GPUS`` / ``CUDA_VISIBLE_DEVICES``, tasks, partition); the Epilog sends ``job_end`` with
the job's processes still alive (:mod:`ftd.commands.slurm_hooks`). :class:`SchedulerJobs` keeps the
running ones (saved in ``state_dir``, so an agent restart still knows them) and the agent publishes
each as the ``allocation`` of the job's retained presence, beside the ranks registered through the
client: the coordinator then knows every job and where it runs even when no trainer registers
(:meth:`ftd.coordinator.model.state.ClusterState.apply_presence`), and a job without the client can be
moved (:mod:`ftd.coordinator.actions.slurm_signal`).

An Epilog that cannot reach the agent (down, restarting) leaves the job's id as an empty file in
``{state_dir}/ended-jobs/``; the agent ends those jobs when it starts and on each health round
(:meth:`SchedulerJobs.ended_while_away`), so a missed Epilog does not leave a finished job "running"
on the node (it would be signalled or requeued again on the next fault there).

Who may send them: only root or the agent's own uid (the local API checks the peer's credentials;
:mod:`ftd.agent.peer`). A training process cannot invent or end a job.

The message structs of these hook operations (and of the ``conditions`` / ``preflight`` queries of
``ftd health`` and ``ftd preflight``) live here and join the local API's decoder
(:mod:`ftd.agent.local_api`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Annotated

import msgspec

from ftd.client import protocol
from ftd.client.protocol import PROTOCOL_VERSION
from ftd.events import Event, JobAllocation, Kind, Severity, make_event
from ftd.fileio import write_atomic
from ftd.logs import get_logger

log = get_logger(__name__)

MAX_JOBS = 4096
ENDED_JOBS_DIR = "ended-jobs"
"""Under ``state_dir``: one empty file per job whose Epilog could not reach the agent."""
MAX_LEFTOVER = 256

JobName = Annotated[
    str, msgspec.Meta(min_length=1, max_length=protocol.JOB_MAX, pattern=protocol.JOB_PATTERN)
]
ShortText = Annotated[str, msgspec.Meta(max_length=256)]


class JobStartMsg(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag=protocol.JOB_START):
    v: int = PROTOCOL_VERSION
    job: JobName
    user: ShortText = ""
    uid: Annotated[int, msgspec.Meta(ge=0)] | None = None
    gpus: Annotated[list[Annotated[str, msgspec.Meta(max_length=64)]], msgspec.Meta(max_length=1024)] = (
        msgspec.field(default_factory=list)
    )
    tasks: Annotated[int, msgspec.Meta(ge=0)] | None = None
    partition: ShortText = ""


class LeftoverProc(msgspec.Struct, frozen=True, kw_only=True):
    pid: Annotated[int, msgspec.Meta(gt=0)]
    name: ShortText = ""
    uid: int | None = None
    gpu: ShortText | None = None  # set when the process holds a GPU (nvidia-smi's compute apps)


class JobEndMsg(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag=protocol.JOB_END):
    v: int = PROTOCOL_VERSION
    job: JobName
    leftover: Annotated[list[LeftoverProc], msgspec.Meta(max_length=MAX_LEFTOVER)] = msgspec.field(
        default_factory=list
    )


class ConditionsMsg(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag=protocol.CONDITIONS):
    v: int = PROTOCOL_VERSION


class PreflightMsg(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag=protocol.PREFLIGHT):
    v: int = PROTOCOL_VERSION


HookMsg = JobStartMsg | JobEndMsg | ConditionsMsg | PreflightMsg
PRIVILEGED = (JobStartMsg, JobEndMsg, PreflightMsg)
"""Hook operations only root or the agent's own uid may send."""


def leftover_event(node: str, msg: JobEndMsg) -> Event:
    """The ``job_leftover`` event of an Epilog that found the job's processes still alive: an error
    when one holds a GPU (the next job there fails or runs beside it), else a warning."""
    gpu_pids = [p.pid for p in msg.leftover if p.gpu is not None]
    return make_event(
        node,
        Kind.JOB_LEFTOVER,
        severity=Severity.ERROR if gpu_pids else Severity.WARNING,
        source="epilog",
        data={
            "job": msg.job,
            "pids": [p.pid for p in msg.leftover],
            "gpu_pids": gpu_pids,
            "processes": [msgspec.to_builtins(p) for p in msg.leftover[:32]],
            "count": len(msg.leftover),
        },
    )


class SchedulerJobs:
    """The jobs the Prolog reported running on this node (until their Epilog), saved at ``path``."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._jobs: dict[str, JobAllocation] = {}
        self._load()

    def _load(self) -> None:
        if self.path is None:
            return
        try:
            raw = json.loads(self.path.read_text())
            for job, alloc in dict(raw).items():
                self._jobs[str(job)] = msgspec.convert(alloc, JobAllocation)
        except FileNotFoundError:
            return
        except (OSError, ValueError, TypeError, msgspec.ValidationError) as exc:
            log.warning("scheduler_jobs_unreadable", path=str(self.path), error=str(exc)[:200])

    def _save(self) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # No fsync: the list only has to outlive the agent; a power cut ends the jobs with it.
            write_atomic(self.path, msgspec.json.encode(self._jobs), fsync=False)
        except OSError as exc:
            log.warning("scheduler_jobs_not_saved", path=str(self.path), error=str(exc)[:200])

    def start(self, msg: JobStartMsg) -> JobAllocation:
        alloc = JobAllocation(
            source="prolog",
            user=msg.user,
            uid=msg.uid,
            gpus=list(msg.gpus),
            tasks=msg.tasks,
            partition=msg.partition,
            started=time.time(),
        )
        if msg.job not in self._jobs and len(self._jobs) >= MAX_JOBS:
            oldest = min(self._jobs, key=lambda j: self._jobs[j].started)
            log.warning("scheduler_jobs_full_dropping_oldest", dropped=oldest)
            del self._jobs[oldest]
        self._jobs[msg.job] = alloc
        self._save()
        log.info("job_started_here", job=msg.job, user=msg.user, gpus=msg.gpus, tasks=msg.tasks)
        return alloc

    def end(self, job: str) -> JobAllocation | None:
        alloc = self._jobs.pop(job, None)
        if alloc is not None:
            self._save()
        log.info("job_ended_here", job=job, known=alloc is not None)
        return alloc

    def ended_while_away(self, spool: Path) -> list[str]:
        """Jobs whose Epilog could not reach the agent (it left ``{spool}/{job}``, see
        :mod:`ftd.commands.slurm_hooks`): end them here and remove their files. Returns them."""
        try:
            names = sorted(os.listdir(spool))
        except OSError:
            return []
        ended = []
        for name in names:
            with contextlib.suppress(OSError):
                os.unlink(spool / name)
            if name in self._jobs:
                self.end(name)
                ended.append(name)
        return ended

    def get(self, job: str) -> JobAllocation | None:
        return self._jobs.get(job)

    def all(self) -> dict[str, JobAllocation]:
        return dict(self._jobs)


__all__ = [
    "ENDED_JOBS_DIR",
    "PRIVILEGED",
    "ConditionsMsg",
    "HookMsg",
    "JobEndMsg",
    "JobStartMsg",
    "LeftoverProc",
    "PreflightMsg",
    "SchedulerJobs",
    "leftover_event",
]
