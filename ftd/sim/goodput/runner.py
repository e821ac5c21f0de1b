"""Both policies over the same traces, averaged over seeds, and the checkpoint-interval sweep.

What: :func:`run` draws one trace per seed from the fault mix, runs ``no_ftd`` and ``ftd`` (a fresh
engine sandbox per run, the operator's coordinator config) over each, and returns one JSON-ready
report: the set-up, per policy the figures averaged over the seeds, and (optionally) ETTR against
the checkpoint interval with the Young/Daly optimum ``sqrt(2 x MTBF x save_s)`` marked.

Why: policies compared on the same faults differ only by what they do about them; a few seeds keep
one unlucky trace from deciding the comparison.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from ftd.sim.goodput.bridge import EngineBridge
from ftd.sim.goodput.faults import Fault, FaultMix, poisson_trace
from ftd.sim.goodput.inalloc import BENCH_COSTS, in_allocation_s
from ftd.sim.goodput.model import POLICIES, Params, Result, simulate

if TYPE_CHECKING:
    from ftd.config import CoordinatorConfig

SWEEP_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)


def young_daly_s(mtbf_s: float, save_s: float) -> float:
    """Young's (1974) / Daly's (2006) first-order optimum checkpoint interval."""
    return math.sqrt(2.0 * mtbf_s * save_s)


def trace_for(mix: FaultMix, params: Params, seed: int, scale: float = 1.0) -> list[Fault]:
    return poisson_trace(
        mix, job_gpus=params.job_gpus, nodes=params.nodes, days=params.days, seed=seed, scale=scale
    )


async def run_policy(
    policy: str,
    mix: FaultMix,
    params: Params,
    trace: list[Fault],
    cfg: CoordinatorConfig | None,
    *,
    entry_points: bool = False,
) -> Result:
    bridge = None
    if policy == "ftd":
        from ftd.config import CoordinatorConfig

        bridge = EngineBridge(
            cfg or CoordinatorConfig(),
            nodes=params.nodes + params.spare_nodes,
            entry_points=entry_points,
        )
    return await simulate(mix, params, trace, bridge)


def average(results: Sequence[Result]) -> dict[str, Any]:
    """The figures of :meth:`Result.to_json` averaged over runs (verdict counts summed)."""
    docs = [r.to_json() for r in results]
    out: dict[str, Any] = {"policy": docs[0]["policy"], "runs": len(docs)}
    for key, value in docs[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = sum(d[key] for d in docs) / len(docs)
        elif isinstance(value, dict):
            keys = sorted({k for d in docs for k in d[key]})
            out[key] = {k: sum(d[key].get(k, 0.0) for d in docs) / len(docs) for k in keys}
    counts: dict[tuple[str, str], int] = {}
    for d in docs:
        for v in d["engine_verdicts"]:
            counts[(v["kind"], v["verdict"])] = counts.get((v["kind"], v["verdict"]), 0) + v["count"]
    out["engine_verdicts"] = [{"kind": k, "verdict": v, "count": n} for (k, v), n in sorted(counts.items())]
    out["ettr_by_seed"] = [d["ettr"] for d in docs]
    return out


def run(
    mix: FaultMix,
    params: Params,
    cfg: CoordinatorConfig | None = None,
    *,
    seeds: Sequence[int] = (1, 2, 3),
    sweep: Sequence[float] | None = None,
    sweep_seeds: Sequence[int] | None = None,
    traces: Sequence[list[Fault]] | None = None,
    entry_points: bool = False,
    progress: Callable[[str], None] | None = None,
    policies: Sequence[str] = POLICIES,
) -> dict[str, Any]:
    """The whole report (see the module docstring). ``traces`` replaces the drawn ones (recordings)."""
    started = time.perf_counter()
    drawn = list(traces) if traces is not None else [trace_for(mix, params, s) for s in seeds]
    results: dict[str, list[Result]] = {p: [] for p in policies}
    timings: list[float] = []
    for i, trace in enumerate(drawn):
        for policy in policies:
            t0 = time.perf_counter()
            result = asyncio.run(run_policy(policy, mix, params, trace, cfg, entry_points=entry_points))
            results[policy].append(result)
            timings.append(time.perf_counter() - t0)
            if progress:
                progress(f"trace {i + 1}/{len(drawn)} {policy}: {timings[-1]:.1f} s")
    mtbf = mix.job_mtbf_s(params.job_gpus)
    optimum = young_daly_s(mtbf, params.save_s)
    report: dict[str, Any] = {
        "mix": {
            "name": mix.name,
            "title": mix.title,
            "source": mix.source,
            "days": mix.days,
            "gpus": mix.gpus,
        },
        "params": {name: getattr(params, name) for name in Params.names()},
        "nodes": params.nodes,
        "seeds": list(seeds) if traces is None else [],
        "faults_per_run": sum(len(t) for t in drawn) / max(1, len(drawn)),
        "job_mtbf_h": mtbf / 3600.0,
        "young_daly_s": optimum,
        "restart_costs": {
            "requeue_s": params.restart_s + params.load_s,
            "in_allocation_s": in_allocation_s(params.load_s, warm=params.warm_spares),
            "in_allocation_terms": asdict(BENCH_COSTS),
        },
        "policies": {p: average(rs) for p, rs in results.items() if rs},
        "sweep": [],
        "seconds_per_run": sum(timings) / max(1, len(timings)),
    }
    if sweep is not None:
        intervals = sorted(set(sweep))
        for extra in (round(optimum, 1), params.checkpoint_interval_s):
            if not any(abs(extra - i) <= 0.01 * i for i in intervals):
                intervals = sorted([*intervals, extra])
        sweep_traces = drawn
        if traces is None:
            sweep_traces = [trace_for(mix, params, s) for s in (sweep_seeds or seeds)]
        for interval in intervals:
            point: dict[str, Any] = {"checkpoint_interval_s": interval}
            for policy in policies:
                p = params.replace(checkpoint_interval_s=interval)
                ettrs = [
                    asyncio.run(run_policy(policy, mix, p, t, cfg, entry_points=entry_points)).ettr
                    for t in sweep_traces
                ]
                point[policy] = sum(ettrs) / len(ettrs)
            report["sweep"].append(point)
            if progress:
                progress(f"sweep {interval:.0f} s done")
    report["elapsed_s"] = time.perf_counter() - started
    return report


def default_sweep(params: Params, mix: FaultMix) -> list[float]:
    optimum = young_daly_s(mix.job_mtbf_s(params.job_gpus), params.save_s)
    return [round(optimum * f, 1) for f in SWEEP_FACTORS]
