"""``ftd bench recovery``: an Xid 79 on a training node, recovered in the allocation and by requeue.

Everything real (issue #24): Slurm with four ``slurmd`` nodes on this host
(:class:`~ftd.bench.slurm_multinode.MultiNodeSlurm`, fast requeues), Mosquitto, one ``ftd agent``
per node and ``ftd coordinator`` with the Slurm scheduler (:mod:`ftd.bench.recovery_stack`), and a
real DDP job (torch gloo on CPU, :mod:`ftd.bench.recovery_trainer`) launched as ``srun ... ftd run
--nodes 3 --spares K -- python recovery_trainer.py``. One run measures three paths, each on a fresh
broker, agents, coordinator and ledger (the Slurm cluster is shared, its nodes resumed between):

1. **in_allocation**: ``sbatch -N4``, 3 training nodes + 1 hot spare (preflighted, a warm
   interpreter with torch imported); Xid 79 on node-2 -> save at the agreed step -> stop -> the
   spare takes node-2's slot -> generation 1 on every slot -> first step after the resume;
2. **in_allocation_cold**: the same without ``--warm`` (every rank imports torch again);
3. **requeue**: ``sbatch -N3``, no spare: the same fault -> save -> stop -> scheduler requeue
   excluding node-2 -> the batch script runs again on the three nodes left -> first step;
4. **rank_killed** (issue #31): the in-allocation job again, but the fault is one that really stops
   the rank: node-2's training process is SIGKILLed and Xid 79 written on node-2 at once (a GPU
   falling off the bus takes its process with it). No save can gather every rank any more, so the job
   resumes from its newest periodic checkpoint (every ``SAVE_EVERY`` steps, taken by the trainer as
   users' jobs do): ``steps_lost`` is then that checkpoint minus the step resumed from;
5. **torchrun** (the peer): the same job under the restart most users have today, ``torchrun
   --max-restarts 3`` on each of three nodes (c10d rendezvous, no ftd in the job, the same periodic
   checkpoints), and the same rank SIGKILLed (no Xid written: nothing in that stack reads it, and
   this path's agents and coordinator must not act on the job); torchrun restarts every rank on the
   same nodes. ``ratio_torchrun`` is rank_killed's ``first_step_s`` over torchrun's, measured in the
   same run;
6. **ft_launcher** (the other peer): the same under nvidia-resiliency-ext's launcher (``python -m
   nvidia_resiliency_ext.fault_tolerance.launcher``, torchrun's options, ``--max-restarts 3``), when
   that package can be imported (it is not a dependency of ftd: install it beside ftd to measure
   it; else the path reports ``error`` and is skipped). ``ratio_ft_launcher`` likewise.

Per path, :func:`ftd.bench.recovery_timeline.timeline` reads the trainers' JSON lines and the
checkpoint_restart detail from the ledger: seconds from the fault to the ranks stopped, to the new
generation started, to the first step after the resume; the save step, the step resumed from, steps
lost beyond the save step, old-generation ranks in the new one. ``ratio`` is in_allocation's
``first_step_s`` over requeue's (``ratio_cold``: in_allocation_cold's). The fault time is the moment
the bench wrote the kernel line or killed the rank (the same host clock as the trainers' records).
The bench measures; ``ftd bench recovery --check`` judges the figures against
:data:`ftd.bench.targets.TARGETS`: a path that did not come back within ``recover_timeout_s`` has
None figures, says so in ``error``, and fails the check.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftd.bench.broker import PrivateMosquitto
from ftd.bench.recovery_stack import JobSpec, RecoveryStack, recovery_stack, wait_for
from ftd.bench.recovery_timeline import incarnation, timeline
from ftd.bench.slurm_multinode import MultiNodeSlurm

__all__ = ["XID79", "Fault", "bench_recovery", "kill_rank", "measure_path", "recovered", "steady"]

XID79 = "[ 5021.437112] NVRM: Xid (PCI:0000:3b:00): 79, pid=31337, name=python, GPU has fallen off the bus."
FAULT_NODE = "node-2"  # slot 1 of the three training nodes
STEADY_STEPS = 20  # every rank trained this many steps (and the coordinator saw them) before the fault
SAVE_EVERY = 10  # the periodic checkpoint of the rank_killed and torchrun paths, in steps


@dataclass(frozen=True)
class Fault:
    """What happens on the fault node: Xid 79 in its kernel log, and/or its rank SIGKILLed."""

    xid: bool = True
    kill_rank: bool = False


def steady(stack: RecoveryStack, job: str, ranks: int, timeout: float, *, coordinator: bool = True) -> None:
    """Until every rank trains and (``coordinator``) the coordinator has seen the job's ranks step
    (its API; a job with no ftd in it is never seen)."""

    def trained() -> bool:
        steps: dict[int, int] = {}
        for r in stack.records(job, "step"):
            steps[int(r["rank"])] = max(steps.get(int(r["rank"]), 0), int(r["step"]))
        return len(steps) == ranks and min(steps.values()) >= STEADY_STEPS

    def known() -> bool:
        seen = stack.coordinator_job(job)
        return seen is not None and len(seen["ranks"]) == ranks and (seen["last_step"] or 0) >= STEADY_STEPS

    wait_for(trained, timeout, f"job {job}'s {ranks} ranks to train {STEADY_STEPS} steps")
    if coordinator:
        wait_for(known, 30, f"the coordinator to see job {job}'s {ranks} ranks step")


def kill_rank(stack: RecoveryStack, job: str, node: str) -> float:
    """SIGKILL the training process of ``job`` on ``node`` (the newest one started there); the
    wall-clock time it was killed."""
    starts = [r for r in stack.records(job, "process_start") if r.get("node") == node]
    if not starts:
        raise RuntimeError(f"no training process of job {job} recorded on {node}")
    pid = int(starts[-1]["pid"])
    at = time.time()
    os.kill(pid, signal.SIGKILL)
    return at


def recovered(stack: RecoveryStack, job: str, fault_at: float, ranks: int) -> bool:
    """Whether an incarnation newer than the fault's trained a step on every rank."""
    records = stack.records(job)
    old = max((incarnation(r) for r in records if r["what"] == "step" and r["t"] <= fault_at), default=None)
    newer = {int(r["rank"]) for r in records if r["what"] == "step" and old and incarnation(r) > old}
    return len(newer) == ranks


