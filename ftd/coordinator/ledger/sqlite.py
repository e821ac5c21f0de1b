"""The ledger: an SQLite (WAL) record of every event seen and every action decided.

It is the coordinator's memory across restarts: an event id already in the ledger is a duplicate
(QoS 1 redelivery, a replayed retained message) and is not evaluated again; an action is written
*before* it runs and updated *after*, so a restarted coordinator resumes unfinished actions and never
repeats finished ones. ``export_events`` writes JSON lines for what-if replays.

A corrupt ledger (docs/architecture.md §11.2: storage faults are reported, never fatal): opening checks the
file with ``PRAGMA quick_check`` (it reads every page: about a second per GB here). A file SQLite calls
corrupt (``SQLITE_CORRUPT``, ``SQLITE_NOTADB``) is moved aside -- renamed ``{name}.corrupt-{UTC timestamp}``,
its ``-wal``/``-shm`` files with it, kept for a post-mortem -- with one ``ledger_corrupt`` error line in the
log, and a new ledger is started whose first event says what happened (``agent_health`` from
:data:`NOTICE_NODE`, severity critical). The history and the unfinished actions of the old file are not
carried over: they are what could not be read. Other errors (a locked file, a directory that cannot be
written) are raised as they are: moving a sound file aside for them would lose it. Corruption met later, while
running, is a storage error of the commit in hand (counted and retried by the coordinator), not a reason to
drop the ledger under it.

Plans (:meth:`Ledger.save_plan`, table ``plans``): the order and dependencies of one event's actions
(:mod:`ftd.coordinator.model.plan`); each step's state is its action's row. A plan not ``finished`` is
rebuilt after a restart together with its unfinished actions.

Drains (:meth:`Ledger.save_drain`, table ``drains``): the nodes out of service as the coordinator
last knew them, one row per node -- ``origin`` ``ftd`` (drained by ftd: counts against its
blast-radius budget) or ``external`` (drained or down by someone else) -- kept in step with the
scheduler by :mod:`ftd.coordinator.upkeep.reconcile`, so a restarted coordinator remembers its drains.

Summaries (:meth:`Ledger.record_summary`): an event the coordinator keeps *updating* under one id,
such as a node's ``bad_input`` summary of a window, whose count grows with every commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

from ftd.coordinator.ledger.checkpointer import WalCheckpointer
from ftd.coordinator.ledger.store import (
    NOTICE_NODE,
    Drain,
    LedgerStore,
    action_from_row,
    action_row,
    presence_from_row,
    presence_row,
)
from ftd.coordinator.model.plan import Plan, plan_decoder, plan_encoder
from ftd.events import Event, JobPresence, Kind, Severity
from ftd.logs import get_logger
from ftd.plugin.actions import ActionRecord, ActionRequest

log = get_logger(__name__)

_CORRUPT_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})

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
CREATE TABLE IF NOT EXISTS plans (
    id TEXT PRIMARY KEY, event_id TEXT, state TEXT NOT NULL, body TEXT NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS plans_state ON plans(state);
CREATE TABLE IF NOT EXISTS drains (
    node TEXT PRIMARY KEY, origin TEXT NOT NULL, reason TEXT NOT NULL, state TEXT NOT NULL,
    since REAL NOT NULL, action_id TEXT, updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS presence (
    node TEXT NOT NULL, job TEXT NOT NULL, body TEXT NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (node, job)
);
"""

_request_decoder = msgspec.json.Decoder(ActionRequest)
_event_decoder = msgspec.json.Decoder(Event)


class LedgerCorrupt(sqlite3.DatabaseError):
    """``PRAGMA quick_check`` found the file damaged (SQLite itself raised nothing)."""

    sqlite_errorcode = sqlite3.SQLITE_CORRUPT


