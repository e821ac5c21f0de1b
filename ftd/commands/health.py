"""``ftd health [--slurm]``: the node's active critical conditions, NHC-style; Slurm's HealthCheckProgram.

What: asks the local agent (over its socket, the ``conditions`` query of :mod:`ftd.client.protocol`)
for the node's active critical conditions (:mod:`ftd.agent.conditions`: an unresolved Xid 79, a GPU
missing, a filesystem past its critical level, GPU processes a job left behind). None: prints
nothing and exits 0, as LBNL NHC does. Some: prints one ``ERROR:  ftd:  Health check failed:  ...``
line per condition and exits 1; with ``--slurm`` it also drains the node through Slurm itself
(``scontrol update nodename=NODE state=drain reason="ftd: health: ..."``) unless the node is
already drained or down, so the node stays out of service even while the coordinator is down
(defence in depth; a coordinator that comes back adopts the drain: its reason carries ``ftd:``).

Socket: ``--socket``, else ``agent.socket_path`` from ``--config`` (the node's agent config, as for
``ftd inject``), else ``$FTD_SOCKET``, else ``/run/ftd/agent.sock``.

Node name: ``--node``, else the agent's own node name (it is the name the scheduler knows), else
``SLURMD_NODENAME``, else the short host name.

Budget and failure: everything runs under one deadline (``--timeout``, default 0.8 s) and imports the
standard library only (plus the client protocol), so Slurm's health check never hangs on ftd. An
agent that cannot be reached is a ``WARNING`` line and exit 0 (conditions unknown: a dead agent must
not take the cluster out), or exit 1 with ``--strict``. ``--resume`` gives back a node this command
drained (reason ``ftd: health: ...``) once no condition is active.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ftd.client import protocol
from ftd.client.ask import ask_conditions

DEFAULT_TIMEOUT_S = 0.8
REASON_PREFIX = "ftd: health: "
MAX_REASON = 200
_UNSAFE_RE = re.compile(r"[\x00-\x1f\x7f\"\\]+")


def register(sub: Any) -> None:
    p = sub.add_parser("health", help="the node's active critical conditions (Slurm HealthCheckProgram)")
    p.add_argument("--slurm", action="store_true", help="drain this node through scontrol when unhealthy")
    p.add_argument(
        "--socket", default=None, help="agent socket (default: $FTD_SOCKET or /run/ftd/agent.sock)"
    )
    p.add_argument(
        "--config", default=None, metavar="PATH", help="the node's agent config (TOML): its agent.socket_path"
    )
    p.add_argument("--node", default=None, help="node name for Slurm (default: the agent's node name)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="total time budget, seconds")
    p.add_argument("--scontrol", default="scontrol", help="scontrol executable")
    p.add_argument("--strict", action="store_true", help="an unreachable agent is a failure (exit 1)")
    p.add_argument("--resume", action="store_true", help="resume a node this command drained, once healthy")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.set_defaults(handler=run)


def sanitize(reason: str) -> str:
    """One printable line without quotes or backslashes, ``ftd: health: `` prefix, bounded (what
    Slurm's parsers and ``sinfo -R`` accept; the coordinator's sanitize_reason keeps the same rules)."""
    text = " ".join(_UNSAFE_RE.sub(" ", reason.replace('"', "'")).split())
    text = REASON_PREFIX + text
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3].rstrip() + "..."


def node_name(args: argparse.Namespace, reply: Mapping[str, Any] | None, env: Mapping[str, str]) -> str:
    if args.node:
        return str(args.node)
    if reply and isinstance(reply.get("node"), str) and reply["node"]:
        return str(reply["node"])
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".", 1)[0]


def _scontrol(
    args: argparse.Namespace, argv: Sequence[str], deadline: float
) -> subprocess.CompletedProcess[str]:
    left = max(0.05, deadline - time.monotonic())
    return subprocess.run(
        [args.scontrol, *argv], capture_output=True, text=True, timeout=left, stdin=subprocess.DEVNULL
    )


def node_state(args: argparse.Namespace, node: str, deadline: float) -> tuple[str, str]:
    """(State, Reason) of the node as Slurm has it (empty strings when it cannot say)."""
    done = _scontrol(args, ["show", "node", "-o", node], deadline)
    if done.returncode != 0:
        return "", ""
    line = done.stdout.strip()
    state = re.search(r"\bState=(\S+)", line)
    reason = re.search(r"\bReason=(.*?)(?: \[[^\]]*\])?(?= \w+=|$)", line)
    return (state.group(1) if state else "", reason.group(1) if reason else "")


def _configured_socket(path: str | None) -> str | None:
    """``agent.socket_path`` of the agent config at ``path`` (only read when one is given: the plain
    health check stays on the standard library)."""
    if path is None:
        return None
    from ftd.config import load_config

    return load_config(path).agent.socket_path


def run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    started = time.monotonic()
    deadline = started + args.timeout
    try:
        configured = _configured_socket(args.config)
    except ValueError as exc:  # ConfigError: a bad --config is the operator's mistake, said at once
        print(f"ftd health: {exc}", file=sys.stderr)
        return 2
    path = str(args.socket or configured or env.get(protocol.SOCKET_ENV) or protocol.DEFAULT_SOCKET)
    try:
        reply: dict[str, Any] | None = ask_conditions(path, max(0.05, args.timeout * 0.5))
        problem = None
    except (OSError, TimeoutError, ValueError) as exc:
        reply, problem = None, f"agent not reachable at {path}: {exc}"
    node = node_name(args, reply, env)
    conditions = [c for c in (reply or {}).get("conditions", []) if isinstance(c, dict)]
    result: dict[str, Any] = {"node": node, "healthy": not conditions, "conditions": conditions}
    lines: list[str] = []
    code = 0
    if problem is not None:
        result["healthy"] = None
        result["error"] = problem
        lines.append(f"{'ERROR' if args.strict else 'WARNING'}:  ftd:  {problem}; conditions unknown")
        code = 1 if args.strict else 0
    for cond in conditions:
        lines.append(f"ERROR:  ftd:  Health check failed:  {cond.get('reason') or cond.get('key')}")
        code = 1
    if args.slurm and reply is not None:
        try:
            result["slurm"] = _act(args, node, conditions, deadline)
        except (OSError, subprocess.TimeoutExpired) as exc:
            result["slurm"] = {"error": f"scontrol: {exc}"}
            lines.append(f"ERROR:  ftd:  could not update node {node} in Slurm: {exc}")
    result["elapsed_s"] = round(time.monotonic() - started, 4)
    if args.json:
        print(json.dumps(result))
    else:
        for line in lines:
            print(line)
    return code


def _act(
    args: argparse.Namespace, node: str, conditions: list[dict[str, Any]], deadline: float
) -> dict[str, Any]:
    state, reason = node_state(args, node, deadline)
    flags = set(state.replace("*", "").split("+"))
    out = {"state": state}
    if conditions:
        if flags & {"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL"}:
            out["drain"] = f"already out of service ({state}): left as is"
            return out
        why = "; ".join(str(c.get("reason") or c.get("key")) for c in conditions)
        text = sanitize(why)
        done = _scontrol(args, ["update", f"nodename={node}", "state=drain", f"reason={text}"], deadline)
        if done.returncode != 0:
            raise OSError(f"exit {done.returncode}: {(done.stderr or done.stdout).strip()[:200]}")
        out["drain"] = text
        return out
    if args.resume and "DRAIN" in flags and reason.startswith(REASON_PREFIX.strip()):
        done = _scontrol(args, ["update", f"nodename={node}", "state=resume"], deadline)
        if done.returncode != 0:
            raise OSError(f"exit {done.returncode}: {(done.stderr or done.stdout).strip()[:200]}")
        out["resumed"] = reason
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m ftd.commands.health --slurm`` (without loading the rest of the CLI)."""
    parser = argparse.ArgumentParser(prog="ftd")
    register(parser.add_subparsers(dest="command"))
    return run(parser.parse_args(["health", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
