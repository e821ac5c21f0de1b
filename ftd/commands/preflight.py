"""``ftd preflight [--config PATH] [--skip CHECK] [--json]``: is this node fit for work?

What: runs the node checks of :mod:`ftd.agent.preflight` (GPU count and UUIDs against the inventory, NVML
health, ECC and row remapping, a device memory allocation and small compute with torch, ``dcgmi diag
-r 1`` with DCGM, a single-node NCCL all-reduce, the site's own commands, and ``rdma``: the node's share
of the RDMA path, :mod:`ftd.agent.job_checks.node_check`) and exits 0 when none
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

``--pair-peer NODE=HOST:PORT`` adds ``pair_test``: one pair test against that known-good idle agent
(issue #35), judged like the burn-in's pair step; slow or not completed fails preflight. The
coordinator's ``preflight`` action does the same when its request names a ``pair_peer``.

``--burn-in`` runs the long burn-in instead (:mod:`ftd.agent.preflight.burn_in`: ``dcgmi diag -r 3``,
a GPU memory test over most of the memory, a matmul throughput probe judged against the hardware
profile and the fleet, the pair test), refuses on a node that runs a job (the jobs the Prolog
reported, in ``agent.state_dir``), writes its report (JSON and text) under
``{state_dir}/burn-in/`` and exits 0 passed, 1 failed, 3 incomplete (a step skipped), 4 refused.

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
    p.add_argument(
        "--pair-peer",
        default=None,
        metavar="NODE=HOST:PORT",
        help="also run a pair test against this known-good idle agent (its pair-test server; the key in "
        "agent.pair_tests.key_file); a slow or failed test fails preflight",
    )
    p.add_argument(
        "--burn-in",
        action="store_true",
        help="the long burn-in (DCGM level 3, memory test, matmul vs the profile, pair test) with a report; "
        "exit 0 passed, 1 failed, 3 incomplete, 4 refused (the node runs a job)",
    )
    p.set_defaults(handler=run)


BURN_IN_EXIT = {"passed": 0, "failed": 1, "incomplete": 3, "refused": 4}
BURN_IN_STEPS = ("dcgm", "memtest", "matmul", "pair")


def run_burn_in(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from ftd.agent.jobs import SchedulerJobs
    from ftd.agent.preflight.burn_in import node_profile, plan_for, run_burn_in, save_report
    from ftd.config import ConfigError, load_config
    from ftd.config.schema import Config

    unknown = sorted(set(args.skip) - set(BURN_IN_STEPS))
    if unknown:
        print(f"burn-in: unknown step(s) {', '.join(unknown)}; steps: {', '.join(BURN_IN_STEPS)}")
        return 2
    try:
        full = load_config(args.config) if args.config else Config()
    except ConfigError as exc:
        print(f"burn-in: {args.config}: {exc}")
        return 2
    cfg = full.agent
    backend = None
    if cfg.nvml.enabled:
        from ftd.agent.watchers.nvml.real import RealNvml

        backend = RealNvml()
    profile, how = node_profile(full.hardware, backend)
    plan = plan_for(cfg, full.hardware, profile, skip=frozenset(args.skip))
    state = Path(cfg.state_dir)

    def training() -> list[str]:
        return sorted(SchedulerJobs(state / "jobs.json").all())

    report = asyncio.run(run_burn_in(cfg.resolved_node(), plan, training=training, profile=profile))
    where = None
    if report.verdict != "refused":
        try:
            where = save_report(report, state / "burn-in")
        except OSError as exc:
            print(f"burn-in: report not saved under {state / 'burn-in'}: {exc}")
    if args.json:
        print(json.dumps({**report.to_dict(), "profile_from": how, "report": str(where) if where else None}))
    else:
        print(report.text(), end="")
        if where is not None:
            print(f"report: {where}")
    return BURN_IN_EXIT[report.verdict]


def _pair_check(cfg: Any, hardware: Any, spec: str) -> Any:
    """``--pair-peer NODE=HOST:PORT`` as a preflight check: one pair test through the agent's own
    pair-test code (its key, caps, and never while a job trains here), judged like the burn-in's pair
    step against the node's hardware profile; None when ``spec`` is malformed."""
    import asyncio
    from pathlib import Path

    from ftd.agent.jobs import SchedulerJobs
    from ftd.agent.pair_tests.check import pair_check
    from ftd.agent.pair_tests.service import PairTestService, training
    from ftd.agent.preflight.burn_in import node_profile

    node, _, where = spec.partition("=")
    host, _, port = where.rpartition(":")
    if not node or not host or not port.isdecimal():
        return None
    jobs = SchedulerJobs(Path(cfg.state_dir) / "jobs.json")
    service = PairTestService(cfg.pair_tests, cfg.resolved_node(), busy=training(dict, jobs.all))
    peer = {"node": node, "host": host, "port": int(port)}

    def check() -> tuple[str, str]:
        profile, _ = node_profile(hardware, None)
        done = asyncio.run(pair_check(service, peer, profile, name="pair_test", catalog=hardware.catalog))
        return {"pass": "pass", "skip": "skip"}.get(done.status, "fail"), done.reason

    return check


def run(args: argparse.Namespace) -> int:
    from ftd.agent.preflight.runner import CHECKS, run_preflight
    from ftd.config import AgentConfig
    from ftd.config.schema import HardwareConfig

    if args.burn_in:
        return run_burn_in(args)

    names = (*CHECKS, "rdma", "pair_test")
    unknown = sorted(set(args.skip) - set(names))
    if unknown:
        print(f"preflight: unknown check(s) {', '.join(unknown)}; checks: {', '.join(names)}")
        return 2
    if args.config:
        from ftd.config import ConfigError, load_config

        try:
            full = load_config(args.config)
            cfg, hardware = full.agent, full.hardware
        except ConfigError as exc:
            print(f"preflight: {args.config}: {exc}")
            return 2
    else:
        cfg, hardware = AgentConfig(), HardwareConfig()
    extra = {}
    if cfg.job_checks.enabled:  # the node's share of the RDMA path: peermem, ACS, IOMMU (issue #36)
        from functools import partial

        from ftd.agent.job_checks.node_check import rdma_node_check

        extra["rdma"] = partial(rdma_node_check, cfg.job_checks)
    if args.pair_peer:
        pair = _pair_check(cfg, hardware, args.pair_peer)
        if pair is None:
            print(f"preflight: --pair-peer {args.pair_peer!r}: expected NODE=HOST:PORT")
            return 2
        extra["pair_test"] = pair
    report = run_preflight(cfg, skip=set(args.skip), allow_unchecked=args.allow_unchecked, extra=extra)
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        if args.verbose:
            for check in report.checks:
                print(f"{check.name:15} {check.status:5} {check.reason}".rstrip())
        verdict = "passed" if report.ok else "could not check this node" if report.unchecked else "failed"
        print(f"preflight {verdict}: {report.reason}")
    return report.exit_code