def is_corrupt(exc: BaseException) -> bool:
    """True for SQLite's own verdict that a file is damaged or not a database at all."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.DatabaseError) and code is not None and (code & 0xFF) in _CORRUPT_CODES


class Ledger:
    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        """``path`` is a file, or ``":memory:"`` for a ledger that lives as long as the object (replays,
        the simulator); ``clock`` stamps receipts and action times (a simulated one in a replay).
        A corrupt file is moved aside and replaced (see the module docstring)."""
        self.path = str(path)
        self.clock = clock
        self.moved_aside: Path | None = None  # where a corrupt file found at opening went
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = self._open()
        except sqlite3.DatabaseError as exc:
            if not is_corrupt(exc) or self.path == ":memory:":
                raise
            self.moved_aside = self._move_aside(exc)
            self._db = self._open()
            self._record_corruption(exc)
        # Checkpoints run in a thread, never inside a commit on the event loop (checkpointer.py).
        self._checkpointer = WalCheckpointer(self.path).start() if self.path != ":memory:" else None

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # durable against process crashes, cheap commits
            db.execute("PRAGMA wal_autocheckpoint=0")  # the WalCheckpointer's thread does it
            db.executescript(_SCHEMA)
            problems = [row[0] for row in db.execute("PRAGMA quick_check")]  # every page, read once
            if problems != ["ok"]:
                raise LedgerCorrupt("; ".join(str(p) for p in problems[:3]))
        except BaseException:
            db.close()
            raise
        return db

    def _move_aside(self, exc: sqlite3.DatabaseError) -> Path:
        """Rename the corrupt file (and its WAL and shared-memory files) out of the way."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = Path(f"{self.path}.corrupt-{stamp}")
        n = 1
        while target.exists():
            n += 1
            target = Path(f"{self.path}.corrupt-{stamp}-{n}")
        for suffix in ("-wal", "-shm", ""):  # the database file last: it is what the name points at
            source = Path(self.path + suffix)
            if source.exists():
                source.rename(Path(f"{target}{suffix}"))
        log.error(
            "ledger_corrupt",
            message="the ledger is corrupt; moved it aside and started a new, empty one",
            path=self.path,
            moved_to=str(target),
            error=f"{type(exc).__name__}: {exc}",
        )
        return target

    def _record_corruption(self, exc: sqlite3.DatabaseError) -> None:
        now = self.clock()
        self.record_event(
            Event(
                id=f"{NOTICE_NODE}-ledger-corrupt-{int(now * 1000):x}",
                ts=now,
                node=NOTICE_NODE,
                kind=Kind.AGENT_HEALTH,
                severity=Severity.CRITICAL,
                source="coordinator",
                data={
                    "problem": "ledger_corrupt",
                    "error": f"{type(exc).__name__}: {exc}",
                    "path": self.path,
                    "moved_to": str(self.moved_aside),
                    "lost": "the old ledger's events and actions (unfinished actions are not resumed)",
                },
            )
        )

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.stop()
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

    def _row(self, event: Event) -> tuple[Any, ...]:
        body = msgspec.json.encode(event).decode()
        return (event.id, event.ts, event.node, str(event.kind), str(event.severity), body, self.clock())

    def record_event(self, event: Event) -> bool:
        """Store ``event``; False if its id was already recorded (a duplicate)."""
        cursor = self._db.execute(
            "INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?, ?, ?)", self._row(event)
        )
        return cursor.rowcount == 1

    def record_summary(self, event: Event) -> None:
        """Store ``event``, replacing what an earlier commit stored under its id (a growing summary)."""
        self._db.execute(
            "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
            "ts = excluded.ts, node = excluded.node, kind = excluded.kind, severity = excluded.severity, "
            "body = excluded.body, received = excluded.received",
            self._row(event),
        )

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
        self._db.execute(
            "INSERT INTO actions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
            "state = excluded.state, detail = excluded.detail, updated = excluded.updated",
            action_row(record, self.clock()),
        )

    def _rows(self, where: str = "", args: tuple[Any, ...] = ()) -> Iterator[ActionRecord]:
        sql = "SELECT id, state, request, detail, created, updated FROM actions " + where
        for row in self._db.execute(sql, args):
            yield action_from_row(*row)

    def actions(self, *, limit: int = 100) -> list[ActionRecord]:
        return list(self._rows("ORDER BY created DESC, id DESC LIMIT ?", (limit,)))

    def action(self, action_id: str) -> ActionRecord | None:
        return next(self._rows("WHERE id = ?", (action_id,)), None)

    def unfinished(self) -> list[ActionRecord]:
        return list(self._rows("WHERE state IN ('pending', 'running') ORDER BY created"))

    def recent(self, since: float) -> list[ActionRecord]:
        return list(self._rows("WHERE updated >= ? ORDER BY created", (since,)))

    def action_counts(self) -> dict[tuple[str, str], int]:
        rows = self._db.execute("SELECT kind, state, COUNT(*) FROM actions GROUP BY kind, state")
        return {(str(kind), str(state)): int(n) for kind, state, n in rows}

    # --- plans (ftd.coordinator.model.plan: one event's actions in order) ----------------------------

    def save_plan(self, plan: Plan) -> None:
        now = self.clock()
        plan.created = plan.created or now
        plan.updated = now
        self._db.execute(
            "INSERT INTO plans VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
            "state = excluded.state, body = excluded.body, updated = excluded.updated",
            (plan.id, plan.event_id, plan.state, plan_encoder.encode(plan).decode(), plan.created, now),
        )

    def plan(self, plan_id: str) -> Plan | None:
        row = self._db.execute("SELECT body FROM plans WHERE id = ?", (plan_id,)).fetchone()
        return plan_decoder.decode(row[0]) if row else None

    def plan_states(self, plan_id: str) -> list[tuple[str, str, str, str | None]]:
        """(action id, kind, target, state) of each step of a plan, in the plan's order; a step
        whose action row is missing has state None."""
        plan = self.plan(plan_id)
        if plan is None:
            return []
        out: list[tuple[str, str, str, str | None]] = []
        for step in plan.steps:
            row = self._db.execute("SELECT state FROM actions WHERE id = ?", (step.action,)).fetchone()
            out.append((step.action, step.kind, step.target, row[0] if row else None))
        return out

    def plans(self, *, limit: int = 100, unfinished: bool = False) -> list[Plan]:
        where = "WHERE state != 'finished' " if unfinished else ""
        sql = f"SELECT body FROM plans {where}ORDER BY created DESC, id DESC LIMIT ?"
        return [plan_decoder.decode(row[0]) for row in self._db.execute(sql, (limit,))]

    # --- drains (ftd.coordinator.upkeep.reconcile: which nodes are out, and by whom) -------------------

    def save_drain(self, drain: Drain) -> None:
        """Record ``drain`` (replacing the node's row)."""
        self._db.execute(
            "INSERT INTO drains VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(node) DO UPDATE SET "
            "origin = excluded.origin, reason = excluded.reason, state = excluded.state, "
            "since = excluded.since, action_id = excluded.action_id, updated = excluded.updated",
            (drain.node, drain.origin, drain.reason, drain.state, drain.since, drain.action_id, self.clock()),
        )

    def drop_drain(self, node: str) -> bool:
        """Forget the node's drain; False when none was recorded."""
        return self._db.execute("DELETE FROM drains WHERE node = ?", (node,)).rowcount == 1

    def drains(self, origin: str | None = None) -> list[Drain]:
        """Recorded drains (of ``origin`` only, when given), by node name."""
        sql = "SELECT node, origin, reason, since, state, action_id FROM drains"
        args: tuple[Any, ...] = ()
        if origin is not None:
            sql, args = sql + " WHERE origin = ?", (origin,)
        rows = self._db.execute(sql + " ORDER BY node", args)
        return [Drain(*row) for row in rows]

    def save_presence(self, presence: JobPresence) -> None:
        """Remember which ranks of a job run on a node (replacing that node's row for the job)."""
        self._db.execute(
            "INSERT INTO presence VALUES (?, ?, ?, ?) ON CONFLICT(node, job) DO UPDATE SET "
            "body = excluded.body, updated = excluded.updated",
            (*presence_row(presence), self.clock()),
        )

    def drop_presence(self, node: str, job: str) -> bool:
        """Forget a job's presence on a node; False when none was remembered."""
        sql = "DELETE FROM presence WHERE node = ? AND job = ?"
        return self._db.execute(sql, (node, job)).rowcount == 1

    def presences(self) -> list[JobPresence]:
        """Every remembered presence, by node then job."""
        rows = self._db.execute("SELECT body FROM presence ORDER BY node, job")
        return [presence_from_row(body) for (body,) in rows]


