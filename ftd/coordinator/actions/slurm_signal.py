"""Jobs without the client: checkpoint_restart through Slurm's own signal convention.

What: when :class:`~ftd.coordinator.actions.checkpoint_restart.CheckpointRestart` must move a job that
has no rank registered with any agent (its script does not use ``ftd.client``; the coordinator knows
it from the Slurm Prolog, :mod:`ftd.agent.jobs`), there is nobody to send ``save`` to. Slurm's
convention is a signal: ``scancel --signal=USR1 --batch JOB`` (the batch script's shell; or
``--full``: every process of the job, for jobs whose training processes trap it themselves, e.g.
PyTorch Lightning's SLURM environment) asks the job to checkpoint and requeue itself
(``scontrol requeue $SLURM_JOB_ID``) or exit. :class:`SlurmSignalFallback` sends it, then waits up to
``grace_s`` for the job to leave the RUNNING state (requeued itself: PENDING with one more restart;
or ended). The executor's requeue phase then requeues it with the bad node excluded (a job that
requeued itself only gets the exclusion; see :class:`~ftd.coordinator.actions.scheduler.Scheduler`).
A job already COMPLETED when asked (it ended well by itself) is not signalled and not requeued
(``detail["clientless"]["finished"]``): requeueing would run a finished job again; a job that
already FAILED is requeued without the node (it may have failed because of it).

A job still running after the grace period ignored the signal: the action is *escalated* (detail
``signal_ignored``) and the requeue phase requeues it anyway (``scontrol requeue`` kills it: what a
job without a checkpoint of its own loses is what it would lose on the bad node).

Which flag: ``coordinator.slurm.clientless.mode`` (``batch`` or ``full``), overridden per partition
by ``partition_modes`` (the job's partition is read from ``scontrol show job``).

Why here and not in the Slurm scheduler: the signal is Slurm-only, the scheduler seam stays the
same for Kubernetes (whose ``stop`` is the pod's SIGTERM), and the executor stays scheduler-neutral.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from ftd.coordinator.actions.scheduler import SchedulerError
from ftd.coordinator.actions.slurm import parse_oneliner, run_command
from ftd.logs import get_logger
from ftd.plugin.actions import ActionState

log = get_logger(__name__)

MODES = ("batch", "full")
_RUNNING = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED"})


class ClientlessFallback(Protocol):
    """What checkpoint_restart calls for a job with no registered rank."""

    async def save_and_stop(self, job: str, *, stop: bool) -> dict[str, Any]:
        """Ask the job to save and leave its nodes; the detail to record (``state`` to escalate)."""
        ...


class SlurmSignalFallback:
    """``scancel --signal=SIG --batch|--full JOB``, then wait up to ``grace_s`` for it to leave."""

    def __init__(
        self,
        *,
        slurm_conf: str | None = None,
        scancel: str = "scancel",
        scontrol: str = "scontrol",
        signal: str = "USR1",
        mode: str = "batch",
        partition_modes: dict[str, str] | None = None,
        grace_s: float = 120.0,
        poll_s: float = 0.5,
        timeout_s: float = 30.0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"clientless mode must be one of {MODES}, not {mode!r}")
        for partition, value in (partition_modes or {}).items():
            if value not in MODES:
                raise ValueError(f"clientless mode of partition {partition!r} must be one of {MODES}")
        self.slurm_conf = slurm_conf
        self.scancel = scancel
        self.scontrol = scontrol
        self.signal = signal
        self.mode = mode
        self.partition_modes = dict(partition_modes or {})
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.timeout_s = timeout_s

    async def _run(self, *argv: str) -> tuple[int, str, str]:
        return await run_command(argv, slurm_conf=self.slurm_conf, timeout_s=self.timeout_s)

    async def job(self, job: str) -> dict[str, str]:
        """``scontrol show job -o JOB`` as a dict (empty when Slurm does not know the job)."""
        rc, out, err = await self._run(self.scontrol, "show", "job", "-o", job)
        if rc != 0:
            if "Invalid job id" in err:
                return {}
            raise SchedulerError("scontrol failed", command=(self.scontrol, "show", "job", job), stderr=err)
        return parse_oneliner(out.strip().splitlines()[0]) if out.strip() else {}

    def mode_for(self, partition: str) -> str:
        return self.partition_modes.get(partition, self.mode)

    async def save_and_stop(self, job: str, *, stop: bool) -> dict[str, Any]:
        if not stop:
            return {"note": "no rank registered and no save-only convention for a job without the client"}
        try:
            info = await self.job(job)
        except (SchedulerError, TimeoutError) as exc:
            return {"clientless": {"error": str(exc)[:500]}, "state": str(ActionState.ESCALATED)}
        state = info.get("JobState", "")
        if state not in _RUNNING:
            ended: dict[str, Any] = {"job_state": state or "unknown", "signalled": False}
            if state == "COMPLETED":  # it ended well by itself: the requeue phase leaves it alone
                ended["finished"] = True
            return {"clientless": ended}
        mode = self.mode_for(info.get("Partition", ""))
        restarts = _int(info.get("Restarts"))
        argv = (self.scancel, f"--signal={self.signal}", f"--{mode}", job)
        detail: dict[str, Any] = {"signal": self.signal, "mode": mode, "grace_s": self.grace_s}
        rc, out, err = await self._run(*argv)
        if rc != 0:
            detail["error"] = f"{' '.join(argv)} exited {rc}: {(err or out).strip()[:300]}"
            log.warning("clientless_signal_failed", job=job, error=detail["error"])
            return {"clientless": detail, "state": str(ActionState.ESCALATED)}
        log.info("clientless_signalled", job=job, signal=self.signal, mode=mode, grace_s=self.grace_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace_s
        while True:
            info = await self.job(job)
            state = info.get("JobState", "")
            if state not in _RUNNING:
                detail["job_state"] = state or "gone"
                if _int(info.get("Restarts")) > restarts:
                    detail["requeued_itself"] = True
                detail["waited_s"] = round(self.grace_s - max(0.0, deadline - loop.time()), 3)
                return {"clientless": detail}
            if loop.time() >= deadline:
                break
            await asyncio.sleep(self.poll_s)
        detail["signal_ignored"] = True
        detail["job_state"] = state
        log.warning("clientless_signal_ignored", job=job, grace_s=self.grace_s)
        return {"clientless": detail, "state": str(ActionState.ESCALATED)}


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


__all__ = ["MODES", "ClientlessFallback", "SlurmSignalFallback"]
