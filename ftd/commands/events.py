"""``ftd events export --config PATH [--out FILE]``: the ledger's events as JSON lines.

What: opens the coordinator's ledger (``coordinator.ledger_path`` from the config) and writes every
recorded event, oldest first, one JSON object per line (the bus envelope, exactly as received), to
FILE or stdout; the count goes to stderr. The output is the input of what-if replays
(``ftd rules test --events FILE``). Exit 0; 2 for a bad config; 1 if the ledger cannot be read.

Why read-only and safe next to a running coordinator: the ledger is SQLite in WAL mode, so a reader
sees a consistent snapshot without blocking the writer. The file is opened read-only (``mode=ro``)
so a mistyped path never creates an empty ledger.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path
from typing import IO, Any


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
