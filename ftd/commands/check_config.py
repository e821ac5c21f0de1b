"""``ftd check-config PATH [--for DAEMON] [--no-files] [--explain]``: check a config before a daemon
is (re)started on it.

What: checks PATH exactly as ``ftd agent``/``ftd coordinator`` do when they start
(:func:`ftd.commands.config_check.check_config_file`): keys, types, bounds, rules between options, and
the files, directories and rules the file names (CA bundle, secret files, kmsg source, state and socket
directories, ledger, rule directories and rules file, scontrol, ...). Prints ``OK: PATH`` and the
effective settings an operator most often gets wrong (node name, broker, scheduler), exit 0; or prints
every problem to stderr, one per line as ``PATH: dotted.path: message``, then their count, exit 2.
``--explain`` lists every option, the keys of arrays of tables (``[[agent.fs.mounts]]``) included, with
its type, default and description (no PATH needed; the text comes from :mod:`ftd.config.explain`).

Which daemon: ``--for agent`` / ``--for coordinator``; by default the daemons whose table the file
has (both when it has neither). ``--no-files`` checks the file alone, for a config checked away
from the machine it is for (CI, a config repository).

Why: config mistakes should surface in a deploy step (Ansible ``validate=``, a CI job, ``ExecStartPre=``),
all at once, not as a daemon that restarts in a loop. Files are checked as the user running the
check (a permission problem says which user). A relative secret file name (``password_file =
"mqtt-password"``) resolves against ``$CREDENTIALS_DIRECTORY``, which only systemd's service
sandbox has: outside it, such names are listed as not checked rather than reported missing.
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
        description="Validate an ftd TOML config file and the files it names, as the daemons do when they "
        "start; exit 0 if valid, 2 with every problem listed if not.",
    )
    parser.add_argument("path", nargs="?", metavar="PATH", help="config file (optional with --explain)")
    parser.add_argument(
        "--for",
        dest="roles",
        action="append",
        choices=("agent", "coordinator"),
        metavar="DAEMON",
        help="check for this daemon: agent or coordinator (repeatable); "
        "default: the daemons whose table the file has, both if neither",
    )
    parser.add_argument(
        "--no-files",
        action="store_true",
        help="check the file alone, not the files and directories it names (away from its machine)",
    )
    parser.add_argument(
        "--explain", action="store_true", help="list every option with its type, default and description"
    )
    parser.add_argument(
        "--grace",
        action="store_true",
        help="also ask Slurm (scontrol) for KillWait and each partition's GraceTime and warn where they "
        "are shorter than coordinator.save_deadline_s (the grace audit; exit status unchanged)",
    )
    parser.add_argument(
        "--stop-grace",
        type=float,
        metavar="S",
        help="with --grace: the launcher's stop grace (ftd run --stop-grace) to audit as well",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ftd.commands.config_check import check_config_file
    from ftd.config import ConfigError

    if args.explain:
        print(explain())
        if args.path is None:
            return 0
        print()
    if args.path is None:
        print("ftd check-config: error: PATH is required (or use --explain)", file=sys.stderr)
        return 2
    try:
        checked = check_config_file(args.path, roles=args.roles, files=not args.no_files, in_service=False)
    except ConfigError as exc:
        print(exc.report(), file=sys.stderr)
        return 2
    print(f"OK: {args.path}")
    print(summary(checked.config, checked.roles))
    if args.no_files:
        print("  files:     not checked (--no-files)")
    else:
        print(f"  files:     checked for the {' and the '.join(checked.roles)}")
    for option in checked.deferred:
        print(f"  not checked: {option} (a relative name: read from $CREDENTIALS_DIRECTORY in the service)")
    if getattr(args, "grace", False):
        print(grace_report(checked.config, getattr(args, "stop_grace", None)))
    return 0


def grace_report(config: Config, stop_grace_s: float | None) -> str:
    """The grace audit's lines (docs/deadlines.md "Slurm"): Slurm's KillWait and partitions'
    GraceTime, read with the coordinator's scontrol, against ``coordinator.save_deadline_s``."""
    import asyncio

    from ftd.coordinator.actions.scheduler import SchedulerError
    from ftd.coordinator.actions.slurm import SlurmScheduler
    from ftd.coordinator.decide.grace_audit import audit_grace

    coord = config.coordinator
    if coord.scheduler != "slurm":
        return f"  grace:     not audited (scheduler is {coord.scheduler}, not slurm)"
    slurm = SlurmScheduler(coord.slurm.scontrol, coord.slurm.slurm_conf, coord.slurm.timeout_s)
    try:
        grace = asyncio.run(slurm.grace())
    except SchedulerError as exc:
        return f"  grace:     not audited: {exc}"
    save = coord.save_deadline_s
    findings = audit_grace(grace, save, stop_grace_s)
    lines = [f"  grace:     save time {save:g}s (coordinator.save_deadline_s), KillWait {grace.kill_wait_s}s"]
    lines.extend(f"  WARNING:   {f.setting}: {f.message}" for f in findings)
    if not findings:
        lines.append("  grace:     every layer leaves the save time")
    return "\n".join(lines)


def summary(config: Config, roles: tuple[str, ...] = ("agent", "coordinator")) -> str:
    """A few lines on the effective settings: what a typo or a forgotten section would change. The
    node name only for an agent's config (a coordinator has none)."""
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
    lines = [f"  node:      {node}"] if "agent" in roles else []
    lines.append(f"  broker:    {broker}")
    if "coordinator" in roles:
        lines.append(f"  scheduler: {scheduler}")
    return "\n".join(lines)


def explain() -> str:
    """Every option, nested tables' keys included, grouped by table, with type, default and description."""
    from ftd.config import explain_text

    return explain_text()
