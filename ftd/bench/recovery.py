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
   excluding node-2 -> the batch script runs again on the three nodes left -> first step.

Per path, :func:`ftd.bench.recovery_timeline.timeline` reads the trainers' JSON lines and the
checkpoint_restart detail from the ledger: seconds from the fault to the ranks stopped, to the new
generation started, to the first step after the resume; the save step, the step resumed from, steps
lost beyond the save step, old-generation ranks in the new one. ``ratio`` is in_allocation's
``first_step_s`` over requeue's (``ratio_cold``: in_allocation_cold's). The fault time is the moment
the bench wrote the kernel line (the same host clock as the trainers' records). Benchmarks measure,
they never assert: a path that did not come back within ``recover_timeout_s`` has None figures and
says so in ``error``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from ftd.bench.broker import PrivateMosquitto
from ftd.bench.recovery_stack import JobSpec, RecoveryStack, recovery_stack, wait_for
from ftd.bench.recovery_timeline import incarnation, timeline
from ftd.bench.slurm_multinode import MultiNodeSlurm

__all__ = ["XID79", "bench_recovery", "measure_path", "recovered", "steady"]

XID79 = "[ 5021.437112] NVRM: Xid (PCI:0000:3b:00): 79, pid=31337, name=python, GPU has fallen off the bus."
FAULT_NODE = "node-2"  # slot 1 of the three training nodes
STEADY_STEPS = 20  # every rank trained this many steps (and the coordinator saw them) before the fault
TARGET_S = 10.0


def steady(stack: RecoveryStack, job: str, ranks: int, timeout: float) -> None:
    """Until every rank trains and the coordinator has seen the job's ranks step (its API)."""

    def trained() -> bool:
        steps: dict[int, int] = {}
        for r in stack.records(job, "step"):
            steps[int(r["rank"])] = max(steps.get(int(r["rank"]), 0), int(r["step"]))
        return len(steps) == ranks and min(steps.values()) >= STEADY_STEPS

    def known() -> bool:
        seen = stack.coordinator_job(job)
        return seen is not None and len(seen["ranks"]) == ranks and (seen["last_step"] or 0) >= STEADY_STEPS

    wait_for(trained, timeout, f"job {job}'s {ranks} ranks to train {STEADY_STEPS} steps")
    wait_for(known, 30, f"the coordinator to see job {job}'s {ranks} ranks step")


def recovered(stack: RecoveryStack, job: str, fault_at: float, ranks: int) -> bool:
    """Whether an incarnation newer than the fault's trained a step on every rank."""
    records = stack.records(job)
    old = max((incarnation(r) for r in records if r["what"] == "step" and r["t"] <= fault_at), default=None)
    newer = {int(r["rank"]) for r in records if r["what"] == "step" and old and incarnation(r) > old}
    return len(newer) == ranks


def measure_path(
    stack: RecoveryStack, spec: JobSpec, *, fault_node: str = FAULT_NODE, recover_timeout_s: float = 180.0
) -> dict[str, Any]:
    """Submit ``spec``, wait for steady training, write Xid 79 on ``fault_node``, wait for the job to
    train again, and return :func:`timeline`'s figures (plus ``job``, ``error`` when it did not)."""
    job = stack.submit(spec)
    steady(stack, job, spec.nodes, 180)
    fault_at = stack.kernel(fault_node, XID79)
    error: str | None = None
    try:
        wait_for(
            lambda: recovered(stack, job, fault_at, spec.nodes), recover_timeout_s, "the job to train again"
        )
        wait_for(
            lambda: (
                (stack.action("checkpoint_restart", job) or {}).get("state")
                not in (None, "pending", "running")
            ),
            30,
            "checkpoint_restart to finish",
        )
    except TimeoutError as exc:
        error = str(exc)
    action = stack.action("checkpoint_restart", job)
    figures = timeline(stack.records(job), fault_at, action["detail"] if action else None)
    figures["job"] = job
    figures["action_state"] = action["state"] if action else None
    if error:
        figures["error"] = error
    return figures


def _path(slurm: MultiNodeSlurm, work: Path, spec: JobSpec, **coordinator_keys: Any) -> dict[str, Any]:
    slurm.reset()
    with (
        PrivateMosquitto() as broker,
        recovery_stack(slurm, broker.port, work, coordinator_keys=coordinator_keys) as stack,
    ):
        return measure_path(stack, spec)


#: The paths measured, in order: the spare with pre-started interpreters (the target's path), the same
#: without them (what --warm buys), and the scheduler requeue (no spare; no warm interpreters either:
#: a requeued job starts cold whatever it asked for, and idle ones would only slow its first start).
PATHS: dict[str, JobSpec] = {
    "in_allocation": JobSpec(name="rec-spare", nodes=3, spares=1),
    "in_allocation_cold": JobSpec(name="rec-spare-cold", nodes=3, spares=1, warm=""),
    "requeue": JobSpec(name="rec-requeue", nodes=3, spares=0, warm=""),
}


def bench_recovery(samples: int = 1) -> dict[str, Any]:
    """Every path of :data:`PATHS` ``samples`` times on one Slurm cluster: the last round's figures,
    every round's when more than one, and whether every round met the target."""
    rounds: list[dict[str, Any]] = []
    keys = {"save_deadline_s": 30.0, "stop_deadline_s": 30.0, "save_step_margin": 5}
    with tempfile.TemporaryDirectory(prefix="ftd-bench-recovery-", dir="/tmp") as tmp:
        work = Path(tmp)
        slurm = MultiNodeSlurm(work / "slurm", nodes=4).start()
        try:
            for i in range(samples):
                got: dict[str, Any] = {
                    name: _path(slurm, work / f"r{i}-{name}", spec, **keys) for name, spec in PATHS.items()
                }
                got["ratio"] = _ratio(got["in_allocation"], got["requeue"])
                got["ratio_cold"] = _ratio(got["in_allocation_cold"], got["requeue"])
                rounds.append(got)
        finally:
            slurm.stop()
    return {
        **rounds[-1],
        "rounds": rounds if samples > 1 else None,
        "meets_target": _meets(rounds),
        "machine": {"cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2)},
        "setup": (
            "4 slurmd nodes on one host, 3 training ranks (1 per node, gloo on CPU) + 1 spare, "
            f"Xid 79 on {FAULT_NODE}"
        ),
    }


def _ratio(spare: dict[str, Any], requeue: dict[str, Any]) -> float | None:
    a, b = spare.get("first_step_s"), requeue.get("first_step_s")
    return round(a / b, 3) if isinstance(a, int | float) and isinstance(b, int | float) and b > 0 else None


def _meets(rounds: list[dict[str, Any]]) -> bool:
    """Every round: in-allocation first step <= 10 s and <= half the requeue's, 0 steps lost, 0 old
    ranks in the new generation, and it really was the in-allocation path."""
    for r in rounds:
        spare = r["in_allocation"]
        first = spare.get("first_step_s")
        ok = (
            isinstance(first, int | float)
            and first <= TARGET_S
            and isinstance(r["ratio"], int | float)
            and r["ratio"] <= 0.5
            and spare.get("steps_lost") == 0
            and spare.get("old_generation_ranks") == 0
            and (spare.get("coordinator") or {}).get("path") == "spare"
        )
        if not ok:
            return False
    return True
