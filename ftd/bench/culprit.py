"""``ftd bench culprit``: is the right node blamed when a DDP job hangs or slows (issue #33 item 5)?

Everything real, on the parts of ``ftd bench recovery`` (:mod:`ftd.bench.recovery_stack`): Slurm with
four ``slurmd`` nodes on this host, Mosquitto, one ``ftd agent`` per node (a 5 s heartbeat timeout),
``ftd coordinator`` with the Slurm scheduler, and a real DDP job (torch gloo on CPU,
:mod:`ftd.bench.recovery_trainer` with its collectives timed) launched as ``srun ... ftd run --nodes 3
--spares 1``, checkpointing every ``SAVE_EVERY`` steps. Each run is one case on a fresh broker,
agents, coordinator and ledger, with a victim rank drawn from ``--seed``:

- ``stopped``: the victim's process is SIGSTOPped (the other ranks wait in the all-reduce);
- ``stuck``: the victim, told through its fault file, sleeps forever before its next all-reduce;
- ``slowed``: the victim sleeps as long again as its step took, every step (half speed);
- ``throttled``: the job's steps are bound by the CPU (:data:`THROTTLED_BUSY_S` CPU seconds of matrix
  products each, ``OMP_NUM_THREADS=1``), and the victim's process with all its threads is moved into a
  cgroup with a CPU quota (:class:`ftd.bench.cpu_throttle.CpuThrottle`, cgroup v1 ``cpu.cfs_quota_us``
  or v2 ``cpu.max``), as a noisy neighbour or a throttled CPU would: :data:`THROTTLE_CORES` of a core,
  or half of what the rank used over the :data:`THROTTLE_MEASURE_S` before when that is less (on a
  host whose cores are shared by more busy processes than it has, a rank gets less than half a core
  and such a quota would hold nothing back). The cgroup is removed after the case, whatever happened.
  No writable CPU controller: the case's error, never a sleep instead. ``throttle`` in its result: the
  cgroup version, the cores the rank used before, the quota, and the seconds the quota held the rank
  back (``cpu.stat``);
- ``slowed_all``: every rank is slowed so (no node is at fault);
- ``job_wide``: every rank opens a FIFO nobody writes (a path that never answers);
- ``clean``: nothing; the job is watched as long as a hang case would be.
- ``clean_long``: nothing, watched for 10 minutes once the slow-rank detector is warm: any
  ``rank_slow``, hang symptom or verdict (``alarms``), restart or exclusion makes the run wrong.

And ``e2e_during_collection``: ``ftd bench e2e``'s measurement (Xid line -> the client has ``save``)
twice on its own stack, alone and while hang-evidence collections keep running on the same coordinator
(:func:`ftd.bench.e2e.bench_e2e` ``during_collection``): ``p99_ratio`` is the second p99 over the
first. Both runs split this host's cores as two hosts would be (``pin``: the measured stack on one half,
the hung node's agent, py-spy and hung ranks on the other), so the ratio is what the collections cost
the coordinator, not what the hung node's CPU work costs a stack that would not share its CPUs.

What is read, all from the coordinator's ledger and the trainers' own records (never inferred from
what was injected): ``detect_s`` (fault -> the first hang symptom the agents raised, or the first
``rank_slow``: its node, scope, ranks, slowdown, and the time left the cost model weighed with where it
came from -- the job runs with ``sbatch --time`` :data:`TIME_LIMIT_MIN`, so ``scheduler``),
``verdict_s`` (that symptom -> the ``hang_verdict`` event the ``diagnose_hang`` action
handed to the rules), the verdict (kind, confident, culprit nodes and ranks), ``right`` (a hang with
one culprit: confident, naming exactly the victim's node; a slowed rank: ``rank_slow`` naming its node;
job-wide, all slowed and clean: no node blamed), the actions (``exclusions``: nodes excluded by a
checkpoint_restart or drained; ``swaps``: checkpoint_restarts that excluded a node; ``restarts``),
and steps lost (the last step the old generation trained minus the step the new one resumed from:
training done twice; ``last_step`` is the last step trained before the fault). A case whose verdict
never came says ``verdict: null`` and ``right: false`` (with its ``error`` when a wait timed out).
``--check`` judges the per-case counts against :data:`ftd.bench.targets.TARGETS`.
"""

