"""``ftd inject``: publish a synthetic event as a node, for drills and for testing rules end to end.

    ftd inject --config /etc/ftd/agent.toml xid --data '{"code": 79, "pci": "0000:3b:00.0"}'

The event goes through the real bus with the node's own credentials (the agent config's ``[bus]``
and ``agent.node``), so the broker's ACL applies exactly as to the agent: a node can only inject as
itself. It is marked ``source = "inject"`` so the ledger and the API show it for what it is; the
coordinator's rules treat it like any other event — that is the point of a drill (use
``coordinator.policy.dry_run`` or a dry-run rule to rehearse without acting).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from ftd.events import Kind, Severity


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "inject",
        help="publish a synthetic event as this node",
        description=__doc__,
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
        "--severity",
        choices=[s.value for s in Severity],
        default=None,
        help="default: error for xid/sxid/gpu_fallen_off_bus, else warning",
    )
    parser.add_argument("--data", default="{}", metavar="JSON", help="the event's data object")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the broker")
    parser.set_defaults(handler=_run)


def _fail(message: str) -> int:
    print(f"ftd inject: {message}", file=sys.stderr)
    return 2


def _run(args: argparse.Namespace) -> int:
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
    loud = {Kind.XID, Kind.SXID, Kind.GPU_FALLEN_OFF_BUS}
    severity = args.severity or (Severity.ERROR if Kind(args.kind) in loud else Severity.WARNING)
    try:
        event_id = asyncio.run(inject(config, Kind(args.kind), Severity(severity), data, args.timeout))
    except (TimeoutError, ConnectionError) as exc:
        return _fail(f"could not publish to {config.bus.host}:{config.bus.port}: {exc}")
    print(event_id)
    return 0


async def inject(config: Any, kind: Kind, severity: Severity, data: dict[str, Any], timeout: float) -> str:
    """Publish one event as ``config.agent``'s node; returns its id once the broker has it (PUBACK)."""
    from ftd.bus import topics
    from ftd.bus.factory import make_mqtt_bus
    from ftd.events import encode, make_event

    node = config.agent.resolved_node()
    event = make_event(node, kind, severity=severity, source="inject", data=data)
    # A one-shot client: a clean session, so the broker keeps nothing for it afterwards.
    bus = make_mqtt_bus(config.bus, client_id=f"ftd-inject-{node}-{event.id[-8:]}", clean_session=True)
    await bus.start()
    try:
        if not await bus.wait_connected(timeout):
            raise TimeoutError(f"not connected after {timeout}s")
        async with asyncio.timeout(timeout):
            await bus.publish(topics.node_event(node, kind), encode(event))
    finally:
        await bus.stop()
    return event.id
