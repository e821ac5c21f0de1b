"""The ledger on PostgreSQL, for an active/standby coordinator (``coordinator.ha.ledger = "postgresql"``).

Same tables and the same contract as the SQLite :class:`~ftd.coordinator.ledger.Ledger`
(``tests/contract/test_ledger_contract.py`` runs one suite against both), in a database every
coordinator of the pair reaches; PostgreSQL's own replication is what makes the ledger survive a host.

Fencing: once :attr:`PgLedger.epoch` is set (by the lease, :mod:`ftd.coordinator.lease`), every write
runs in a transaction that first reads the lease row ``FOR SHARE`` and goes on only if the row still
names this epoch and has not expired by the *database's* clock; otherwise it raises
:class:`~ftd.coordinator.ledger_seam.LedgerFenced` and writes nothing (counted in
:attr:`PgLedger.stale_writes_rejected`). The row lock makes the check and the write one step against
a takeover: a standby's ``UPDATE`` of the lease waits for the leader's write in flight to commit, so
what the new leader reads after taking over includes it, and nothing the old leader sends after that
lands. Reads are never fenced (standbys serve the read-only API).

Why synchronous psycopg and not its async API: the engine, the reconciler and the API call the ledger
synchronously (the SQLite backend is synchronous, and the engine's "record before acting" ordering
rests on it). Each call here is one or a few small statements on an indexed table, with a
``statement_timeout`` (``timeout_s``, default 2 s) so a stalled database cannot hold the event loop
longer than that; a timeout or a lost connection raises
:class:`~ftd.coordinator.ledger_seam.LedgerUnavailable` (an ``OSError``, like SQLite's storage errors:
the coordinator leaves the message unacknowledged and retries) and the connection is reopened on the
next call. Making every ledger caller async would touch most of the coordinator for no gain at these
sizes: a loopback round trip is ~0.1 ms.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

import msgspec
import psycopg

from ftd.coordinator.ledger import Drain
from ftd.coordinator.ledger_seam import LedgerFenced, LedgerUnavailable, action_from_row, action_row
from ftd.coordinator.plan import Plan, plan_decoder, plan_encoder
from ftd.events import Event
from ftd.logs import get_logger
from ftd.plugin.actions import ActionRecord, ActionRequest

log = get_logger(__name__)

#: The lease row every coordinator of one cluster competes for (``ftd_lease.name``).
LEASE_NAME = "coordinator"

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id TEXT PRIMARY KEY, ts DOUBLE PRECISION NOT NULL, node TEXT NOT NULL, kind TEXT NOT NULL,
    severity TEXT NOT NULL, body TEXT NOT NULL, received DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS events_node ON events(node, ts);
CREATE INDEX IF NOT EXISTS events_ts ON events(ts);
CREATE TABLE IF NOT EXISTS actions (
    id TEXT PRIMARY KEY, key TEXT NOT NULL, kind TEXT NOT NULL, target TEXT NOT NULL,
    state TEXT NOT NULL, request TEXT NOT NULL, detail TEXT NOT NULL,
    created DOUBLE PRECISION NOT NULL, updated DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS actions_key ON actions(key, updated);
CREATE INDEX IF NOT EXISTS actions_state ON actions(state);
CREATE TABLE IF NOT EXISTS plans (
    id TEXT PRIMARY KEY, event_id TEXT, state TEXT NOT NULL, body TEXT NOT NULL,
    created DOUBLE PRECISION NOT NULL, updated DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS plans_state ON plans(state);
CREATE TABLE IF NOT EXISTS drains (
    node TEXT PRIMARY KEY, origin TEXT NOT NULL, reason TEXT NOT NULL, state TEXT NOT NULL,
    since DOUBLE PRECISION NOT NULL, action_id TEXT, updated DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS ftd_lease (
    name TEXT PRIMARY KEY, holder TEXT NOT NULL, epoch BIGINT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL, renewed_at TIMESTAMPTZ NOT NULL
);
"""

_request_decoder = msgspec.json.Decoder(ActionRequest)
_event_decoder = msgspec.json.Decoder(Event)