from __future__ import annotations

import json
import os
import random
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ftd.bench.broker import PrivateMosquitto
from ftd.bench.cpu_throttle import CpuThrottle, cores_used, find_cpu_controller
from ftd.bench.e2e import bench_e2e
from ftd.bench.recovery import recovered, steady
from ftd.bench.recovery_stack import JobSpec, RecoveryStack, recovery_stack, wait_for
from ftd.bench.recovery_timeline import incarnation, timeline
from ftd.bench.slurm_multinode import MultiNodeSlurm

__all__ = ["CASES", "bench_culprit", "measure_case", "summarize"]

CASES = (
    "stopped",
    "stuck",
    "slowed",
    "throttled",
    "slowed_all",
    "job_wide",
    "clean",
    "clean_long",
    "e2e_during_collection",
)
HANG_CASES = frozenset({"stopped", "stuck", "job_wide"})
ONE_CULPRIT = frozenset({"stopped", "stuck"})
SLOW_CASES = frozenset({"slowed", "throttled", "slowed_all"})
ONE_SLOW = frozenset({"slowed", "throttled"})
THROTTLE_CORES = 0.5  # the throttled rank's CPU quota (at most; half of what it used when less)
THROTTLE_MEASURE_S = 3.0  # how long the rank's CPU use is measured before the quota is set
THROTTLED_BUSY_S = 0.15  # CPU seconds of computation per step in the throttled case's job
THROTTLED_STEP_S = 0.02  # and its sleep per step (the other cases: JobSpec's 0.1 s)
RANKS = 3
SAVE_EVERY = 10
HEARTBEAT_TIMEOUT_S = 5.0
HANG_SYMPTOMS = frozenset({"rank_heartbeat_lost", "log_stale"})
HANG_PATTERNS = frozenset({"nccl_watchdog_timeout", "nccl_watchdog_stuck"})
SLOW_CLEAN_S = 10.0  # clean training after the slow-rank detector's baseline is set, before the slowdown
VERDICT_TIMEOUT_S = 120.0  # fault -> hang_verdict, beyond which the case is reported as no verdict
TIME_LIMIT_MIN = 120  # the job's sbatch --time: the slow-rank cost model weighs the time it has left
SLOW_WINDOW_S = 60.0  # how long a slowed case is watched for rank_slow (the target is 60 s)
CLEAN_WINDOW_S = 30.0  # how long a clean case is watched (hang verdicts came within 10 s of a fault here)
#: clean_long: a clean job watched this long once the slow-rank detector is warm (the target's 10 minutes)
CLEAN_LONG_S = 600.0
RECOVER_TIMEOUT_S = 180.0
E2E_SAMPLES = 1000  # p99 of 200 samples is their second-slowest: 0.8-1.7 x between runs here
_NOT_RUN = frozenset({"suppressed", "dry_run", "rejected", "awaiting_approval"})  # the policy gate said no

AGENT_EXTRA = f"""
[agent.heartbeat]
timeout_s = {HEARTBEAT_TIMEOUT_S}
check_interval_s = 0.25
"""


def _spec(case: str, fault_dir: Path) -> JobSpec:
    busy = {"FTD_RECOVERY_BUSY_S": str(THROTTLED_BUSY_S)} if case == "throttled" else {}
    return JobSpec(
        step_s=THROTTLED_STEP_S if case == "throttled" else 0.1,
        name=f"culprit-{case}",
        nodes=RANKS,
        spares=1,
        time_limit_min=TIME_LIMIT_MIN,
        env={
            "FTD_RECOVERY_FAULT_DIR": str(fault_dir),
            "FTD_RECOVERY_TIME_COLLECTIVES": "1",
            "FTD_RECOVERY_SAVE_EVERY": str(SAVE_EVERY),
            **busy,
        },
    )


