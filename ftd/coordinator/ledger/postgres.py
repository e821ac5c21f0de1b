"""The ledger on PostgreSQL, for an active/standby coordinator (``coordinator.ha.ledger = "postgresql"``).

Same tables and the same contract as the SQLite :class:`~ftd.coordinator.ledger.sqlite.Ledger`
(``tests/contract/test_ledger_contract.py`` runs one suite against both), in a database every
coordinator of the pair reaches; PostgreSQL's own replication is what makes the ledger survive a host.

Fencing: once :attr:`PgLedger.epoch` is set (by the lease, :mod:`ftd.coordinator.ha.lease`), every write
runs in a transaction that first reads the lease row ``FOR SHARE`` and goes on only if the row still
names this epoch and has not expired by the *database's* clock; otherwise it raises
:class:`~ftd.coordinator.ledger.store.LedgerFenced` and writes nothing (counted in
:attr:`PgLedger.stale_writes_rejected`). The row lock makes the check and the write one step against
a takeover: a standby's ``UPDATE`` of the lease waits for the leader's write in flight to commit, so
what the new leader reads after taking over includes it, and nothing the old leader sends after that
lands. Reads are never fenced (standbys serve the read-only API).

Asynchronous all the way (psycopg's ``AsyncConnection``): a slow or unreachable database suspends
only the coroutine that asked, never the event loop -- the bus session, the lease renewals, the API
and the running actions go on. Each statement is bounded twice: on the server by a
``statement_timeout`` / ``lock_timeout`` (``timeout_s``, default 2 s), and on the client by the same
limit plus :data:`GRACE_S` (:func:`bounded`): a server that stops answering altogether (a frozen
host, a partition) answers neither the statement nor its cancellation, and psycopg, when the
coroutine waiting on it is cancelled, itself waits up to ten seconds trying to cancel the query.
So the statement runs as a task of its own; past the limit the caller gets
:class:`~ftd.coordinator.ledger.store.LedgerUnavailable` (an ``OSError``, like SQLite's storage
errors: the coordinator leaves the message unacknowledged and retries) and the connection is
abandoned -- closed once that task ends, never used again (an open transaction on it is rolled back
by the server when the connection goes). The next call opens a new one. The connection serves one
task at a time: a :meth:`PgLedger.transaction` holds it for the task that opened it, other tasks'
calls wait.

The connection (and the schema, created if missing) is opened on first use, not in the constructor.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import IO, Any, TypeVar

import msgspec
import psycopg

from ftd.coordinator.ledger.store import (
    Drain,
    LedgerFenced,
    LedgerUnavailable,
    action_from_row,
    action_row,
    presence_from_row,
    presence_row,
)
from ftd.coordinator.model.plan import Plan, plan_decoder, plan_encoder
from ftd.events import Event, JobPresence
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
CREATE TABLE IF NOT EXISTS presence (
    node TEXT NOT NULL, job TEXT NOT NULL, body TEXT NOT NULL, updated DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (node, job)
);
CREATE TABLE IF NOT EXISTS ftd_lease (
    name TEXT PRIMARY KEY, holder TEXT NOT NULL, epoch BIGINT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL, renewed_at TIMESTAMPTZ NOT NULL
);
"""

_request_decoder = msgspec.json.Decoder(ActionRequest)
_event_decoder = msgspec.json.Decoder(Event)


#: How much longer than its statement timeout the client waits for an answer before it gives up on
#: the connection (a network partition: neither the result nor the cancellation comes back).
GRACE_S = 1.0

T = TypeVar("T")

#: Statements given up on, still running to their end, and the connection each runs on.
_abandoned: dict[asyncio.Task[Any], psycopg.AsyncConnection[Any] | None] = {}


async def bounded(
    work: Coroutine[Any, Any, T], limit: float, conn: psycopg.AsyncConnection[Any] | None = None
) -> T:
    """``await work`` for ``limit`` seconds at most: past that, :class:`TimeoutError` at once, and the
    work (and its connection ``conn``, closed when the work ends) is abandoned, not cancelled: a
    cancelled psycopg wait first tries to cancel the query on the server, which takes ten seconds
    against a server that does not answer. If the caller is cancelled, so is the work."""
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=limit)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if task in done:
        return task.result()
    _abandoned[task] = conn

    def ended(finished: asyncio.Task[Any]) -> None:
        _abandoned.pop(finished, None)
        late = None
        if not finished.cancelled() and finished.exception() is None:  # else: retrieved, ignored
            late = finished.result()
        for used in (conn, late):  # a connection that opened after all is dropped too
            if isinstance(used, psycopg.AsyncConnection) and not used.closed:
                with contextlib.suppress(Exception):
                    used.pgconn.finish()

    task.add_done_callback(ended)
    raise TimeoutError(f"no answer within {limit:.1f} s")