def measure_path(
    stack: RecoveryStack,
    spec: JobSpec,
    *,
    fault: Fault = Fault(),
    fault_node: str = FAULT_NODE,
    recover_timeout_s: float = 180.0,
) -> dict[str, Any]:
    """Submit ``spec``, wait for steady training, inject ``fault`` on ``fault_node`` (the rank killed
    first, then the kernel line), wait for the job to train again, and return :func:`timeline`'s
    figures (plus ``job``, ``error`` when it did not)."""
    job = stack.submit(spec)
    with_ftd = spec.launcher == "ftd"
    steady(stack, job, spec.nodes, 180, coordinator=with_ftd)
    fault_at = kill_rank(stack, job, fault_node) if fault.kill_rank else None
    if fault.xid:
        written = stack.kernel(fault_node, XID79)
        fault_at = written if fault_at is None else fault_at
    if fault_at is None:
        raise ValueError("a fault writes the Xid, kills the rank, or both")
    error: str | None = None
    try:
        wait_for(
            lambda: recovered(stack, job, fault_at, spec.nodes), recover_timeout_s, "the job to train again"
        )
        if not (with_ftd and fault.xid):
            raise _NoAction
        wait_for(
            lambda: (
                (stack.action("checkpoint_restart", job) or {}).get("state")
                not in (None, "pending", "running")
            ),
            30,
            "checkpoint_restart to finish",
        )
    except _NoAction:
        pass
    except TimeoutError as exc:
        error = str(exc)
    action = stack.action("checkpoint_restart", job)
    figures = timeline(stack.records(job), fault_at, action["detail"] if action else None)
    figures["job"] = job
    figures["action_state"] = action["state"] if action else None
    if error:
        figures["error"] = error
    return figures


class _NoAction(Exception):
    """No checkpoint_restart to wait for: the job has no ftd in it, or no Xid was written."""


def _path(
    slurm: MultiNodeSlurm, work: Path, spec: JobSpec, fault: Fault, **coordinator_keys: Any
) -> dict[str, Any]:
    if spec.launcher == "ft_launcher" and importlib.util.find_spec(NVRX) is None:
        return {"error": f"not measured: {NVRX} (nvidia-resiliency-ext) cannot be imported here"}
    slurm.reset()
    with (
        PrivateMosquitto() as broker,
        recovery_stack(slurm, broker.port, work, coordinator_keys=coordinator_keys) as stack,
    ):
        return measure_path(stack, spec, fault=fault)


