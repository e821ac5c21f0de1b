"""The rank supervisor's command line: ``ftd run [options] -- <training command>``, also
``python -m ftd.supervisor [options] -- <training command>`` where only the trainer-only install
(ftd-daemon-client, which carries this package) is in the training image.

What: parses the options, resolves their defaults from the environment (Slurm's ``SLURM_NNODES``,
``SLURM_JOB_ID``, ``SLURMD_NODENAME``; ``FTD_JOB`` or ``FTD_JOB_ID``, ``FTD_SOCKET``; a Kubernetes
indexed Job's ``JOB_COMPLETION_INDEX``; the supervisor's own run from
:func:`ftd.client.protocol.run_id`) and runs :class:`ftd.supervisor.supervisor.Supervisor`. Launch one per
node (``srun --ntasks-per-node=1 ftd run ...``, or as a pod's entrypoint); the allocation holds
``--nodes`` training nodes plus ``--spares`` hot spares. Standard library and the client's protocol
only (Python 3.9 like the client): it runs on the trainer-only install, so the parser lives here
and :mod:`ftd.commands.run` only registers it under ``ftd``. A setup it cannot work out (no node index, a bad
number) is one clear line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import socket
import subprocess
import sys

from ftd.client.protocol import DEFAULT_SOCKET, SOCKET_ENV, run_id
from ftd.supervisor.assignment import Options, SetupError
from ftd.supervisor.supervisor import Supervisor

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

__all__ = ["add_arguments", "main", "options", "register", "run"]

_log = logging.getLogger("ftd.supervisor")


def register(sub: Any) -> None:
    """``ftd run`` under the ``ftd`` command's sub-commands."""
    p = sub.add_parser(
        "run",
        help="supervise this node's training ranks (restarts in the allocation, hot spares)",
        description="Start and watch this node's training ranks. The node's agent relays the "
        "coordinator's restarts: a new generation of the ranks in the same allocation, or a hot spare "
        "taking a failed node's slot. Usage: ftd run [options] -- python train.py ...",
    )
    add_arguments(p)
    p.set_defaults(handler=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=None, help="training nodes (default: SLURM_NNODES - spares)")
    p.add_argument("--spares", type=int, default=0, help="hot spare nodes in the allocation (default 0)")
    p.add_argument("--nproc-per-node", dest="nproc", type=int, default=1, help="ranks per node (1)")
    p.add_argument("--node-rank", type=int, default=None, help="this node's index (SLURM_NODEID, ...)")
    p.add_argument("--job", default=None, help="job id (default: SLURM_JOB_ID, FTD_JOB, FTD_JOB_ID)")
    p.add_argument("--master-addr", default=None, help="generation 0's MASTER_ADDR")
    p.add_argument("--master-port", type=int, default=29500, help="base port: generation g uses base+g")
    p.add_argument("--addr", default=None, help="this node's address for MASTER_ADDR (default: hostname)")
    p.add_argument("--node", default=None, help="this node's name until the agent says (SLURMD_NODENAME)")
    p.add_argument(
        "--socket", default=None, help=f"agent socket (default: ${SOCKET_ENV} or {DEFAULT_SOCKET})"
    )
    p.add_argument(
        "--preflight", default="ftd preflight", help="command run before a spare takes a slot ('none': skip)"
    )
    p.add_argument("--warm", default="", help="modules a pre-started interpreter imports (comma list)")
    p.add_argument(
        "--no-prefix",
        dest="prefix",
        action="store_false",
        help="leave the ranks' output as it is (default: every line starts with '[NODE rank R] ')",
    )
    p.add_argument(
        "--stop-grace",
        type=float,
        default=10.0,
        help="seconds from SIGTERM to SIGKILL when no deadline is known (preempted: until GraceTime ends)",
    )

    p.add_argument("--exit-grace", type=float, default=300.0, help="seconds to wait for a restart")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the training command")


def options(args: argparse.Namespace, env: Mapping[str, str]) -> Options:
    """The supervisor's options from the parsed arguments and the environment."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise SetupError("no training command: ftd run [options] -- python train.py ...")
    if args.spares < 0 or args.nproc < 1:
        raise SetupError("--spares must be >= 0 and --nproc-per-node >= 1")
    nodes = args.nodes
    if nodes is None:
        raw = env.get("SLURM_NNODES", "").strip()
        if not raw.isdecimal():
            raise SetupError("--nodes not given and SLURM_NNODES not set: how many training nodes?")
        nodes = int(raw) - args.spares
    if nodes < 1:
        raise SetupError(f"{nodes} training nodes: the allocation must hold more nodes than --spares")
    preflight = None if args.preflight.strip().lower() in ("", "none") else args.preflight
    return Options(
        command=command,
        nodes=nodes,
        spares=args.spares,
        nproc=args.nproc,
        node_rank=args.node_rank,
        job=args.job or env.get("SLURM_JOB_ID") or env.get("FTD_JOB") or env.get("FTD_JOB_ID") or None,
        master_addr=args.master_addr,
        master_port=args.master_port,
        addr=args.addr or socket.gethostname(),
        socket=args.socket or env.get(SOCKET_ENV) or DEFAULT_SOCKET,
        node=args.node or env.get("SLURMD_NODENAME") or socket.gethostname().split(".", 1)[0],
        preflight=preflight,
        warm=[m.strip() for m in args.warm.split(",") if m.strip()],
        prefix=args.prefix,
        stop_grace_s=args.stop_grace,
        exit_grace_s=args.exit_grace,
        run=run_id(env) or "",
    )


def slurm_first_host(env: Mapping[str, str]) -> str | None:
    """The first host of the Slurm allocation (``scontrol show hostnames``), None outside Slurm."""
    nodelist = env.get("SLURM_JOB_NODELIST")
    if not nodelist:
        return None
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    hosts = out.stdout.split()
    return hosts[0] if out.returncode == 0 and hosts else None


def run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if env is None else env)
    logger = logging.getLogger("ftd.supervisor")  # its own handler: the decisions, one line each
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        opts = options(args, env)
        first = None if opts.master_addr or env.get("MASTER_ADDR") else slurm_first_host(env)
        supervisor = Supervisor(opts, env, first_host=first)
    except SetupError as exc:
        sys.stderr.write(f"ftd run: {exc}\n")
        return 2
    _log.info(
        "ftd run: job %s node %s (%s slot %s of %d, %d spares) command: %s",
        opts.job,
        opts.node,
        supervisor.role,
        supervisor.slot,
        opts.nodes,
        opts.spares,
        shlex.join(opts.command),
    )
    return supervisor.run()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ftd.supervisor [options] -- command``: the same as ``ftd run``."""
    parser = argparse.ArgumentParser(prog="python -m ftd.supervisor", description="ftd run, without ftd")
    add_arguments(parser)
    try:
        return run(parser.parse_args(sys.argv[1:] if argv is None else list(argv)))
    except KeyboardInterrupt:
        return 130
