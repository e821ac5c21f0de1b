"""``ftd inject``: have this node's agent report a synthetic event, for drills and for testing rules
end to end.

    sudo ftd inject --config /etc/ftd/agent.toml xid --data '{"code": 13, "pci": "0000:3b:00.0"}'

The event is handed to the node's running agent over its local socket (``agent.socket_path`` of the
config, or ``--socket`` / ``$FTD_SOCKET``; the ``inject`` op, :mod:`ftd.agent.local_api.inject`) and
published by the agent itself, through storm control, its spool and its own bus session: exactly
the path a real kernel-log Xid takes. An ``xid``, ``sxid`` or ``gpu_fallen_off_bus`` drill is
written as the driver's kernel line (``data.line``, or one made from ``code`` and ``pci``) and read
by the agent's own kernel-log parser, so it has the real fault's severity (the Xid catalogue's:
critical for Xid 79), fields and condition. It never logs in to the broker as the node: with the shipped
broker config (``use_username_as_clientid``) that would take the agent's session over, fire its
Last Will and turn the drill into a node death. Only root or the agent's own user may inject. The
event is marked ``source = "inject"`` and ``data.drill = true``; the node's condition says
``(drill)``, the actions it causes start their reason with ``drill:`` and carry ``params.drill``, and
notifications say so. The coordinator's rules treat it like any other event -- that is the point of
a drill (use ``coordinator.policy.dry_run`` or a dry-run rule to rehearse without acting). No agent running:
exit 2 with a sentence saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ftd.events import Kind, Severity

#: ``--help``'s text: the docstring's content as an operator's terminal shows it (plain text).
DESCRIPTION = """\
Have this node's agent report a synthetic event, for drills and for testing rules end to end.

    sudo ftd inject --config /etc/ftd/agent.toml xid --data '{"code": 13, "pci": "0000:3b:00.0"}'

The event goes to the node's running agent over its local socket (agent.socket_path of the config,
or --socket / $FTD_SOCKET) and the agent publishes it itself, through storm control, its spool and
its own bus session: the path a real kernel-log Xid takes. It never logs in to the broker as the
node (that would take the agent's session over and turn the drill into a node death). Only root or
the agent's own user may inject. The event is marked source = "inject", so the ledger and the API
show it for what it is; the coordinator's rules treat it like any other event, which is the point of
a drill (set coordinator.policy.dry_run, or use a dry-run rule, to rehearse without acting). No agent
running: exit 2 with a sentence saying so.
"""


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "inject",
        help="have this node's agent report a synthetic event (a drill)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "kind",
        choices=[k.value for k in Kind],
        metavar="KIND",
        help="event kind (" + ", ".join(k.value for k in Kind) + ")",
    )
    parser.add_argument("--config", required=True, metavar="PATH", help="the node's agent config (TOML)")
    parser.add_argument(
        "--socket",
        default=None,
        metavar="PATH",
        help="the agent's socket (default: $FTD_SOCKET, else the config's agent.socket_path)",
    )
    parser.add_argument(
        "--severity",
        choices=[s.value for s in Severity],
        default=None,
        help=(
            "default: the real kernel line's for xid/sxid/gpu_fallen_off_bus (the Xid catalogue's), "
            "else warning; another one rehearses less than the real fault"
        ),
    )
    parser.add_argument("--data", default="{}", metavar="JSON", help="the event's data object")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the agent's answer")
    parser.set_defaults(handler=_run)


def _fail(message: str) -> int:
    print(f"ftd inject: {message}", file=sys.stderr)
    return 2


def _run(args: argparse.Namespace) -> int:
    from ftd.client import protocol
    from ftd.config import ConfigError, load_config

    try:
        data = json.loads(args.data)
    except json.JSONDecodeError as exc:
        return _fail(f"--data is not JSON: {exc}")
    if not isinstance(data, dict):
        return _fail("--data must be a JSON object")
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    severity = Severity(args.severity) if args.severity else None
    path = args.socket or os.environ.get(protocol.SOCKET_ENV) or config.agent.socket_path
    try:
        event_id = inject(path, Kind(args.kind), severity, data, args.timeout)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        return _fail(f"no agent answers at {path} (is ftd-agent running on this node?): {exc}")
    except PermissionError as exc:
        return _fail(f"may not use the agent's socket {path} (run as root or the agent's user): {exc}")
    except (OSError, TimeoutError, ValueError) as exc:
        return _fail(f"the agent at {path} did not take the event: {exc}")
    print(event_id)
    return 0


def inject(
    socket_path: str, kind: Kind, severity: Severity | None, data: dict[str, Any], timeout: float
) -> str:
    """Hand one event to the agent at ``socket_path``; returns its id once the agent has it (spooled
    and on its way). ``severity`` None: the agent gives the real fault's. Raises OSError/TimeoutError,
    or ValueError with the agent's refusal."""
    from ftd.client.ask import ask
    from ftd.client.protocol import PROTOCOL_VERSION

    message: dict[str, Any] = {
        "v": PROTOCOL_VERSION,
        "op": "inject",
        "kind": kind.value,
        "data": data,
    }
    if severity is not None:
        message["severity"] = severity.value
    reply = ask(socket_path, message, timeout)
    if reply.get("op") != "inject" or not isinstance(reply.get("id"), str):
        raise ValueError(str(reply.get("error") or reply)[:500])
    return str(reply["id"])