def _ranks(stack: RecoveryStack, job: str) -> dict[int, dict[str, Any]]:
    """Each rank's newest process_start record (pid, node) of the newest incarnation."""
    starts = stack.records(job, "process_start")
    newest = max((incarnation(r) for r in starts), default=None)
    return {int(r["rank"]): r for r in starts if incarnation(r) == newest}


def _step_interval(stack: RecoveryStack, job: str, rank: int) -> float:
    """The rank's mean seconds per step over its last 20 steps (what doubling its step adds)."""
    times = [float(r["t"]) for r in stack.records(job, "step") if int(r["rank"]) == rank][-21:]
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.2


def _write_fault(fault_dir: Path, pid: int, fault: dict[str, Any]) -> None:
    tmp = fault_dir / f".{pid}.tmp"
    tmp.write_text(json.dumps(fault))
    os.replace(tmp, fault_dir / f"{pid}.json")


def inject(
    stack: RecoveryStack,
    job: str,
    case: str,
    victim: int,
    fault_dir: Path,
    held: list[CpuThrottle] | None = None,
) -> float:
    """Inject ``case``'s fault on the job's real processes; the wall-clock time it was injected.
    ``throttled`` needs ``held``: its throttle is added there, for the caller to close."""
    ranks = _ranks(stack, job)
    pid = int(ranks[victim]["pid"])
    at = time.time()
    if case == "stopped":
        os.kill(pid, signal.SIGSTOP)
    elif case == "stuck":
        _write_fault(fault_dir, pid, {"fault": "stuck"})
    elif case == "slowed":
        _write_fault(
            fault_dir, pid, {"fault": "slow", "sleep_s": round(_step_interval(stack, job, victim), 3)}
        )
    elif case == "throttled":
        if held is None:
            raise ValueError("the throttled case needs a list to hold its throttle")
        used = cores_used(pid, THROTTLE_MEASURE_S)
        throttle = CpuThrottle(pid, max(0.02, min(THROTTLE_CORES, used / 2)))
        throttle.used_before = round(used, 3)
        at = time.time()
        throttle.start()
        held.append(throttle)
    elif case == "slowed_all":
        extra = round(_step_interval(stack, job, victim), 3)
        for record in ranks.values():
            _write_fault(fault_dir, int(record["pid"]), {"fault": "slow", "sleep_s": extra})
    elif case == "job_wide":
        fifo = fault_dir / f"never-{job}"
        os.mkfifo(fifo)
        for record in ranks.values():
            _write_fault(fault_dir, int(record["pid"]), {"fault": "fifo", "path": str(fifo)})
    elif case not in ("clean", "clean_long"):
        raise ValueError(f"unknown case {case!r}: {', '.join(CASES)}")
    return at


def _job_events(stack: RecoveryStack, kind: str, job: str) -> list[dict[str, Any]]:
    return [e for e in stack.events(kind) if str((e.get("data") or {}).get("job")) == job]


def _symptoms(stack: RecoveryStack, job: str, since: float) -> list[dict[str, Any]]:
    found = [e for kind in HANG_SYMPTOMS for e in _job_events(stack, kind, job)]
    found += [
        e
        for e in _job_events(stack, "log_pattern", job)
        if (e.get("data") or {}).get("pattern") in HANG_PATTERNS
    ]
    return sorted((e for e in found if float(e["ts"]) >= since), key=lambda e: float(e["ts"]))


def _until(predicate: Callable[[], object], timeout: float, what: str) -> str | None:
    try:
        wait_for(predicate, timeout, what, poll=0.25)
    except TimeoutError as exc:
        return str(exc)
    return None


def _settled(stack: RecoveryStack, job: str) -> bool:
    return all(
        a["state"] not in ("pending", "running")
        for a in stack.actions()
        if a["target"] == job and a["kind"] in ("checkpoint_restart", "diagnose_hang")
    )


def _fault_times(stack: RecoveryStack, job: str, since: float) -> list[float]:
    """When the job's ranks said their fault file took hold (their ``fault`` records)."""
    return [float(r["t"]) for r in stack.records(job, "fault") if float(r["t"]) >= since]


def _restarted(stack: RecoveryStack, job: str) -> bool:
    return any(a["kind"] == "checkpoint_restart" and a["target"] == job for a in stack.actions())


