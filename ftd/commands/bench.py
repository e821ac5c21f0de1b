"""``ftd bench NAME [--check] [--json]``: run one benchmark and judge it against its targets.

The figures are printed with the bench's documented targets and the verdict on each (one place:
:mod:`ftd.bench.targets`, which docs/architecture.md §10's table is checked against); with
``--json`` the last line is one JSON object, the figures plus ``verdict``. Benchmarks measure; with
``--check`` the command also judges: it exits 1 when a target is missed or a figure it is judged on
was not measured (a check that could not run is not a pass), 0 when every target is met.
"""

from __future__ import annotations

import argparse
import importlib
import json
from typing import Any

from ftd.bench.targets import TARGETS, judge

# name -> (module, function)
BENCHES: dict[str, tuple[str, str]] = {
    "e2e": ("ftd.bench.e2e", "bench_e2e"),
    "kmsg": ("ftd.bench.kmsg", "bench_kmsg"),
    "client": ("ftd.bench.client", "bench_client"),
    "storm": ("ftd.bench.storm", "bench_storm"),
    "agent": ("ftd.bench.agent", "bench_agent"),
    "coordinator": ("ftd.bench.coordinator", "bench_coordinator"),
    "chaos": ("ftd.bench.chaos", "bench_chaos"),
    "failover": ("ftd.bench.failover", "bench_failover"),
    "fairness": ("ftd.bench.fairness", "bench_fairness"),
    "sim": ("ftd.bench.sim", "bench_sim"),
    "health": ("ftd.bench.health", "bench_health"),
    "dashboard": ("ftd.bench.dashboard", "bench_dashboard"),
    "inventory": ("ftd.bench.inventory", "bench_inventory"),
    "scale": ("ftd.bench.scale", "bench_scale"),
    "recovery": ("ftd.bench.recovery", "bench_recovery"),
    "checkpoint": ("ftd.bench.checkpoint", "bench_checkpoint"),
    "culprit": ("ftd.bench.culprit", "bench_culprit"),
    "preemption": ("ftd.bench.preemption", "bench_preemption"),
    "fabric": ("ftd.bench.fabric", "bench_fabric"),
    "pairs": ("ftd.bench.pairs", "bench_pairs"),
}

#: The command-line options each bench takes (the bench function's keyword of the same name).
OPTIONS: dict[str, tuple[str, ...]] = {
    "e2e": ("samples",),
    "scale": ("samples", "nodes", "wills", "grace_s"),
    "dashboard": ("samples", "nodes"),
    "inventory": ("nodes",),
    "recovery": ("samples", "paths"),
    "fairness": ("rate", "seconds", "probes", "severity"),
    "checkpoint": ("cases", "sizes", "samples", "runs"),
    "culprit": ("runs", "cases", "seed"),
    "preemption": ("runs", "cases"),
    "fabric": ("samples",),
    "pairs": ("runs", "seconds", "nodes", "seed"),
}


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "bench",
        help="run a benchmark",
        description="Run one benchmark and judge it against its targets. The figures are printed with "
        "the benchmark's documented targets (docs/architecture.md, section 10) and the verdict on each; "
        "with --json the last line is one JSON object, the figures plus the verdict. With --check the "
        "command exits 1 when a target is missed or a figure it is judged on was not measured (a check "
        "that could not run is not a pass), 0 when every target is met.",
    )
    parser.add_argument("name", choices=sorted(BENCHES))
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a documented target is missed or a judged figure was not measured",
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=None,
        help="samples (e2e, scale, dashboard; recovery: rounds; checkpoint: saves per size)",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="node sessions to hold (scale), nodes known (dashboard), inventories held (inventory); 10,000; "
        "pairs: namespaces (16)",
    )
    parser.add_argument("--wills", type=int, default=None, help="sessions cut at once (scale; 1,000)")
    parser.add_argument(
        "--grace",
        dest="grace_s",
        type=float,
        default=None,
        help="coordinator.offline_grace.last_will_s during the bench (scale; 0: decisions, not the grace)",
    )
    parser.add_argument(
        "--rate",
        type=_positive,
        default=None,
        help="fairness: pace the flood at this many events/s (e.g. 10000); default as fast as accepted",
    )
    parser.add_argument(
        "--seconds",
        type=_positive,
        default=None,
        help="fairness: how long the flood lasts (15); pairs: the pingmesh window (60)",
    )
    parser.add_argument(
        "--probes",
        type=_positive_int,
        default=None,
        help="fairness: the other node's probes during the flood (300)",
    )
    parser.add_argument(
        "--severity",
        choices=("info", "error", "mix"),
        default=None,
        help="fairness: the flood's events' severity (info; mix: info, warning, error in turn)",
    )
    parser.add_argument(
        "--paths",
        type=_names,
        default=None,
        help="recovery: only these paths, comma-separated (in_allocation,in_allocation_cold,requeue,"
        "rank_killed,torchrun,ft_launcher); --check then misses the others' targets (not measured)",
    )
    parser.add_argument(
        "--cases",
        type=_names,
        default=None,
        help="checkpoint: only these cases, comma-separated (blocked,partner; the fault cases "
        "kill_mid_save,local_deleted,flip_byte,truncate,missing_manifest); culprit: only these cases "
        "(stopped,stuck,slowed,throttled,slowed_all,job_wide,clean,e2e_during_collection); preemption: "
        "preempt,slow_save; default every one "
        "(--check then misses the others' targets: not measured)",
    )
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=None,
        help="checkpoint: state sizes in MB, comma-separated (10,100,1000)",
    )
    parser.add_argument(
        "--runs",
        type=_positive_int,
        default=None,
        help="checkpoint: runs of each fault case; culprit: runs per case, each a new victim (1); "
        "preemption: preemptions of the README loop (20); pairs: runs with a degraded node (10)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="culprit: the victims' random seed (0); pairs: the degraded nodes' seed",
    )
    parser.set_defaults(handler=_run)


def _sizes(text: str) -> list[int]:
    sizes = [_positive_int(n.strip()) for n in text.split(",") if n.strip()]
    if not sizes:
        raise argparse.ArgumentTypeError("name at least one size")
    return sizes


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("name at least one path")
    return names


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text}")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def bench_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``args.name``'s bench given on the command line; an option another
    bench takes is refused (it would be ignored silently)."""
    allowed = OPTIONS.get(args.name, ())
    given = {name for names in OPTIONS.values() for name in names if getattr(args, name, None) is not None}
    foreign = sorted(given - set(allowed))
    if foreign:
        flags = ", ".join("--" + name.removesuffix("_s").replace("_", "-") for name in foreign)
        raise SystemExit(f"ftd bench {args.name}: {flags} not taken by this bench")
    return {name: getattr(args, name) for name in allowed if getattr(args, name) is not None}


def _run(args: argparse.Namespace) -> int:
    module_name, function = BENCHES[args.name]
    kwargs = bench_options(args)
    function_ = getattr(importlib.import_module(module_name), function)
    result = function_(**kwargs)
    verdict = judge(args.name, result)
    if args.json:
        print(json.dumps({**result, "verdict": verdict.as_dict()}, sort_keys=True, default=str))
    else:
        for key, value in result.items():
            print(f"{key:>16}: {value}")
        print(f"{'target':>16}: {TARGETS[args.name].text}")
        for line in verdict.lines():
            print(f"    {line}")
    return verdict.exit_code if args.check else 0
