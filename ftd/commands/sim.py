"""``ftd sim goodput``: how much training time ftd saves on a published fault mix.

What: a discrete-event simulation (:mod:`ftd.sim.goodput`) of one large training job over weeks of
simulated time. Faults come from a trace: a fault mix (``--trace llama3``, the default, or
``opt175b``, or a TOML file in the same format) drawn as Poisson arrivals scaled to the job's GPUs
and ``--days``, or a recording (``--events FILE``, JSON lines from ``ftd events export``: one fault
per incident, see :func:`ftd.sim.goodput.faults.recorded_trace`). Two policies run over the same
faults: no ftd (NCCL watchdog, launcher, humans) and ftd with the coordinator config (``--config``;
default: the built-in defaults), whose decisions come from the real engine on a simulated clock.
Prints a table (ETTR, lost GPU-hours by cause, restarts, nodes drained, mean time to recover), what
each percentage point was lost to, and ETTR against the checkpoint interval with the Young/Daly
optimum; ``--plot FILE.png`` draws both; ``--json`` prints every figure as one JSON object. The last
run's JSON is also written to ``--state`` (default: beside the ledger of ``--config``'s coordinator,
whose dashboard shows it; without ``--config``, ``$XDG_STATE_HOME/ftd/goodput-last.json``).

Set-up: ``--scenario`` picks a named set-up from the mix file (``meta``: Meta's Llama 3 set-up as
best known; ``fast``: in-memory checkpoints and hot spares; ``ftd-spares``: ``meta`` with the job
under ``ftd run`` with hot spares in its allocation, restarted in the allocation at the cost
``ftd bench recovery`` measured, :mod:`ftd.sim.goodput.inalloc`); every flag overrides one value.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

PARAM_FLAGS = (
    ("job_gpus", int, "GPUs of the job"),
    ("gpus_per_node", int, "GPUs per node"),
    ("spare_nodes", int, "spare nodes"),
    ("days", float, "simulated days"),
    ("checkpoint_interval_s", float, "training seconds between periodic checkpoints"),
    ("save_s", float, "blocking seconds of one checkpoint save"),
    ("load_s", float, "seconds to load a checkpoint at restart"),
    ("restart_s", float, "seconds to requeue and re-initialise the job"),
    ("watchdog_s", float, "NCCL watchdog timeout: how long a hang lasts without ftd (600; 1800 common)"),
    ("crash_detect_s", float, "seconds until the launcher ends a job whose rank crashed"),
    ("same_node_p", float, "probability that a restart without ftd gets the same bad node back"),
    ("silent_detect_s", float, "seconds until a human finds a fault with no signal"),
    ("recurrence_mean_s", float, "mean seconds until a bad node the job is put back on fails again"),
    ("ftd_detect_s", float, "ftd's signal -> directive latency (default: `ftd bench e2e` p99)"),
    ("preflight_s", float, "preflight seconds before a repaired node returns to service"),
    ("alloc_spares", int, "hot spares in the job's allocation (with --in-allocation)"),
    (
        "spare_replenish_s",
        float,
        "seconds after a hot spare is used until a free node replaces it (0: never)",
    ),
)

BOOL_FLAGS = (
    (
        "in_allocation",
        "the job runs under ftd run: ftd restarts it in its allocation while a spare is left",
    ),
    ("warm_spares", "the supervisors keep pre-started interpreters (ftd run --warm)"),
    ("spares_return", "a node the job left rejoins its allocation as a hot spare once repaired"),
)


NON_NEGATIVE = (
    "spare_nodes",
    "save_s",
    "load_s",
    "restart_s",
    "watchdog_s",
    "crash_detect_s",
    "silent_detect_s",
    "ftd_detect_s",
    "preflight_s",
    "alloc_spares",
    "spare_replenish_s",
)


def state_path(given: str | None, ledger_path: str | None) -> Path:
    """``--state``; else, with ``--config``, beside that coordinator's ledger (its dashboard shows it:
    ``GET /v1/sim/goodput``); else ``$XDG_STATE_HOME/ftd/goodput-last.json``."""
    from ftd.sim.goodput import LAST_RUN, last_run_path

    if given:
        return Path(given)
    beside_ledger = last_run_path(ledger_path) if ledger_path else None
    if beside_ledger is not None:
        return beside_ledger
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "ftd" / LAST_RUN


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sim", help="simulations (goodput)", description="Simulate ftd on a cluster."
    )
    sub = parser.add_subparsers(dest="sim_what", metavar="WHAT")
    g = sub.add_parser(
        "goodput",
        help="ETTR with and without ftd over a published fault mix",
        description="Simulate one training job over weeks with faults from a trace; compare no ftd and "
        "ftd (the real engine, your config). Prints ETTR and where the time went.",
    )
    g.add_argument("--trace", default="llama3", help="llama3 | opt175b | a fault-mix TOML file")
    g.add_argument(
        "--events",
        metavar="FILE",
        help="faults from a recording (the JSON lines of ftd events export) instead of the mix; the set-up "
        "comes from --trace's --scenario",
    )
    g.add_argument(
        "--scenario",
        help="a set-up named in the mix file (llama3: meta, fast, ftd-spares, measured; opt175b: opt)",
    )
    g.add_argument("--config", metavar="PATH", help="coordinator config (rules, policy); default: built-in")
    g.add_argument("--seed", type=int, default=1, help="first seed (default 1)")
    g.add_argument("--seeds", type=int, default=3, help="traces to average over (default 3)")
    g.add_argument("--no-sweep", action="store_true", help="skip the checkpoint-interval sweep")
    g.add_argument("--sweep-seeds", type=int, default=1, help="traces per sweep point (default 1)")
    g.add_argument("--plot", metavar="FILE.png", help="write the PNG (needs matplotlib: ftd[sim])")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument("--state", metavar="PATH", help="where the last run's JSON goes (the dashboard's)")
    g.add_argument("--no-entry-points", action="store_true", help="do not load ftd entry-point plugins")
    for name, kind, text in PARAM_FLAGS:
        g.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, help=text)
    for name, text in BOOL_FLAGS:
        g.add_argument(
            f"--{name.replace('_', '-')}", dest=name, action=argparse.BooleanOptionalAction, help=text
        )
    g.set_defaults(handler=run_goodput)
    parser.set_defaults(handler=lambda _args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_usage(sys.stderr)
    print("ftd sim: try `ftd sim goodput`", file=sys.stderr)
    return 2


def _fail(message: str) -> int:
    print(f"ftd sim goodput: {message}", file=sys.stderr)
    return 2


def run_goodput(args: argparse.Namespace) -> int:
    from ftd.config import Config, ConfigError, load_config
    from ftd.coordinator.decide.plugins import PluginError
    from ftd.sim.goodput.faults import MixError, load_mix, recorded_trace
    from ftd.sim.goodput.model import from_scenario
    from ftd.sim.goodput.report import plot, render_text
    from ftd.sim.goodput.runner import default_sweep, run

    try:
        mix = load_mix(args.trace)
        config = load_config(args.config) if args.config else Config()
    except (MixError, ConfigError) as exc:
        return _fail(str(exc))
    scenario_name = args.scenario or next(iter(mix.scenarios), None)
    if scenario_name is not None and scenario_name not in mix.scenarios:
        known = ", ".join(mix.scenarios) or "none"
        return _fail(f"no scenario {scenario_name!r} in {args.trace} (known: {known})")
    scenario = mix.scenarios.get(scenario_name, {}) if scenario_name else {}
    overrides = {name: getattr(args, name) for name, _, _ in PARAM_FLAGS}
    overrides.update({name: getattr(args, name) for name, _ in BOOL_FLAGS})
    if overrides["days"] is None:
        overrides["days"] = scenario.get("days", mix.days)
    try:
        params = from_scenario(scenario, **overrides)
    except TypeError as exc:
        return _fail(f"scenario {scenario_name}: {exc}")
    problems = [
        f"--{n.replace('_', '-')} must be > 0"
        for n in ("job_gpus", "gpus_per_node", "days", "checkpoint_interval_s", "recurrence_mean_s")
        if getattr(params, n) <= 0
    ]
    problems += [f"--{n.replace('_', '-')} must be >= 0" for n in NON_NEGATIVE if getattr(params, n) < 0]
    if not 0 <= params.same_node_p <= 1:
        problems.append("--same-node-p must be within [0, 1]")
    if problems:
        return _fail("; ".join(problems))
    traces = None
    recording: dict[str, int] | None = None
    if args.events:
        try:
            with open(args.events, "rb") as stream:
                mix, trace, recording = recorded_trace(stream, nodes=params.nodes, job_gpus=params.job_gpus)
        except OSError as exc:
            return _fail(f"cannot read {args.events}: {exc.strerror or exc}")
        except MixError as exc:
            return _fail(f"{args.events}: {exc}")
        if args.days is None:
            params = params.replace(days=mix.days)
        traces = [trace]
    seeds = [args.seed + i for i in range(max(1, args.seeds))]
    sweep = None if args.no_sweep else default_sweep(params, mix)
    progress = None if args.json or not sys.stderr.isatty() else lambda m: print(m, file=sys.stderr)
    try:
        report = run(
            mix,
            params,
            config.coordinator,
            seeds=seeds,
            sweep=sweep,
            sweep_seeds=seeds[: max(1, args.sweep_seeds)],
            entry_points=not args.no_entry_points,
            progress=progress,
            traces=traces,
        )
    except PluginError as exc:
        return _fail(str(exc))
    report["scenario"] = scenario_name
    if recording is not None:
        report["recording"] = {"path": args.events, **recording}
    report["config"] = args.config or "(built-in defaults)"
    if args.plot:
        try:
            report["plot"] = str(plot(report, args.plot))
        except ModuleNotFoundError:
            return _fail("--plot needs matplotlib (pip install 'ftd-daemon[sim]')")
        except OSError as exc:
            return _fail(f"cannot write {args.plot}: {exc.strerror or exc}")
    _save_state(report, state_path(args.state, config.coordinator.ledger_path if args.config else None))
    if args.json:
        print(json.dumps(report))
    else:
        render_text(report, sys.stdout)
        if args.plot:
            print(f"plot: {args.plot}")
    return 0


def _save_state(report: dict[str, Any], path: Path) -> None:
    """The last run for the dashboard; a state directory that cannot be written is not an error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report))
        tmp.replace(path)
    except OSError as exc:
        print(f"ftd sim goodput: last run not saved to {path}: {exc.strerror or exc}", file=sys.stderr)