def measure_case(stack: RecoveryStack, case: str, victim: int, fault_dir: Path) -> dict[str, Any]:
    """One run of ``case`` on ``stack`` (module docstring): submit, train, inject, watch, read."""
    if case == "throttled":
        find_cpu_controller()  # no controller: the case's error now, before a job is run for nothing
    held: list[CpuThrottle] = []
    try:
        return _measure(stack, case, victim, fault_dir, held)
    finally:
        for throttle in held:  # the pids back where they were, the cgroup removed, whatever happened
            throttle.close()


def _measure(
    stack: RecoveryStack, case: str, victim: int, fault_dir: Path, held: list[CpuThrottle]
) -> dict[str, Any]:
    job = stack.submit(_spec(case, fault_dir))
    steady(stack, job, RANKS, 240)
    if case in SLOW_CASES or case == "clean_long":
        # The detector's baseline is the job's own history (coordinator.slow_ranks.warmup_samples
        # presences, at most one a second): it must be set before the slowdown, then a clean stretch.
        stack.coordinator.wait_log("slow_ranks_warm", 240)
        time.sleep(SLOW_CLEAN_S)
    ranks = _ranks(stack, job)
    victim_node = str(ranks[victim]["node"])
    fault_at = inject(stack, job, case, victim, fault_dir, held)
    if case not in ("stopped", "throttled", "clean", "clean_long"):
        # a fault file takes hold at the rank's next step: when it said so
        since = fault_at
        if _until(lambda: _fault_times(stack, job, since), 30, "the fault to take hold") is None:
            fault_at = min(_fault_times(stack, job, since))
    last_step = max(
        (int(r["step"]) for r in stack.records(job, "step") if float(r["t"]) <= fault_at), default=0
    )
    out: dict[str, Any] = {
        "job": job,
        "victim_rank": victim,
        "victim_node": victim_node,
        "last_step": last_step,
    }
    error: str | None = None
    if case in HANG_CASES:
        error = _until(lambda: _job_events(stack, "hang_verdict", job), VERDICT_TIMEOUT_S, "a hang_verdict")
        if error is None:
            error = _until(lambda: _settled(stack, job), 60, "the hang's actions to finish")
        if error is None and _restarted(stack, job):
            error = _until(
                lambda: recovered(stack, job, fault_at, RANKS), RECOVER_TIMEOUT_S, "training again"
            )
    elif case in SLOW_CASES:
        since = fault_at  # a rank_slow from before the fault (the job's own drift) is not the answer
        _until(
            lambda: [e for e in _job_events(stack, "rank_slow", job) if float(e["ts"]) >= since],
            SLOW_WINDOW_S,
            "a rank_slow",
        )
        # what the rules then do (a swap when the cost model says so) has its time to show
        time.sleep(5.0)
        error = _until(lambda: _settled(stack, job), 120, "the slow rank's actions to finish")
        if error is None and _restarted(stack, job):
            error = _until(
                lambda: recovered(stack, job, fault_at, RANKS), RECOVER_TIMEOUT_S, "training again"
            )
    else:
        window = CLEAN_LONG_S if case == "clean_long" else CLEAN_WINDOW_S
        end = time.monotonic() + window
        wait_for(lambda: time.monotonic() > end, window + 5, "the clean window", poll=1.0)
        out["window_s"] = window
    out.update(read_outcome(stack, job, case, fault_at, victim_node))
    for throttle in held:
        out["throttle"] = {
            "cgroup": throttle.version,
            "cores_used_before": throttle.used_before,
            "cores": round(throttle.cores, 3),
            "throttled_s": round(throttle.throttled_s(), 3),
        }
    if error:
        out["error"] = error
    return out