async def connect(dsn: str, *, timeout_s: float = 2.0) -> psycopg.AsyncConnection[Any]:
    """An autocommit connection whose statements give up after ``timeout_s`` (on the server; the
    client bounds its own waits with :func:`bounded`), the tables created if missing; the ledger's
    and the lease's. :class:`LedgerUnavailable` when either step fails or does not answer."""
    ms = max(1, int(timeout_s * 1000))
    opening = psycopg.AsyncConnection.connect(
        dsn,
        autocommit=True,
        connect_timeout=max(1, int(timeout_s + 0.999)),
        options=f"-c statement_timeout={ms} -c lock_timeout={ms}",
    )
    try:
        conn = await bounded(opening, timeout_s + GRACE_S)
    except (psycopg.Error, TimeoutError) as exc:
        raise LedgerUnavailable(f"cannot connect to the ledger database: {exc}") from exc
    try:
        await bounded(create_schema(conn), timeout_s + GRACE_S, conn)
    except BaseException as exc:
        discard(conn)
        if isinstance(exc, psycopg.Error | TimeoutError):
            raise LedgerUnavailable(f"cannot create the ledger's tables: {exc}") from exc
        raise
    return conn


async def create_schema(conn: psycopg.AsyncConnection[Any]) -> None:
    """Create the tables (idempotent; two coordinators starting together both run it)."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(7301)")  # concurrent CREATE IF NOT EXISTS can clash
        await conn.execute(SCHEMA)


def discard(conn: psycopg.AsyncConnection[Any] | None) -> None:
    """Drop ``conn`` after a failure, whatever state it is in (never raises, never waits on the
    server). A statement :func:`bounded` abandoned on it closes it when it ends instead."""
    if conn is None or conn.closed or any(c is conn for c in _abandoned.values()):
        return
    with contextlib.suppress(Exception):
        conn.pgconn.finish()


async def rows_of(
    conn: psycopg.AsyncConnection[Any], sql: str, args: tuple[Any, ...], fetch: bool
) -> tuple[int, list[tuple[Any, ...]]]:
    """Run one statement: its row count and, with ``fetch``, its rows."""
    cursor = await conn.execute(sql, args)
    return cursor.rowcount, (await cursor.fetchall() if fetch else [])


class PgLedger:
    def __init__(
        self,
        dsn: str,
        *,
        clock: Callable[[], float] = time.time,
        timeout_s: float = 2.0,
        lease_name: str = LEASE_NAME,
    ) -> None:
        """``dsn`` a libpq connection string; ``timeout_s`` each statement's limit. Nothing is
        connected here: the first call opens the connection and creates the schema if missing."""
        self.dsn = dsn
        self.path = _redact(dsn)  # what logs and the API show (no password)
        self.clock = clock
        self.timeout_s = timeout_s
        self.lease_name = lease_name
        self.epoch: int | None = None  # set by the lease: writes carry it (None: not fenced)
        self.stale_writes_rejected = 0
        self.write_failures = 0  # writes (or transactions) the database did not take
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()  # one task at a time on the connection
        self._owner: asyncio.Task[Any] | None = None  # the task whose transaction is open

    # --- connection, transactions, fencing ---------------------------------------------------

    async def _db(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await connect(self.dsn, timeout_s=self.timeout_s)
        return self._conn

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            with contextlib.suppress(Exception):
                await bounded(conn.close(), GRACE_S, conn)

    @contextlib.asynccontextmanager
    async def _errors(self, write: bool = False) -> AsyncIterator[None]:
        """Database failures and the client's own timeouts as :class:`LedgerUnavailable`; the
        connection is dropped after either (its state is unknown)."""
        try:
            yield
        except (psycopg.OperationalError, psycopg.errors.QueryCanceled, TimeoutError) as exc:
            conn, self._conn = self._conn, None
            discard(conn)
            if write or self._owner is not None:
                self.write_failures += 1
            raise LedgerUnavailable(f"ledger database: {type(exc).__name__}: {exc}") from exc

    async def _statement(
        self, sql: str, args: tuple[Any, ...] = (), *, fetch: bool = False
    ) -> tuple[int, list[tuple[Any, ...]]]:
        """One statement on the connection (opened if need be), bounded by :func:`bounded`: its row
        count and, with ``fetch``, its rows."""
        conn = await self._db()
        return await bounded(rows_of(conn, sql, args, fetch), self.timeout_s + GRACE_S, conn)

    def _mine(self) -> bool:
        """The calling task has a transaction open: its statements go straight into it."""
        return self._owner is not None and self._owner is asyncio.current_task()

    async def _fence(self) -> None:
        """Inside a transaction: refuse to go on unless this ledger's epoch holds the lease."""
        if self.epoch is None:
            return
        _, rows = await self._statement(
            "SELECT epoch, holder, expires_at > clock_timestamp() FROM ftd_lease WHERE name = %s FOR SHARE",
            (self.lease_name,),
            fetch=True,
        )
        row = rows[0] if rows else None
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

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """Group the writes inside into one transaction, fenced once at its start; nested use (by the
        same task) joins the outer one. Whatever was written is committed on leaving, also on an
        exception (as the SQLite backend does), unless a statement failed: PostgreSQL then rolls the
        whole group back (and a connection dropped on a failure takes its transaction with it). The
        connection is the opening task's until then."""
        if self._mine():
            yield
            return
        async with self._lock:
            async with self._errors(write=True):
                await self._statement("BEGIN")
            conn = self._conn
            self._owner = asyncio.current_task()
            try:
                try:
                    async with self._errors(write=True):
                        await self._fence()
                except BaseException:
                    if conn is not None and conn is self._conn:
                        with contextlib.suppress(Exception):
                            await self._statement("ROLLBACK")
                    raise
                yield
            finally:
                try:
                    if conn is not None and conn is self._conn and not conn.closed:
                        async with self._errors(write=True):
                            await self._statement("COMMIT")
                finally:
                    self._owner = None

    async def _write(self, sql: str, args: tuple[Any, ...]) -> int:
        """One fenced write; its row count."""
        if self._mine():
            async with self._errors():
                return (await self._statement(sql, args))[0]
        async with self.transaction(), self._errors():
            return (await self._statement(sql, args))[0]

    async def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if self._mine():
            async with self._errors():
                return (await self._statement(sql, args, fetch=True))[1]
        async with self._lock, self._errors():
            return (await self._statement(sql, args, fetch=True))[1]

    # --- events ------------------------------------------------------------------------------

    def _row(self, event: Event) -> tuple[Any, ...]:
        body = msgspec.json.encode(event).decode()
        return (event.id, event.ts, event.node, str(event.kind), str(event.severity), body, self.clock())

    async def record_event(self, event: Event) -> bool:
        """Store ``event``; False if its id was already recorded (a duplicate)."""
        sql = "INSERT INTO events VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING"
        return await self._write(sql, self._row(event)) == 1

    async def record_summary(self, event: Event) -> None:
        await self._write(
            "INSERT INTO events VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
            "ts = excluded.ts, node = excluded.node, kind = excluded.kind, severity = excluded.severity, "
            "body = excluded.body, received = excluded.received",
            self._row(event),
        )

    async def events(self, *, limit: int = 100, node: str | None = None) -> list[Event]:
        sql = "SELECT body FROM events" + (" WHERE node = %s" if node else "") + " ORDER BY ts DESC LIMIT %s"
        args: tuple[Any, ...] = (node, limit) if node else (limit,)
        return [_event_decoder.decode(row[0]) for row in await self._read(sql, args)]

    async def export_events(self, out: IO[str]) -> int:
        count = 0
        for (body,) in await self._read("SELECT body FROM events ORDER BY ts, id"):
            out.write(body + "\n")
            count += 1
        return count

    # --- actions -----------------------------------------------------------------------------

    async def save_action(self, record: ActionRecord) -> None:
        await self._write(
            "INSERT INTO actions VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
            "state = excluded.state, detail = excluded.detail, updated = excluded.updated",
            action_row(record, self.clock()),
        )

    async def _rows(self, where: str = "", args: tuple[Any, ...] = ()) -> list[ActionRecord]:
        sql = "SELECT id, state, request, detail, created, updated FROM actions " + where
        return [action_from_row(*row) for row in await self._read(sql, args)]

    async def actions(self, *, limit: int = 100) -> list[ActionRecord]:
        return await self._rows("ORDER BY created DESC, id DESC LIMIT %s", (limit,))

    async def action(self, action_id: str) -> ActionRecord | None:
        return next(iter(await self._rows("WHERE id = %s", (action_id,))), None)

    async def unfinished(self) -> list[ActionRecord]:
        return await self._rows("WHERE state IN ('pending', 'running') ORDER BY created")

    async def recent(self, since: float) -> list[ActionRecord]:
        return await self._rows("WHERE updated >= %s ORDER BY created", (since,))

    async def action_counts(self) -> dict[tuple[str, str], int]:
        rows = await self._read("SELECT kind, state, COUNT(*) FROM actions GROUP BY kind, state", ())
        return {(str(kind), str(state)): int(n) for kind, state, n in rows}

    # --- plans -------------------------------------------------------------------------------

    async def save_plan(self, plan: Plan) -> None:
        now = self.clock()
        plan.created = plan.created or now
        plan.updated = now
        await self._write(
            "INSERT INTO plans VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
            "state = excluded.state, body = excluded.body, updated = excluded.updated",
            (plan.id, plan.event_id, plan.state, plan_encoder.encode(plan).decode(), plan.created, now),
        )

    async def plan(self, plan_id: str) -> Plan | None:
        rows = await self._read("SELECT body FROM plans WHERE id = %s", (plan_id,))
        return plan_decoder.decode(rows[0][0]) if rows else None

    async def plan_states(self, plan_id: str) -> list[tuple[str, str, str, str | None]]:
        plan = await self.plan(plan_id)
        if plan is None:
            return []
        ids = [step.action for step in plan.steps]
        states = dict(await self._read("SELECT id, state FROM actions WHERE id = ANY(%s)", (ids,)))
        return [(s.action, s.kind, s.target, states.get(s.action)) for s in plan.steps]

    async def plans(self, *, limit: int = 100, unfinished: bool = False) -> list[Plan]:
        where = "WHERE state != 'finished' " if unfinished else ""
        sql = f"SELECT body FROM plans {where}ORDER BY created DESC, id DESC LIMIT %s"
        return [plan_decoder.decode(row[0]) for row in await self._read(sql, (limit,))]

    # --- drains ------------------------------------------------------------------------------

    async def save_drain(self, drain: Drain) -> None:
        await self._write(
            "INSERT INTO drains VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (node) DO UPDATE SET "
            "origin = excluded.origin, reason = excluded.reason, state = excluded.state, "
            "since = excluded.since, action_id = excluded.action_id, updated = excluded.updated",
            (drain.node, drain.origin, drain.reason, drain.state, drain.since, drain.action_id, self.clock()),
        )

    async def drop_drain(self, node: str) -> bool:
        return await self._write("DELETE FROM drains WHERE node = %s", (node,)) == 1

    async def drains(self, origin: str | None = None) -> list[Drain]:
        sql = "SELECT node, origin, reason, since, state, action_id FROM drains"
        args: tuple[Any, ...] = ()
        if origin is not None:
            sql, args = sql + " WHERE origin = %s", (origin,)
        return [Drain(*row) for row in await self._read(sql + " ORDER BY node", args)]

    # --- job presence ------------------------------------------------------------------------

    async def save_presence(self, presence: JobPresence) -> None:
        await self._write(
            "INSERT INTO presence VALUES (%s, %s, %s, %s) ON CONFLICT (node, job) DO UPDATE SET "
            "body = excluded.body, updated = excluded.updated",
            (*presence_row(presence), self.clock()),
        )

    async def drop_presence(self, node: str, job: str) -> bool:
        return await self._write("DELETE FROM presence WHERE node = %s AND job = %s", (node, job)) == 1

    async def presences(self) -> list[JobPresence]:
        rows = await self._read("SELECT body FROM presence ORDER BY node, job", ())
        return [presence_from_row(body) for (body,) in rows]


def _redact(dsn: str) -> str:
    """``dsn`` without its password (for logs and the API)."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return "postgresql"
    params.pop("password", None)
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})
