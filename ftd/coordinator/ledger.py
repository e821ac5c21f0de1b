"""The ledger: an SQLite (WAL) record of every event seen and every action decided.

It is the coordinator's memory across restarts: an event id already in the ledger is a duplicate
(QoS 1 redelivery, a replayed retained message) and is not evaluated again; an action is written
*before* it runs and updated *after*, so a restarted coordinator resumes unfinished actions and never
repeats finished ones. ``export_events`` writes JSON lines for what-if replays.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

from ftd.events import Event
from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id TEXT PRIMARY KEY, ts REAL NOT NULL, node TEXT NOT NULL, kind TEXT NOT NULL,
    severity TEXT NOT NULL, body TEXT NOT NULL, received REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS events_node ON events(node, ts);
CREATE TABLE IF NOT EXISTS actions (
    id TEXT PRIMARY KEY, key TEXT NOT NULL, kind TEXT NOT NULL, target TEXT NOT NULL,
    state TEXT NOT NULL, request TEXT NOT NULL, detail TEXT NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS actions_key ON actions(key, updated);
CREATE INDEX IF NOT EXISTS actions_state ON actions(state);
"""

_request_decoder = msgspec.json.Decoder(ActionRequest)
_event_decoder = msgspec.json.Decoder(Event)


class Ledger:
    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        """``path`` is a file, or ``":memory:"`` for a ledger that lives as long as the object (replays,
        the simulator); ``clock`` stamps receipts and action times (a simulated one in a replay)."""
        self.path = str(path)
        self.clock = clock
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # durable against process crashes, cheap commits
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Group the writes inside into one SQLite transaction (one commit instead of one per row).

        Used for a batch of events from one bus message: an autocommitted INSERT costs ~0.1 ms, most
        of a non-actionable event's handling. Whatever was written is committed on leaving, also on an
        exception (the same outcome as autocommit); nested use joins the outer transaction.
        """
        if self._db.in_transaction:
            yield
            return
        self._db.execute("BEGIN")
        try:
            yield
        finally:
            self._db.execute("COMMIT")

    # --- events ------------------------------------------------------------------------------

    def record_event(self, event: Event) -> bool:
        """Store ``event``; False if its id was already recorded (a duplicate)."""
        cursor = self._db.execute(
            "INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                event.id,
                event.ts,
                event.node,
                str(event.kind),
                str(event.severity),
                msgspec.json.encode(event).decode(),
                self.clock(),
            ),
        )
        return cursor.rowcount == 1

    def events(self, *, limit: int = 100, node: str | None = None) -> list[Event]:
        sql = "SELECT body FROM events" + (" WHERE node = ?" if node else "") + " ORDER BY ts DESC LIMIT ?"
        args: tuple[Any, ...] = (node, limit) if node else (limit,)
        return [_event_decoder.decode(row[0]) for row in self._db.execute(sql, args)]

    def export_events(self, out: IO[str]) -> int:
        count = 0
        for (body,) in self._db.execute("SELECT body FROM events ORDER BY ts, id"):
            out.write(body + "\n")
            count += 1
        return count

    # --- actions -----------------------------------------------------------------------------

    def save_action(self, record: ActionRecord) -> None:
        now = self.clock()
        record.created = record.created or now
        record.updated = now
        req = record.request
        self._db.execute(
            "INSERT INTO actions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
            "state = excluded.state, detail = excluded.detail, updated = excluded.updated",
            (
                record.id,
                req.key,
                req.kind,
                req.target,
                str(record.state),
                msgspec.json.encode(req).decode(),
                json.dumps(record.detail, default=str),
                record.created,
                record.updated,
            ),
        )

    def _rows(self, where: str = "", args: tuple[Any, ...] = ()) -> Iterator[ActionRecord]:
        sql = "SELECT id, state, request, detail, created, updated FROM actions " + where
        for id_, state, request, detail, created, updated in self._db.execute(sql, args):
            yield ActionRecord(
                id=id_,
                request=_request_decoder.decode(request),
                state=ActionState(state),
                detail=json.loads(detail),
                created=created,
                updated=updated,
            )

    def actions(self, *, limit: int = 100) -> list[ActionRecord]:
        return list(self._rows("ORDER BY created DESC, id DESC LIMIT ?", (limit,)))

    def action(self, action_id: str) -> ActionRecord | None:
        return next(self._rows("WHERE id = ?", (action_id,)), None)

    def unfinished(self) -> list[ActionRecord]:
        return list(self._rows("WHERE state IN ('pending', 'running') ORDER BY created"))

    def recent(self, since: float) -> list[ActionRecord]:
        return list(self._rows("WHERE updated >= ? ORDER BY created", (since,)))