def read_outcome(
    stack: RecoveryStack, job: str, case: str, fault_at: float, victim_node: str
) -> dict[str, Any]:
    """What the coordinator did about the job since ``fault_at``, read from its ledger and the trainers'
    records (module docstring)."""
    symptoms = _symptoms(stack, job, fault_at)
    slow = [e for e in _job_events(stack, "rank_slow", job) if float(e["ts"]) >= fault_at]
    verdicts = [e for e in _job_events(stack, "hang_verdict", job) if float(e["ts"]) >= fault_at]
    actions = [  # taken since the fault: what the policy gate stopped was not done
        a
        for a in stack.actions()
        if (a["created"] is None or float(a["created"]) >= fault_at - 1) and a["state"] not in _NOT_RUN
    ]
    restarts = [a for a in actions if a["kind"] == "checkpoint_restart" and a["target"] == job]
    excluded = {str(n) for a in restarts for n in a["request"].get("params", {}).get("exclude") or []}
    drained = {str(a["target"]) for a in actions if a["kind"] == "drain_node"}
    out: dict[str, Any] = {
        "symptom": symptoms[0]["kind"] if symptoms else None,
        "detect_s": round(float(symptoms[0]["ts"]) - fault_at, 3) if symptoms else None,
        "exclusions": len(excluded | drained),
        "excluded_nodes": sorted(excluded | drained),
        "swaps": sum(1 for a in restarts if a["request"].get("params", {}).get("exclude")),
        "restarts": len(restarts),
        "diagnoses": sum(1 for a in actions if a["kind"] == "diagnose_hang" and a["target"] == job),
        "verdict": None,
    }
    if verdicts:
        data = verdicts[0].get("data") or {}
        out["verdict"] = {
            k: data.get(k) for k in ("verdict", "confident", "culprit_nodes", "culprit_ranks", "why")
        }
        if symptoms:
            out["verdict_s"] = round(float(verdicts[0]["ts"]) - float(symptoms[0]["ts"]), 3)
    if slow:
        first = slow[0]
        data = first.get("data") or {}
        out["detect_s"] = round(float(first["ts"]) - fault_at, 3)
        out["rank_slow"] = {
            "node": None if data.get("not_node") else first.get("node"),
            "scope": data.get("scope"),
            "ranks": data.get("ranks"),
            "slowdown": data.get("slowdown"),
            "remaining_s": data.get("remaining_s"),
            "remaining_from": data.get("remaining_from"),
        }
    # anything that would reach an operator about this job: a slow rank, a hang symptom or verdict
    out["alarms"] = len(slow) + len(symptoms) + len(verdicts)
    out["right"] = _right(case, out, victim_node)
    restart = restarts[-1] if restarts else None
    figures = timeline(stack.records(job), fault_at, restart["detail"] if restart else None)
    out["resumed_from"] = figures.get("resumed_from") if figures.get("new") else None
    # trained by the old generation and done again by the new one (a slowed rank's job saves first: 0)
    out["steps_lost"] = figures.get("steps_redone") if figures.get("new") else None
    out["first_step_s"] = figures.get("first_step_s")
    return out


def _right(case: str, out: dict[str, Any], victim_node: str) -> bool:
    verdict = out.get("verdict") or {}
    if case in ONE_CULPRIT:
        return (
            verdict.get("verdict") == "culprit"
            and verdict.get("confident") is True
            and verdict.get("culprit_nodes") == [victim_node]
            and out["excluded_nodes"] == [victim_node]
        )
    if case == "job_wide":
        return bool(verdict) and verdict.get("verdict") != "culprit" and out["exclusions"] == 0
    if case in ONE_SLOW:
        return (out.get("rank_slow") or {}).get("node") == victim_node and out["excluded_nodes"] in (
            [],
            [victim_node],
        )
    if case == "clean_long":  # ten clean minutes: nothing at all (issue #33: "raises no alarm")
        return bool(
            out["alarms"] == 0 and out["exclusions"] == 0 and out["swaps"] == 0 and out["restarts"] == 0
        )
    # slowed_all, clean: no node blamed, nothing excluded or swapped
    return (out.get("rank_slow") or {}).get("node") is None and out["exclusions"] == 0 and out["swaps"] == 0


