"""``ftd announce``: an operator announces an interruption (issue #37) through the coordinator's API.

``ftd announce --node N | --job J (--at ISO8601 | --in 90s) [--reason TEXT]`` posts to
``POST /v1/interruptions`` (the API token is needed, like every mutating call). The coordinator
feeds it to the rules as an ``interruption`` event (source ``operator``): the jobs concerned save --
fully, at the node-local level, or not at all, as the time left allows -- and stop before the
deadline, then are requeued. ``--at`` needs a timezone (``Z`` or ``+02:00``): a naive time is
refused, never guessed.
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime
from typing import Any

from ftd.commands.actions import default_by
from ftd.commands.api_client import ApiFailure, add_target_options, resolve

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_in(text: str) -> float:
    """``90``, ``90s``, ``5m``, ``1.5h`` -> seconds (> 0); ValueError with the reason otherwise."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"--in {text!r}: give a duration like 90s, 5m or 1h")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2) or "s"]
    if seconds <= 0:
        raise ValueError(f"--in {text!r}: the interruption must be ahead (more than 0 s)")
    return seconds


def parse_at(text: str) -> float:
    """An ISO 8601 time with a timezone -> epoch seconds; ValueError with the reason otherwise."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--at {text!r}: not an ISO 8601 time (2026-12-04T21:00:00Z)") from None
    if when.tzinfo is None:
        raise ValueError(f"--at {text!r}: give the timezone (Z or +02:00); a time without one is ambiguous")
    return when.timestamp()


def body_of(args: argparse.Namespace) -> dict[str, Any]:
    """The request body; ValueError for a bad ``--in`` or ``--at``."""
    body: dict[str, Any] = {"by": args.by or default_by()}
    body["node" if args.node else "job"] = args.node or args.job
    if args.at is not None:
        body["deadline"] = parse_at(args.at)
    else:
        body["in_s"] = parse_in(args.in_)
    if args.reason:
        body["reason"] = args.reason
    return body


def run(args: argparse.Namespace) -> int:
    try:
        body = body_of(args)
    except ValueError as exc:
        print(f"ftd announce: {exc}", file=sys.stderr)
        return 2
    api = resolve(args, "announce")
    if isinstance(api, int):
        return api
    try:
        out = api.post("/v1/interruptions", body)
    except ApiFailure as exc:
        print(f"ftd announce: {exc}", file=sys.stderr)
        return 1
    actions = out.get("actions") or []
    print(f"interruption {out['ref']} of {out['job'] or 'node ' + out['node']} by {out['deadline']:.0f}")
    for action in actions:
        print(f"  {action['id']}: {action['kind']} {action['target']} ({action['state']})")
    if not actions:
        print("  no action: no job of ftd's runs there, or the same interruption is already handled")
    return 0


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "announce",
        help="announce an interruption of a node or a job (needs the API token)",
        description="Save and stop the jobs of a node (or one job) before a deadline, then requeue them.",
    )
    add_target_options(parser, token=True)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--node", help="the node interrupted (every job on it)")
    where.add_argument("--job", help="the job interrupted")
    when = parser.add_mutually_exclusive_group(required=True)
    when.add_argument("--at", metavar="TIME", help="when the work is killed: ISO 8601 with a timezone")
    when.add_argument(
        "--in", dest="in_", metavar="DURATION", help="when the work is killed, from now: 90s, 5m, 1h"
    )
    parser.add_argument("--reason", default=None, help="why (shown to operators, recorded)")
    parser.add_argument("--by", default=None, help="who announces (recorded; default: your login name)")
    parser.set_defaults(handler=run)
