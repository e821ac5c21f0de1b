"""``ftd bench checkpoint --cases ...``: the checkpoint tier's fault cases on real parts (issue #34).

Everything real, on the recovery bench's stack (:mod:`ftd.bench.recovery_stack`: Slurm with four
``slurmd`` nodes on this host, Mosquitto, one ``ftd agent`` per node, ``ftd coordinator`` with the
Slurm scheduler) and its trainer (:mod:`ftd.bench.recovery_trainer` with ``FTD_RECOVERY_TIER=1``): a
DDP job on gloo, ``srun ... ftd run --nodes 3 --spares 1``, saving through the checkpoint tier every
:data:`SAVE_EVERY` steps (the local write under ``<out>/local/<node>``, the partner replica, every
:data:`FLUSH_EVERY`-th save flushed to the shared directory), resuming with ``load_resume``. Each run
of a case starts a fresh job, waits until it trains and has saved, injects the fault
(:mod:`ftd.bench.checkpoint_faults`) and waits for every rank of a new generation to say where it
resumed from:

- ``kill_mid_save``: while node-2's rank has a save in flight (its snapshot taken, its background
  write and replica running) and has trained 0, 1 or 2 steps since the snapshot (by run: the later,
  the nearer the save's landing, the more a kill loses), its training process and node-2's agent
  are SIGKILLed; nothing else is written (the node went silent: its agent's Last Will). The saves
  are planned by ``tier.due(step, SAVE_EVERY)``, so at most one interval may be lost;
- ``local_deleted``: node-2's rank SIGKILLed, its local checkpoint directory deleted (partner copies
  of others included), then an Xid 79 in its kernel log (the node is replaced by the spare, which
  has no local copy);
- ``flip_byte`` / ``truncate`` / ``missing_manifest``: node-2's rank is SIGKILLed between two saves
  (no save can gather every rank any more), the agents' verification of the newest step on every
  rank is awaited (``catalogued``), then rank 0's local copy of it, on node-1, which stays in the
  job, is broken (a copy damaged after it was verified), then Xid 79 is written on node-2.

Right after the fault, before the restart, :func:`~ftd.bench.checkpoint_faults.scan` records which
steps every rank could load from verified copies on the nodes still in the job and in the shared
directory (node-2's disk left with node-2; scanned again the moment the ranks resume, for the copies
the old generation wrote of steps trained before the fault, since a save or shared flush in flight
may finish in between). Then
:func:`~ftd.bench.checkpoint_faults.judge` says whether the resume was right (one step on every rank,
verified at the level each named, never newer than the newest verified), the steps lost, the level,
and whether it hung (no resume within ``recover_timeout_s``). A case that cannot be set up (nothing
to break) says so in ``error``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ftd.bench.broker import PrivateMosquitto
from ftd.bench.checkpoint_faults import CASES, CORRUPTIONS, inject, judge, scan, verified_steps
from ftd.bench.recovery import XID79, kill_rank, steady
from ftd.bench.recovery_stack import JobSpec, RecoveryStack, recovery_stack, wait_for
from ftd.bench.recovery_timeline import incarnation
from ftd.bench.slurm_multinode import MultiNodeSlurm

__all__ = ["CASES", "NO_SHARED", "SPEC", "bench_faults", "run_case", "summarize"]

SAVE_EVERY = 10  # the save interval: steps a node lost mid-save may cost at most (tier.due plans the saves)
FLUSH_EVERY = 4  # every 4th save also goes to the shared directory
STATE_MB = 16  # extra state per rank, so a save's background work takes a while
FAULT_NODE = "node-2"  # rank 1: killed or replaced
KEEP_NODE = "node-1"  # rank 0: stays in the job; its copies are the ones corrupted
RANKS = 3
SPEC = JobSpec(
    name="ckpt-faults",
    nodes=RANKS,
    spares=1,
    env={
        "FTD_RECOVERY_TIER": "1",
        "FTD_RECOVERY_SAVE_EVERY": str(SAVE_EVERY),
        "FTD_RECOVERY_FLUSH_EVERY": str(FLUSH_EVERY),
        "FTD_RECOVERY_STATE_MB": str(STATE_MB),
    },
)


def _done_steps(stack: RecoveryStack, job: str, rank: int) -> list[int]:
    return sorted(int(r["step"]) for r in stack.records(job, "tier_done") if int(r["rank"]) == rank)


def _kill_agent(stack: RecoveryStack, node: str) -> None:
    stack.agents[node].stop(signal.SIGKILL)


def _mid_save(stack: RecoveryStack, job: str, rank: int, timeout: float, trained: int = 0) -> tuple[int, int]:
    """Until ``rank`` has a save whose background work has not finished and has trained at least
    ``trained`` steps since that save's snapshot (0: at once; more: nearer the save's landing, the
    instant that loses most); ``(the save's step, the newest step trained)``."""
    found: list[tuple[int, int]] = []

    def running() -> bool:
        started = {int(r["step"]) for r in stack.records(job, "save_started") if int(r["rank"]) == rank}
        pending = sorted(started - set(_done_steps(stack, job, rank)))
        if not pending:
            return False
        newest = max(int(r["step"]) for r in stack.records(job, "step") if int(r["rank"]) == rank)
        if newest - pending[-1] < trained:
            return False
        found.append((pending[-1], newest))
        return True

    wait_for(running, timeout, f"a save of rank {rank} in progress, {trained} steps trained since", poll=0.01)
    return found[-1]


def _resumed(stack: RecoveryStack, job: str, after: tuple[int, int]) -> dict[int, tuple[int, str | None]]:
    """rank -> (step, level) of the newest incarnation after ``after`` in which every rank resumed."""
    newer: dict[tuple[int, int], dict[int, tuple[int, str | None]]] = {}
    for r in stack.records(job, "resumed"):
        inc = incarnation(r)
        if inc > after:
            newer.setdefault(inc, {})[int(r["rank"])] = (int(r["step"]), r.get("level"))
    full = [inc for inc, ranks in newer.items() if len(ranks) == RANKS]
    return newer[max(full)] if full else {}


#: SPEC with no shared flush: a broken local copy has no shared copy to fall back on (only the partner's)
NO_SHARED = replace(
    SPEC, name="ckpt-faults-noshared", env={**SPEC.env, "FTD_RECOVERY_FLUSH_EVERY": "1000000"}
)


def run_case(
    stack: RecoveryStack,
    case: str,
    *,
    seed: int = 0,
    recover_timeout_s: float = 180.0,
    spec: JobSpec = SPEC,
) -> dict[str, Any]:
    """One run of ``case`` on a fresh job of ``stack`` (see the module docstring)."""
    if case not in CASES:
        raise ValueError(f"unknown case {case!r}: {', '.join(CASES)}")
    job = stack.submit(spec)
    steady(stack, job, RANKS, 240)
    # two saves finished on the kept rank: an older verified checkpoint exists to fall back to
    wait_for(lambda: len(_done_steps(stack, job, 0)) >= 2, 120, "two finished saves on rank 0")
    local = stack.out / "local"
    shared = stack.out / f"{job}-ckpt"
    before = [r for r in stack.records(job, "step")]
    old = max(incarnation(r) for r in before)
    injected: dict[str, Any] = {"case": case}
    if case == "kill_mid_save":
        # the kill lands 0, 1 or 2 steps after the snapshot (by run), the save still in flight
        injected["save_step"], injected["trained_step"] = _mid_save(stack, job, 1, 60, trained=seed % 3)
        fault_at = kill_rank(stack, job, FAULT_NODE)
        _kill_agent(stack, FAULT_NODE)
    elif case == "local_deleted":  # the node dies, its disk with it (deleted once nothing writes there)
        fault_at = kill_rank(stack, job, FAULT_NODE)
        wait_for(lambda: _quiet(stack, job, 1), 30, "the killed rank's records to stop")
        injected.update(inject(case, local / FAULT_NODE))
        stack.kernel(FAULT_NODE, XID79)
    else:
        assert case in CORRUPTIONS
        # killed between saves (its newest save replicated), so the coordinator can know the newest
        # step as verified on every rank before rank 0's copy of it is broken: the case is then
        # "a copy broken after it was verified", every run the same
        wait_for(lambda: _quiet(stack, job, 1), 30, "rank 1 between two saves", poll=0.01)
        fault_at = kill_rank(stack, job, FAULT_NODE)
        # rank 0's background work for a save in flight ends (or the peers block in the collective)
        wait_for(lambda: _quiet(stack, job, 0), 30, "rank 0's save in flight to finish")
        mine = scan([local / KEEP_NODE], hashes=False).values()
        newest = max((c.step for c in mine if c.level == "local" and 0 in c.verified_ranks), default=0)
        try:
            # hashing and relaying take seconds under load: the precondition gets a minute
            wait_for(lambda: _catalogued(stack, job, newest), 60, f"step {newest} verified on every rank")
            injected["catalogued"] = True
        except TimeoutError:
            injected["catalogued"] = False
        injected.update(inject(case, local / KEEP_NODE, rank=0, seed=seed))
        stack.kernel(FAULT_NODE, XID79)
    # What the job can still load: node-2 has left it (killed, or replaced by the spare), so its disk
    # does not count; the rest is scanned now and again when the ranks resume (a flush to the shared
    # directory may finish in between), only steps trained before the fault.
    last_step = max((int(r["step"]) for r in stack.records(job, "step") if r["t"] <= fault_at), default=None)

    def reachable() -> list[Path]:
        return [p for p in sorted(local.glob("*")) if p.name != FAULT_NODE] + [shared]

    verified = verified_steps(scan(reachable()))
    hang = False
    started = time.monotonic()
    try:
        wait_for(lambda: _resumed(stack, job, old), recover_timeout_s, "every rank to resume", poll=0.2)
    except TimeoutError:
        hang = True
    resume_s = None if hang else round(time.monotonic() - started, 2)
    for step, ranks in verified_steps(scan(reachable(), generation=old[1])).items():
        if last_step is not None and step <= last_step and step not in verified:
            verified[step] = ranks
    resumed = _resumed(stack, job, old)
    outcome = judge(
        case,
        verified=verified,
        resumed=resumed,
        world_size=RANKS,
        last_step=last_step,
        interval_steps=SAVE_EVERY,
        hang=hang,
    ).as_dict()
    failures = [r.get("why") for r in stack.records(job, "resume_failed")]
    outcome.update(
        job=job,
        injected=injected,
        resume_s=resume_s,
        verified_before={str(s): {str(k): sorted(v) for k, v in r.items()} for s, r in verified.items()},
        per_rank={str(rank): [step, level] for rank, (step, level) in sorted(resumed.items())},
        resume_failed=len(failures),
        resume_failed_why=failures[-1] if failures else None,
    )
    return outcome


def _catalogued(stack: RecoveryStack, job: str, step: int) -> bool:
    """Whether the agents verified a copy of ``step`` of every rank on a node that stays in the job
    (the ledger's checkpoint events: what the coordinator's catalogue is built from)."""
    ranks = {
        int(e["data"]["shard_rank"])
        for e in stack.events("checkpoint")
        if e["data"].get("job") == job
        and e["data"].get("step") == step
        and e["data"].get("ok")
        and e.get("node") != FAULT_NODE
    }
    return ranks >= set(range(RANKS))


def _quiet(stack: RecoveryStack, job: str, rank: int) -> bool:
    started = {int(r["step"]) for r in stack.records(job, "save_started") if int(r["rank"]) == rank}
    return started <= set(_done_steps(stack, job, rank)) or _stalled(stack, job, rank)


def _stalled(stack: RecoveryStack, job: str, rank: int) -> bool:
    """The rank's save in flight will not finish (its replica waits for the killed partner): 5 s with
    no new record from it."""
    mine = [r for r in stack.records(job) if int(r["rank"]) == rank]
    return bool(mine) and time.time() - float(mine[-1]["t"]) > 5.0


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per case: runs, right, hangs, resumes from a newer unverified checkpoint, levels, steps lost."""
    out: dict[str, Any] = {}
    for case in CASES:
        mine = [r for r in runs if r.get("case") == case]
        if not mine:
            continue
        lost = [r["steps_lost"] for r in mine if isinstance(r.get("steps_lost"), int)]
        levels: dict[str, int] = {}
        for r in mine:
            levels[str(r.get("level"))] = levels.get(str(r.get("level")), 0) + 1
        out[case] = {
            "runs": len(mine),
            "right": sum(1 for r in mine if r.get("right")),
            "hangs": sum(1 for r in mine if r.get("hang")),
            "newer_than_verified": sum(
                1 for r in mine if r.get("resumed_step") is not None and not r["not_newer"]
            ),
            "errors": sum(1 for r in mine if r.get("error")),
            "levels": levels,
            "steps_lost_max": max(lost) if lost else None,
            "fast_level": sum(1 for r in mine if r.get("fast_level") is True),
            "within_interval": sum(1 for r in mine if r.get("within_interval") is True),
            "from_newest": sum(1 for r in mine if r.get("from_newest") is True),
        }
    return out


def bench_faults(cases: list[str] | None = None, runs: int = 1) -> dict[str, Any]:
    """Each case of ``cases`` (all by default) ``runs`` times, each on a fresh stack and job; each run's
    outcome is also printed to stderr as one JSON line as soon as it is known (a long batch stopped
    half-way keeps what it measured)."""
    chosen = list(cases or CASES)
    unknown = sorted(set(chosen) - set(CASES))
    if unknown:
        raise ValueError(f"unknown checkpoint cases {', '.join(unknown)}: {', '.join(CASES)}")
    results: list[dict[str, Any]] = []
    keys = {"save_deadline_s": 30.0, "stop_deadline_s": 30.0, "save_step_margin": 5}
    with tempfile.TemporaryDirectory(prefix="ftd-bench-ckpt-", dir="/tmp") as tmp:
        work = Path(tmp)
        slurm = MultiNodeSlurm(work / "slurm", nodes=4).start()
        try:
            for i in range(runs):
                for case in chosen:
                    results.append(_one(slurm, work / f"r{i}-{case}", case, seed=i, **keys))
                    print(json.dumps(results[-1], default=str), file=sys.stderr, flush=True)
        finally:
            slurm.stop()
    return {
        "results": results,
        "summary": summarize(results),
        "count": len(results),
        "machine": {"cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2)},
        "setup": (
            f"4 slurmd nodes on one host, {RANKS} training ranks (gloo on CPU) + 1 spare under ftd run, "
            f"checkpoint tier every {SAVE_EVERY} steps ({STATE_MB} MB extra state per rank), shared flush "
            f"every {FLUSH_EVERY}th save; faults on {FAULT_NODE}, corruptions of rank 0's copies on "
            f"{KEEP_NODE}"
        ),
    }


def _one(slurm: MultiNodeSlurm, work: Path, case: str, *, seed: int, **keys: Any) -> dict[str, Any]:
    slurm.reset()
    try:
        with (
            PrivateMosquitto() as broker,
            recovery_stack(slurm, broker.port, work, coordinator_keys=keys) as stack,
        ):
            return run_case(stack, case, seed=seed)
    except Exception as exc:  # a case that could not be set up is reported, not a pass
        return {"case": case, "error": f"{type(exc).__name__}: {exc}"[:2000], "right": False}
