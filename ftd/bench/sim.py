"""``ftd bench sim``: how long one simulated 54-day run of ``ftd sim goodput`` takes.

One trace of the Llama 3 mix at 16,384 GPUs (the ``fast`` scenario, seed 1) through each policy,
``runs`` times; reports the median seconds per run of each policy, the faults in the trace, and the
actions the engine decided in the ftd run (every signal of every fault goes through the real engine;
periodic checkpoints are arithmetic). Target: under a minute per run on one core.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from ftd.logs import configure
from ftd.sim.goodput.faults import load_mix
from ftd.sim.goodput.model import POLICIES, from_scenario
from ftd.sim.goodput.runner import run_policy, trace_for


def bench_sim(runs: int = 3) -> dict[str, Any]:
    mix = load_mix("llama3")
    params = from_scenario(mix.scenarios["fast"])
    trace = trace_for(mix, params, 1)
    out: dict[str, Any] = {"faults": len(trace), "days": params.days, "gpus": params.job_gpus}
    for policy in POLICIES:
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            result = asyncio.run(run_policy(policy, mix, params, trace, None))
            times.append(time.perf_counter() - start)
        out[f"{policy}_s_per_run"] = round(statistics.median(times), 3)
        out[f"{policy}_ettr"] = round(result.ettr, 4)
        if policy == "ftd":
            out["engine_actions"] = sum(result.verdicts.values())
    return out


if __name__ == "__main__":
    configure("warning")  # the sandboxed engine logs every decision at info (`ftd bench` does this)
    print(bench_sim())
