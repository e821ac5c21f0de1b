"""``ftd preflight [--config PATH] [--skip CHECK] [--json]``: is this node fit for work?

What: runs the node checks of :mod:`ftd.agent.preflight` (GPU count and UUIDs against the inventory, NVML
health, ECC and row remapping, a device memory allocation and small compute with torch, ``dcgmi diag
-r 1`` with DCGM, a single-node NCCL all-reduce, the site's own commands) and exits 0 when none
failed, else 1 with one line ``preflight failed: CHECK: reason``. A check whose tool or GPU is
absent is skipped with the reason (``-v`` lists every check); on a node with GPUs, the compute and
NCCL checks skipped because torch is missing or sees no CUDA GPU are named in the passing line too
(``... skipped; not checked on this GPU node: gpu_compute: torch is not installed; ...``): the
documented install has no torch, and a bare "passed" would hide that the GPUs were never exercised.
Fail closed: when no check could run at all (NVML failing, nothing else installed or configured) it
exits 3 with ``preflight could not check this node: ...``, which a gate treats as a failure, unless
the site opts out explicitly (``--allow-unchecked`` or ``agent.preflight.allow_unchecked``). Usable as
a Slurm Prolog gate (a failing Prolog drains the node) and run by the agent for the coordinator's
return to service.

``--config`` reads the agent's configuration (``agent.nvml.expected_gpus``, ``agent.state_dir`` for
the inventory, ``agent.preflight``); without it the defaults apply.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "preflight",
        help="node checks before (re)entering service; exit 1 with a reason, 3 when nothing could be checked",
    )
    p.add_argument("--config", default=None, help="agent config file (expected GPUs, state_dir, checks)")
    p.add_argument("--skip", action="append", default=[], metavar="CHECK", help="a check not to run")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--allow-unchecked",
        action="store_true",
        default=None,
        help="pass (exit 0) even when no check could run (default: exit 3; agent.preflight.allow_unchecked)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="print every check's result")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ftd.agent.preflight.runner import CHECKS, run_preflight
    from ftd.config import AgentConfig

    unknown = sorted(set(args.skip) - set(CHECKS))
    if unknown:
        print(f"preflight: unknown check(s) {', '.join(unknown)}; checks: {', '.join(CHECKS)}")
        return 2
    if args.config:
        from ftd.config import ConfigError, load_config

        try:
            cfg = load_config(args.config).agent
        except ConfigError as exc:
            print(f"preflight: {args.config}: {exc}")
            return 2
    else:
        cfg = AgentConfig()
    report = run_preflight(cfg, skip=set(args.skip), allow_unchecked=args.allow_unchecked)
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        if args.verbose:
            for check in report.checks:
                print(f"{check.name:15} {check.status:5} {check.reason}".rstrip())
        verdict = "passed" if report.ok else "could not check this node" if report.unchecked else "failed"
        print(f"preflight {verdict}: {report.reason}")
    return report.exit_code