def _max(values: list[Any]) -> float | None:
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return max(numbers) if numbers else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One case's runs in counts (what the targets judge): runs, right, wrong, the worst times,
    the most exclusions and swaps in a run; a figure no run produced is None (not measured)."""
    return {
        "runs": len(runs),
        "right": sum(1 for r in runs if r.get("right") is True),
        "wrong": sum(1 for r in runs if r.get("right") is not True),
        "detect_s_max": _max([r.get("detect_s") for r in runs]),
        "verdict_s_max": _max([r.get("verdict_s") for r in runs]),
        "exclusions_max": _max([r.get("exclusions") for r in runs]),
        "swaps_max": _max([r.get("swaps") for r in runs]),
        "alarms_max": _max([r.get("alarms") for r in runs]),
        "steps_lost_max": _max([r.get("steps_lost") for r in runs]),
        "errors": sum(1 for r in runs if r.get("error")),
    }


def e2e_during_collection(samples: int = E2E_SAMPLES) -> dict[str, Any]:
    """``ftd bench e2e`` alone, then while collections run (module docstring)."""
    alone = bench_e2e(samples=samples, pin=True)
    during = bench_e2e(samples=samples, during_collection=True, pin=True)
    return {
        "alone_p99_ms": alone["p99_ms"],
        "p99_ms": during["p99_ms"],
        "p99_ratio": round(during["p99_ms"] / alone["p99_ms"], 3) if alone["p99_ms"] > 0 else None,
        "alone_p50_ms": alone["p50_ms"],
        "p50_ms": during["p50_ms"],
        "samples": during["samples"],
        "diagnoses": during.get("diagnoses"),
        "samples_during_collection": during.get("samples_during_collection"),
        "cores": during.get("cores"),  # the measured stack's and the hung node's (None: not split)
    }


def _one_run(slurm: MultiNodeSlurm, work: Path, case: str, victim: int) -> dict[str, Any]:
    slurm.reset()
    fault_dir = work / "faults"
    fault_dir.mkdir(parents=True, exist_ok=True)
    try:
        with (
            PrivateMosquitto() as broker,
            recovery_stack(slurm, broker.port, work, agent_extra=AGENT_EXTRA) as stack,
        ):
            return measure_case(stack, case, victim, fault_dir)
    except (TimeoutError, RuntimeError) as exc:  # the run could not be set up or read: say so
        return {"victim_rank": victim, "right": False, "verdict": None, "error": str(exc)[:2000]}


def bench_culprit(runs: int = 1, cases: list[str] | None = None, seed: int = 0) -> dict[str, Any]:
    """Every case of :data:`CASES` (or those named) ``runs`` times, each with a victim rank drawn
    from ``seed``, on one Slurm cluster; per case its runs and their summary."""
    unknown = sorted(set(cases or ()) - set(CASES))
    if unknown:
        raise ValueError(f"unknown culprit cases {', '.join(unknown)}: {', '.join(CASES)}")
    if runs < 1:
        raise ValueError("runs must be at least 1")
    chosen = [c for c in CASES if c in set(cases or CASES)]
    rng = random.Random(seed)
    result: dict[str, Any] = {"cases": {}}
    with tempfile.TemporaryDirectory(prefix="ftd-bench-culprit-", dir="/tmp") as tmp:
        work = Path(tmp)
        slurm = MultiNodeSlurm(work / "slurm", nodes=RANKS + 1).start()
        try:
            for case in chosen:
                if case == "e2e_during_collection":
                    continue
                got = [_one_run(slurm, work / f"{case}-{i}", case, rng.randrange(RANKS)) for i in range(runs)]
                result["cases"][case] = {**summarize(got), "each": got}
        finally:
            slurm.stop()
    if "e2e_during_collection" in chosen:
        try:
            result["e2e_during_collection"] = e2e_during_collection()
        except (RuntimeError, TimeoutError, OSError) as exc:  # the cases' figures stand: say what failed
            result["e2e_during_collection"] = {"p99_ratio": None, "error": str(exc)[:2000]}
    result["machine"] = {"cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2)}
    result["setup"] = (
        f"4 slurmd nodes on one host, {RANKS} training ranks (1 per node, gloo on CPU) + 1 spare under "
        f"ftd run, agent heartbeat timeout {HEARTBEAT_TIMEOUT_S:g} s, seed {seed}"
    )
    return result