#: The paths measured, in order: the spare with pre-started interpreters (the target's path), the same
#: without them (what --warm buys), and the scheduler requeue (no spare; no warm interpreters either:
#: a requeued job starts cold whatever it asked for, and idle ones would only slow its first start).
#: Then a rank that really stops, with ftd (spare, warm) and under torchrun --max-restarts (the peer).
_PERIODIC = {"FTD_RECOVERY_SAVE_EVERY": str(SAVE_EVERY)}
PATHS: dict[str, tuple[JobSpec, Fault]] = {
    "in_allocation": (JobSpec(name="rec-spare", nodes=3, spares=1), Fault()),
    "in_allocation_cold": (JobSpec(name="rec-spare-cold", nodes=3, spares=1, warm=""), Fault()),
    "requeue": (JobSpec(name="rec-requeue", nodes=3, spares=0, warm=""), Fault()),
    "rank_killed": (
        JobSpec(name="rec-killed", nodes=3, spares=1, env=_PERIODIC),
        Fault(xid=True, kill_rank=True),
    ),
    "torchrun": (
        JobSpec(name="rec-torchrun", nodes=3, spares=0, warm="", env=_PERIODIC, launcher="torchrun"),
        Fault(xid=False, kill_rank=True),
    ),
    "ft_launcher": (
        JobSpec(name="rec-nvrx", nodes=3, spares=0, warm="", env=_PERIODIC, launcher="ft_launcher"),
        Fault(xid=False, kill_rank=True),
    ),
}
NVRX = "nvidia_resiliency_ext"  # the ft_launcher path's package (optional: measured when importable)


def bench_recovery(samples: int = 1, paths: list[str] | None = None) -> dict[str, Any]:
    """Every path of :data:`PATHS` (or those named in ``paths``) ``samples`` times on one Slurm
    cluster: the last round's figures, and every round's in ``rounds`` (what the targets judge)."""
    unknown = sorted(set(paths or ()) - set(PATHS))
    if unknown:
        raise ValueError(f"unknown recovery paths {', '.join(unknown)}: {', '.join(PATHS)}")
    chosen = {name: PATHS[name] for name in (paths or list(PATHS))}
    rounds: list[dict[str, Any]] = []
    keys = {"save_deadline_s": 30.0, "stop_deadline_s": 30.0, "save_step_margin": 5}
    with tempfile.TemporaryDirectory(prefix="ftd-bench-recovery-", dir="/tmp") as tmp:
        work = Path(tmp)
        slurm = MultiNodeSlurm(work / "slurm", nodes=4).start()
        try:
            for i in range(samples):
                got: dict[str, Any] = {
                    name: _path(slurm, work / f"r{i}-{name}", spec, fault, **keys)
                    for name, (spec, fault) in chosen.items()
                }
                got["ratio"] = _ratio(got.get("in_allocation", {}), got.get("requeue", {}))
                got["ratio_cold"] = _ratio(got.get("in_allocation_cold", {}), got.get("requeue", {}))
                got["ratio_torchrun"] = _ratio(got.get("rank_killed", {}), got.get("torchrun", {}))
                got["ratio_ft_launcher"] = _ratio(got.get("rank_killed", {}), got.get("ft_launcher", {}))
                rounds.append(got)
        finally:
            slurm.stop()
    return {
        **rounds[-1],
        "rounds": rounds,
        "machine": {"cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2)},
        "setup": (
            "4 slurmd nodes on one host, 3 training ranks (1 per node, gloo on CPU) + 1 spare, "
            f"Xid 79 on {FAULT_NODE}; rank_killed/torchrun: its rank SIGKILLed, checkpoints every "
            f"{SAVE_EVERY} steps"
        ),
    }


def _ratio(spare: dict[str, Any], requeue: dict[str, Any]) -> float | None:
    a, b = spare.get("first_step_s"), requeue.get("first_step_s")
    return round(a / b, 3) if isinstance(a, int | float) and isinstance(b, int | float) and b > 0 else None