class SqliteStore:
    """A :class:`Ledger` behind the asynchronous :class:`~ftd.coordinator.ledger.store.LedgerStore`
    seam the engine, the reconciler and the API use.

    SQLite calls are local file I/O of microseconds (a group commit of a batch chunk is one fsync),
    so they run inline on the event loop: no thread hop, no suspension -- the storm path records
    some 10^4 events a second this way. The one thing the adapter adds is the seam's rule that a
    transaction belongs to the task that opened it: while one is open, another task's call waits for
    it to end instead of slipping its write into it.
    """

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.path = ledger.path
        self.clock = ledger.clock
        self._lock = asyncio.Lock()
        self._owner: asyncio.Task[Any] | None = None

    async def _turn(self) -> None:
        """Wait while another task holds a transaction open (no wait, no suspension otherwise)."""
        while self._lock.locked() and self._owner is not asyncio.current_task():
            async with self._lock:
                pass

    async def close(self) -> None:
        await self._turn()
        self.ledger.close()

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        task = asyncio.current_task()
        if self._owner is not None and self._owner is task:
            yield  # nested: joins the task's open transaction
            return
        async with self._lock:
            self._owner = task
            try:
                with self.ledger.transaction():
                    yield
            finally:
                self._owner = None

    async def record_event(self, event: Event) -> bool:
        await self._turn()
        return self.ledger.record_event(event)

    async def record_summary(self, event: Event) -> None:
        await self._turn()
        self.ledger.record_summary(event)

    async def events(self, *, limit: int = 100, node: str | None = None) -> list[Event]:
        await self._turn()
        return self.ledger.events(limit=limit, node=node)

    async def export_events(self, out: IO[str]) -> int:
        await self._turn()
        return self.ledger.export_events(out)

    async def save_action(self, record: ActionRecord) -> None:
        await self._turn()
        self.ledger.save_action(record)

    async def actions(self, *, limit: int = 100) -> list[ActionRecord]:
        await self._turn()
        return self.ledger.actions(limit=limit)

    async def action(self, action_id: str) -> ActionRecord | None:
        await self._turn()
        return self.ledger.action(action_id)

    async def unfinished(self) -> list[ActionRecord]:
        await self._turn()
        return self.ledger.unfinished()

    async def recent(self, since: float) -> list[ActionRecord]:
        await self._turn()
        return self.ledger.recent(since)

    async def action_counts(self) -> dict[tuple[str, str], int]:
        await self._turn()
        return self.ledger.action_counts()

    async def save_plan(self, plan: Plan) -> None:
        await self._turn()
        self.ledger.save_plan(plan)

    async def plan(self, plan_id: str) -> Plan | None:
        await self._turn()
        return self.ledger.plan(plan_id)

    async def plan_states(self, plan_id: str) -> list[tuple[str, str, str, str | None]]:
        await self._turn()
        return self.ledger.plan_states(plan_id)

    async def plans(self, *, limit: int = 100, unfinished: bool = False) -> list[Plan]:
        await self._turn()
        return self.ledger.plans(limit=limit, unfinished=unfinished)

    async def save_drain(self, drain: Drain) -> None:
        await self._turn()
        self.ledger.save_drain(drain)

    async def drop_drain(self, node: str) -> bool:
        await self._turn()
        return self.ledger.drop_drain(node)

    async def drains(self, origin: str | None = None) -> list[Drain]:
        await self._turn()
        return self.ledger.drains(origin)

    async def save_presence(self, presence: JobPresence) -> None:
        await self._turn()
        self.ledger.save_presence(presence)

    async def drop_presence(self, node: str, job: str) -> bool:
        await self._turn()
        return self.ledger.drop_presence(node, job)

    async def presences(self) -> list[JobPresence]:
        await self._turn()
        return self.ledger.presences()


def memory_store(clock: Callable[[], float] = time.time) -> LedgerStore:
    """A fresh in-memory SQLite ledger on ``clock``, behind the seam: a replay's or a simulation's
    (:class:`ftd.coordinator.decide.replay.Sandbox` takes it from its caller)."""
    return SqliteStore(Ledger(":memory:", clock=clock))


def as_store(ledger: Ledger | LedgerStore) -> LedgerStore:
    """The seam over ``ledger``: a SQLite :class:`Ledger` is wrapped in a :class:`SqliteStore`."""
    return SqliteStore(ledger) if isinstance(ledger, Ledger) else ledger
