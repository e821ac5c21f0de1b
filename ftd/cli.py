"""The ``ftd`` command: a thin dispatcher over :mod:`ftd.commands` (stable: docs/architecture.md §9)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ftd import __version__

# Sub-command modules, in the order `ftd --help` lists them.
COMMAND_MODULES = (
    "ftd.commands.daemons",  # agent, coordinator
    "ftd.commands.check_config",
    "ftd.commands.demo",
    "ftd.commands.parse",
    "ftd.commands.xid",
    "ftd.commands.inject",
    "ftd.commands.bench",
    "ftd.commands.status",
    "ftd.commands.events",
    "ftd.commands.actions",
    "ftd.commands.announce",  # an operator's interruption (issue #37)
    "ftd.commands.rules",
    "ftd.commands.health",  # Slurm HealthCheckProgram
    "ftd.commands.preflight",
    "ftd.commands.slurm_hooks",  # Slurm Prolog / Epilog
    "ftd.commands.sim",
    "ftd.commands.run",  # the rank supervisor (issue #24)
    "ftd.commands.node_certs",  # agent-cert, cert-signer (Kubernetes CSR flow)
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ftd", description="Fault-tolerance daemon for GPU training clusters."
    )
    parser.add_argument("--version", action="version", version=f"ftd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _quiet_logs() -> None:
    """Commands print their results on stdout: library logs go to stderr, warnings and worse only.
    (The daemons and the demo configure logging again from their own settings.)"""
    try:
        from ftd.logs import configure
    except ModuleNotFoundError:  # the trainer-only install has no structlog; nothing logs there
        return
    configure("warning")


def main(argv: Sequence[str] | None = None) -> int:
    try:  # Ctrl-C while the command is still importing ends it as quietly as Ctrl-C later
        parser = build_parser()
        args = parser.parse_args(argv)
        _quiet_logs()
    except KeyboardInterrupt:
        return 130
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `ftd parse kmsg big.log | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