def connect(dsn: str, *, timeout_s: float = 2.0) -> psycopg.Connection[Any]:
    """An autocommit connection whose statements give up after ``timeout_s``."""
    ms = max(1, int(timeout_s * 1000))
    try:
        return psycopg.connect(
            dsn,
            autocommit=True,
            connect_timeout=max(1, int(timeout_s + 0.999)),
            options=f"-c statement_timeout={ms} -c lock_timeout={ms}",
        )
    except psycopg.Error as exc:
        raise LedgerUnavailable(f"cannot connect to the ledger database: {exc}") from exc


def create_schema(conn: psycopg.Connection[Any]) -> None:
    """Create the tables (idempotent; two coordinators starting together both run it)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(7301)")  # concurrent CREATE IF NOT EXISTS can clash
        conn.execute(SCHEMA)


class PgLedger:
    def __init__(
        self,
        dsn: str,
        *,
        clock: Callable[[], float] = time.time,
        timeout_s: float = 2.0,
        lease_name: str = LEASE_NAME,
    ) -> None:
        """``dsn`` a libpq connection string; ``timeout_s`` each statement's limit."""
        self.dsn = dsn
        self.path = _redact(dsn)  # what logs and the API show (no password)
        self.clock = clock
        self.timeout_s = timeout_s
        self.lease_name = lease_name
        self.epoch: int | None = None  # set by the lease: writes carry it (None: not fenced)
        self.stale_writes_rejected = 0
        self.write_failures = 0  # writes (or transactions) the database did not take
        self._conn: psycopg.Connection[Any] | None = None
        self._depth = 0  # nesting of transaction()
        create_schema(self._db())

    # --- connection, transactions, fencing ---------------------------------------------------

    def _db(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.dsn, timeout_s=self.timeout_s)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @contextlib.contextmanager
    def _errors(self, write: bool = False) -> Iterator[None]:
        try:
            yield
        except (psycopg.OperationalError, psycopg.errors.QueryCanceled) as exc:
            if self._conn is not None and self._conn.closed:
                self._conn = None
            if write or self._depth:
                self.write_failures += 1
            raise LedgerUnavailable(f"ledger database: {type(exc).__name__}: {exc}") from exc

    def _fence(self, conn: psycopg.Connection[Any]) -> None:
        """Inside a transaction: refuse to go on unless this ledger's epoch holds the lease."""
        if self.epoch is None:
            return
        row = conn.execute(
            "SELECT epoch, holder, expires_at > clock_timestamp() FROM ftd_lease WHERE name = %s FOR SHARE",
            (self.lease_name,),
        ).fetchone()
        if row is None or row[0] != self.epoch or not row[2]:
            self.stale_writes_rejected += 1
            current, holder = (row[0], row[1]) if row else (None, None)
            log.warning(
                "ledger_write_fenced",
                epoch=self.epoch,
                current_epoch=current,
                holder=holder,
                expired=bool(row and not row[2]),
                total=self.stale_writes_rejected,
            )
            raise LedgerFenced(self.epoch, current, holder)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Group the writes inside into one transaction, fenced once at its start; nested use joins
        the outer one. Whatever was written is committed on leaving, also on an exception (as the
        SQLite backend does), unless a statement failed: PostgreSQL then rolls the whole group back."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        with self._errors(write=True):
            conn = self._db()
            conn.execute("BEGIN")
            self._depth = 1
        try:
            try:
                with self._errors(write=True):
                    self._fence(conn)
            except BaseException:
                with contextlib.suppress(psycopg.Error):
                    conn.execute("ROLLBACK")
                raise
            yield
        finally:
            self._depth = 0
            if not conn.closed:
                with self._errors(write=True):
                    conn.execute("COMMIT")

    def _write(self, sql: str, args: tuple[Any, ...]) -> int:
        """One fenced write; its row count."""
        if self._depth:
            with self._errors():
                return self._db().execute(sql, args).rowcount
        with self.transaction():
            return self._db().execute(sql, args).rowcount

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._errors():
            return self._db().execute(sql, args).fetchall()

    # --- events ------------------------------------------------------------------------------

    def _row(self, event: Event) -> tuple[Any, ...]:
        body = msgspec.json.encode(event).decode()
        return (event.id, event.ts, event.node, str(event.kind), str(event.severity), body, self.clock())

    def record_event(self, event: Event) -> bool:
        """Store ``event``; False if its id was already recorded (a duplicate)."""
        sql = "INSERT INTO events VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING"
        return self._write(sql, self._row(event)) == 1

    def record_summary(self, event: Event) -> None:
        self._write(
            "INSERT INTO events VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
            "ts = excluded.ts, node = excluded.node, kind = excluded.kind, severity = excluded.severity, "
            "body = excluded.body, received = excluded.received",
            self._row(event),
        )

    def events(self, *, limit: int = 100, node: str | None = None) -> list[Event]:
        sql = "SELECT body FROM events" + (" WHERE node = %s" if node else "") + " ORDER BY ts DESC LIMIT %s"
        args: tuple[Any, ...] = (node, limit) if node else (limit,)
        return [_event_decoder.decode(row[0]) for row in self._read(sql, args)]

    def export_events(self, out: IO[str]) -> int:
        count = 0
        for (body,) in self._read("SELECT body FROM events ORDER BY ts, id"):
            out.write(body + "\n")
            count += 1
        return count

    # --- actions -----------------------------------------------------------------------------

    def save_action(self, record: ActionRecord) -> None:
        self._write(
            "INSERT INTO actions VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
            "state = excluded.state, detail = excluded.detail, updated = excluded.updated",
            action_row(record, self.clock()),
        )

    def _rows(self, where: str = "", args: tuple[Any, ...] = ()) -> list[ActionRecord]:
        sql = "SELECT id, state, request, detail, created, updated FROM actions " + where
        return [action_from_row(*row) for row in self._read(sql, args)]

    def actions(self, *, limit: int = 100) -> list[ActionRecord]:
        return self._rows("ORDER BY created DESC, id DESC LIMIT %s", (limit,))

    def action(self, action_id: str) -> ActionRecord | None:
        return next(iter(self._rows("WHERE id = %s", (action_id,))), None)

    def unfinished(self) -> list[ActionRecord]:
        return self._rows("WHERE state IN ('pending', 'running') ORDER BY created")

    def recent(self, since: float) -> list[ActionRecord]:
        return self._rows("WHERE updated >= %s ORDER BY created", (since,))

    # --- plans -------------------------------------------------------------------------------

    def save_plan(self, plan: Plan) -> None:
        now = self.clock()
        plan.created = plan.created or now
        plan.updated = now
        self._write(
            "INSERT INTO plans VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
            "state = excluded.state, body = excluded.body, updated = excluded.updated",
            (plan.id, plan.event_id, plan.state, plan_encoder.encode(plan).decode(), plan.created, now),
        )

    def plan(self, plan_id: str) -> Plan | None:
        rows = self._read("SELECT body FROM plans WHERE id = %s", (plan_id,))
        return plan_decoder.decode(rows[0][0]) if rows else None

    def plan_states(self, plan_id: str) -> list[tuple[str, str, str, str | None]]:
        plan = self.plan(plan_id)
        if plan is None:
            return []
        ids = [step.action for step in plan.steps]
        states = dict(self._read("SELECT id, state FROM actions WHERE id = ANY(%s)", (ids,)))
        return [(s.action, s.kind, s.target, states.get(s.action)) for s in plan.steps]

    def plans(self, *, limit: int = 100, unfinished: bool = False) -> list[Plan]:
        where = "WHERE state != 'finished' " if unfinished else ""
        sql = f"SELECT body FROM plans {where}ORDER BY created DESC, id DESC LIMIT %s"
        return [plan_decoder.decode(row[0]) for row in self._read(sql, (limit,))]

    # --- drains ------------------------------------------------------------------------------

    def save_drain(self, drain: Drain) -> None:
        self._write(
            "INSERT INTO drains VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (node) DO UPDATE SET "
            "origin = excluded.origin, reason = excluded.reason, state = excluded.state, "
            "since = excluded.since, action_id = excluded.action_id, updated = excluded.updated",
            (drain.node, drain.origin, drain.reason, drain.state, drain.since, drain.action_id, self.clock()),
        )

    def drop_drain(self, node: str) -> bool:
        return self._write("DELETE FROM drains WHERE node = %s", (node,)) == 1

    def drains(self, origin: str | None = None) -> list[Drain]:
        sql = "SELECT node, origin, reason, since, state, action_id FROM drains"
        args: tuple[Any, ...] = ()
        if origin is not None:
            sql, args = sql + " WHERE origin = %s", (origin,)
        return [Drain(*row) for row in self._read(sql + " ORDER BY node", args)]


def _redact(dsn: str) -> str:
    """``dsn`` without its password (for logs and the API)."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return "postgresql"
    params.pop("password", None)
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})
