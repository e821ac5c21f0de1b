"""``ftd check-config PATH [--explain]``: validate a config file before a daemon is (re)started on it.

What: loads PATH exactly as ``ftd agent``/``ftd coordinator`` would; prints ``OK: PATH`` and the
effective settings an operator most often gets wrong (node name, broker, scheduler), exit 0; or
prints every problem to stderr, one per line as ``PATH: dotted.path: message``, exit 2.
``--explain`` lists every option, the keys of arrays of tables (``[[agent.fs.mounts]]``) included,
with its type, default and description (no PATH needed; the text comes from :mod:`ftd.config.explain`).

Why: config mistakes should surface in a deploy step (Ansible ``validate=``, a CI job, ``ExecStartPre=``),
all at once, not as a daemon that restarts in a loop. The password file is *not* read here: it is
often only readable inside the service's credential sandbox.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ftd.config import Config


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "check-config",
        help="validate a config file and report every problem",
        description="Validate an ftd TOML config file; exit 0 if valid, 2 with every problem listed if not.",
    )
    parser.add_argument("path", nargs="?", metavar="PATH", help="config file (optional with --explain)")
    parser.add_argument(
        "--explain", action="store_true", help="list every option with its type, default and description"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ftd.config import ConfigError, load_config

    if args.explain:
        print(explain())
        if args.path is None:
            return 0
        print()
    if args.path is None:
        print("ftd check-config: error: PATH is required (or use --explain)", file=sys.stderr)
        return 2
    try:
        config = load_config(args.path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        count = len(exc.problems)
        print(f"{count} problem{'s' if count != 1 else ''} in {args.path}", file=sys.stderr)
        return 2
    print(f"OK: {args.path}")
    print(summary(config))
    return 0


def summary(config: Config) -> str:
    """A few lines on the effective settings: what a typo or a forgotten section would change."""
    agent, bus, coord = config.agent, config.bus, config.coordinator
    node = agent.resolved_node() + ("" if agent.node else " (from the host name)")
    if bus.embedded:
        broker = "embedded in-process broker"
    else:
        user = f"{bus.username}@" if bus.username else ""
        broker = f"{'mqtts' if bus.tls else 'mqtt'}://{user}{bus.host}:{bus.port}"
        if bus.password_file is not None:
            broker += f" (password from {bus.password_file})"
        elif bus.password is not None:
            broker += " (password inline)"
    scheduler = coord.scheduler
    if coord.scheduler == "slurm":
        scheduler += f" via {coord.slurm.scontrol}" if coord.slurm.enabled else " (slurm.enabled = false)"
    if coord.policy.dry_run:
        scheduler += "; policy dry-run: no action is executed"
    return "\n".join([f"  node:      {node}", f"  broker:    {broker}", f"  scheduler: {scheduler}"])


def explain() -> str:
    """Every option, nested tables' keys included, grouped by table, with type, default and description."""
    from ftd.config import explain_text

    return explain_text()
