"""``ftd bench NAME [--json]``: run one benchmark; with ``--json`` the last line is one JSON object.

Benchmarks measure; they never assert. Targets (docs/architecture.md §10) are printed beside the figures.
"""

from __future__ import annotations

import argparse
import importlib
import json
from typing import Any

# name -> (module, function, keyword arguments from the command line, target text)
BENCHES: dict[str, tuple[str, str, str]] = {
    "e2e": ("ftd.bench.e2e", "bench_e2e", "p50 <= 5 ms, p99 <= 25 ms"),
    "kmsg": ("ftd.bench.kmsg", "bench_kmsg", ">= 300,000 lines/s on one core"),
    "client": ("ftd.bench.client", "bench_client", "<= 20 us per step"),
    "storm": ("ftd.bench.storm", "bench_storm", "<= 50 bus messages for 500,000 lines, counts exact"),
    "agent": ("ftd.bench.agent", "bench_agent", "<= 1% of a core, <= 60 MB RSS"),
    "coordinator": ("ftd.bench.coordinator", "bench_coordinator", ">= 5,000 events/s, p99 <= 250 ms, 0 lost"),
    "chaos": ("ftd.bench.chaos", "bench_chaos", "lost 0, actions done twice 0, in every kill scenario"),
    "failover": (
        "ftd.bench.failover",
        "bench_failover",
        "takeover <= lease TTL + 1 s, 0 lost, 0 done twice, 0 side effects by a fenced leader",
    ),
    "fairness": ("ftd.bench.fairness", "bench_fairness", "other node's event->decision p99 <= 100 ms"),
    "sim": ("ftd.bench.sim", "bench_sim", "one simulated 54-day run at 16,384 GPUs < 60 s on one core"),
    "health": ("ftd.bench.health", "bench_health", "Slurm HealthCheckProgram well under 1 s, agent down too"),
    "dashboard": (
        "ftd.bench.dashboard",
        "bench_dashboard",
        "/v1/nodes problems query <= 50 ms at 10,000 nodes",
    ),
    "scale": (
        "ftd.bench.scale",
        "bench_scale",
        "10,000 sessions, coordinator RSS <= 500 MB, Xid p99 <= 25 ms; "
        "1,000 Last Wills decided <= 10 s, 0 lost",
    ),
    "recovery": (
        "ftd.bench.recovery",
        "bench_recovery",
        "in-allocation fault -> first step <= 10 s and <= half the requeue path; "
        "0 steps lost beyond the save step; 0 old-generation ranks in a new one",
    ),
}


def register(sub: Any) -> None:
    parser = sub.add_parser("bench", help="run a benchmark", description=__doc__)
    parser.add_argument("name", choices=sorted(BENCHES))
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument(
        "--samples", type=int, default=None, help="samples (e2e, scale, dashboard; recovery: rounds)"
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="node sessions to hold (scale), nodes known (dashboard); 10,000",
    )
    parser.add_argument("--wills", type=int, default=None, help="sessions cut at once (scale; 1,000)")
    parser.add_argument(
        "--grace",
        dest="grace_s",
        type=float,
        default=None,
        help="coordinator.offline_grace.last_will_s during the bench (scale; 0: decisions, not the grace)",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    module_name, function, target = BENCHES[args.name]
    function_ = getattr(importlib.import_module(module_name), function)
    options = {
        "e2e": ("samples",),
        "scale": ("samples", "nodes", "wills", "grace_s"),
        "dashboard": ("samples", "nodes"),
        "recovery": ("samples",),
    }.get(args.name, ())
    kwargs = {name: getattr(args, name) for name in options if getattr(args, name) is not None}
    result = function_(**kwargs)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in result.items():
            print(f"{key:>16}: {value}")
        print(f"{'target':>16}: {target}")
    return 0
