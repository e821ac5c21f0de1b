"""``ftd events list|tail|export``: the coordinator's recorded events.

``list [--node NAME] [--kind KIND,...] [--limit N] [--json]``: the newest events from the running
coordinator's API (``/v1/events?node=&limit=``; ``--kind`` filters that page), oldest first.

``tail [--node NAME] [--kind KIND,...] [--interval S] [--count N] [--json]``: prints the newest few,
then follows: polls ``/v1/events`` every ``--interval`` seconds (default 2) and prints each event
not seen before, oldest first, until interrupted (or ``--count`` new events were printed). Both
find the coordinator as ``ftd status`` does (``--url``, ``--config``, ``$FTD_CONFIG``,
``/etc/ftd/coordinator.toml``: :mod:`ftd.commands.api_client`).

``export --config PATH [--out FILE]``: opens the coordinator's ledger (``coordinator.ledger_path``
from the config) and writes every recorded event, oldest first, one JSON object per line (the bus
envelope, exactly as received), to FILE or stdout; the count goes to stderr. The output is the input
of what-if replays (``ftd rules test --events FILE``). Exit 0; 2 for a bad config; 1 if the ledger
cannot be read.

Why read-only and safe next to a running coordinator: the ledger is SQLite in WAL mode, so a reader
sees a consistent snapshot without blocking the writer. The file is opened read-only (``mode=ro``)
so a mistyped path never creates an empty ledger.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import time
import urllib.parse
from collections import OrderedDict
from pathlib import Path
from typing import IO, Any

from ftd.commands.api_client import ApiFailure, ApiTarget, add_target_options, resolve

_SEEN_MAX = 10_000  # event ids remembered by tail (the API's page is at most 1000)


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "events", help="work with recorded events", description="Work with recorded events."
    )
    actions = parser.add_subparsers(dest="events_command", metavar="ACTION", required=True)
    export = actions.add_parser(
        "export",
        help="write the ledger's events as JSON lines (for what-if replays)",
        description="Write every event in the coordinator's ledger, oldest first, as JSON lines.",
    )
    export.add_argument(
        "--config", required=True, metavar="PATH", help="coordinator TOML config (ledger_path)"
    )
    export.add_argument("--out", metavar="FILE", help="output file (default: stdout)")
    export.set_defaults(handler=run_export)
    for verb, text in (
        ("list", "the newest events from the running coordinator (its API)"),
        ("tail", "follow new events as the coordinator records them"),
    ):
        p = actions.add_parser(verb, help=text, description=text[0].upper() + text[1:] + ".")
        add_target_options(p)
        p.add_argument("--node", help="only this node's events")
        p.add_argument("--kind", help="only these kinds, comma-separated (e.g. xid,ecc)")
        p.add_argument("--limit", type=int, default=20, help="newest N to read (default 20)")
        p.add_argument("--json", action="store_true", help="one JSON object per line")
        if verb == "tail":
            p.add_argument("--interval", type=float, default=2.0, help="seconds between polls (default 2)")
            p.add_argument("--count", type=int, default=0, help="stop after N new events (default: never)")
            p.set_defaults(handler=run_tail)
        else:
            p.set_defaults(handler=run_list)


def _export(path: str, out: IO[str]) -> int:
    from ftd.coordinator.ledger.sqlite import Ledger

    # Validate read access first: Ledger() would create a missing file (and its schema).
    if not Path(path).is_file():
        raise FileNotFoundError(f"no ledger at {path}")
    sqlite3.connect(f"file:{path}?mode=ro", uri=True).close()
    ledger = Ledger(path)
    try:
        return ledger.export_events(out)
    finally:
        ledger.close()


def run_export(args: argparse.Namespace) -> int:
    from ftd.config import ConfigError, load_config

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    path = config.coordinator.ledger_path
    try:
        if args.out:
            with open(args.out, "w", encoding="utf-8") as out:
                count = _export(path, out)
        else:
            count = _export(path, sys.stdout)
            sys.stdout.flush()
    except (OSError, sqlite3.Error) as exc:
        print(f"ftd events export: cannot read the ledger {path}: {exc}", file=sys.stderr)
        return 1
    print(f"exported {count} events from {path}", file=sys.stderr)
    return 0


# --- from the running coordinator ---------------------------------------------------------------


def _page(api: ApiTarget, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The newest events the API holds (as ``args`` filter them), oldest first."""
    query = {"limit": str(max(1, min(int(args.limit), 1000)))}
    if args.node:
        query["node"] = args.node
    events: list[dict[str, Any]] = api.get("/v1/events?" + urllib.parse.urlencode(query))
    kinds = {k.strip() for k in (args.kind or "").split(",") if k.strip()}
    return [e for e in reversed(events) if not kinds or e["kind"] in kinds]


def line(event: dict[str, Any], as_json: bool) -> str:
    if as_json:
        return json.dumps(event, sort_keys=True)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event["ts"]))
    data = event.get("data") or {}
    code = f" {data['code']}" if isinstance(data.get("code"), int) else ""
    count = f" x{event['count']}" if event.get("count", 1) > 1 else ""
    return f"{when}  {event['node']:<16} {event['kind']}{code}{count}  {event['severity']}  [{event['id']}]"


def run_list(args: argparse.Namespace) -> int:
    api = resolve(args, "events list")
    if isinstance(api, int):
        return api
    try:
        events = _page(api, args)
    except ApiFailure as exc:
        print(f"ftd events list: {exc}", file=sys.stderr)
        return 1
    for event in events:
        print(line(event, args.json))
    return 0


def run_tail(args: argparse.Namespace) -> int:
    api = resolve(args, "events tail")
    if isinstance(api, int):
        return api
    seen: OrderedDict[str, None] = OrderedDict()
    printed = 0
    first = True
    while True:
        try:
            events = _page(api, args)
        except ApiFailure as exc:  # keep following through a coordinator restart
            print(f"ftd events tail: {exc} (retrying)", file=sys.stderr)
            events = []
        for event in events:
            if event["id"] in seen:
                continue
            seen[event["id"]] = None
            if len(seen) > _SEEN_MAX:
                seen.popitem(last=False)
            print(line(event, args.json), flush=True)
            if not first:
                printed += 1
                if args.count and printed >= args.count:
                    return 0
        first = False
        time.sleep(max(0.1, args.interval))
