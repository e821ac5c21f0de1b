"""The leader lease and its fencing: several coordinators may run, exactly one acts.

The lease is one row of ``ftd_lease`` in the PostgreSQL ledger (:mod:`ftd.coordinator.ledger.postgres`):
``holder``, ``epoch`` and ``expires_at``, all times taken from the *database's* clock so the
coordinators' clocks never have to agree.

* **Acquire** (:meth:`Lease.try_acquire`): one statement that takes the row only if it has expired
  (or does not exist yet) and increases ``epoch`` -- every new term, even the same process's after a
  lapse, gets a new epoch. Two standbys racing for it: the row lock lets one win.
* **Renew** (:meth:`Lease.renew`, every ``renew_s``): extends ``expires_at`` only while the row still
  names this holder and epoch and has not expired; otherwise the term is over.
* **Local deadline**: the holder notes the monotonic time *before* sending each acquire/renew and
  counts its lease valid until that time plus the TTL. The database set the expiry from a later
  instant, so the local deadline always falls first: a process frozen (SIGSTOP, a long GC pause, a VM
  migration) wakes up to a deadline already passed and knows it is fenced before doing anything,
  without asking the database.
* **Fencing**: the lease sets its epoch on the ledger (:attr:`PgLedger.epoch
  <ftd.coordinator.ledger.postgres.PgLedger.epoch>`), which refuses every write whose epoch is not the
  current one (:class:`~ftd.coordinator.ledger.store.LedgerFenced`). Side effects outside the ledger
  are guarded here: :class:`FencedScheduler` (every scheduler call), :class:`FencedBus`
  (directives, receipts and acknowledgements on the bus) and :func:`guard_executors` (before each
  executor call or phase) raise :class:`LeaseLost` once the local deadline has passed. An executor
  that shells out by itself (the client-less Slurm fallback's ``scancel``) is guarded per phase, not
  per command.

Release (:meth:`Lease.release`): a coordinator stopping cleanly expires its own term so a standby
takes over at its next poll instead of waiting out the TTL.

All calls are small asynchronous statements, each bounded by a statement timeout on the server and
the same limit plus a grace on the client (:mod:`ftd.coordinator.ledger.postgres`): a renewal stuck behind a
partition cannot outlive the term it renews. The lease uses its own connection so a renewal never
waits behind the ledger's transaction. :meth:`Lease.check`, called before every side effect, asks
no one: it compares the local deadline with the monotonic clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from ftd.bus.base import Bus, ForwardingBus, Message
from ftd.coordinator.actions.scheduler import (
    JobHolder,
    JobInfo,
    NodeInfo,
    Scheduler,
    SchedulerError,
    job_holder,
)
from ftd.coordinator.ledger.postgres import GRACE_S, LEASE_NAME, bounded, connect, discard, rows_of
from ftd.coordinator.ledger.store import LedgerUnavailable
from ftd.logs import get_logger
from ftd.plugin.actions import ActionRecord
from ftd.plugin.hookspecs import Executor

log = get_logger(__name__)


class LeaseLost(RuntimeError):
    """This coordinator no longer holds the lease (or cannot tell that it does): it must not act."""


@dataclass(frozen=True)
class LeaseInfo:
    """The lease row as the database has it now (for ``/metrics``, ``ftd status``, the API)."""

    holder: str | None
    epoch: int
    age_s: float | None  # since the last renewal
    expires_in_s: float | None  # negative: expired


class Lease:
    def __init__(
        self,
        dsn: str,
        identity: str,
        *,
        ttl_s: float = 5.0,
        renew_s: float | None = None,
        name: str = LEASE_NAME,
        timeout_s: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``renew_s`` defaults to a third of the TTL; ``timeout_s`` (each statement's limit) to a
        fifth of it, at least 0.2 s, so a slow database is noticed well inside the lease."""
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.dsn = dsn
        self.identity = identity
        self.ttl_s = ttl_s
        self.renew_s = renew_s if renew_s is not None else ttl_s / 3
        if not 0 < self.renew_s < ttl_s:
            raise ValueError("renew_s must be positive and shorter than ttl_s")
        self.name = name
        self.timeout_s = timeout_s if timeout_s is not None else max(0.2, ttl_s / 5)
        self.monotonic = monotonic
        self.epoch: int | None = None  # the term held now (None: not the leader)
        self.deadline = 0.0  # monotonic time the term lapses, as far as this process knows
        self.terms = 0  # terms won by this process
        self._conn: psycopg.AsyncConnection[Any] | None = None  # opened (with the schema) on first use
        self._lock = asyncio.Lock()  # one statement at a time on the connection

    async def _one(self, sql: str, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        async with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = await connect(self.dsn, timeout_s=self.timeout_s)
                conn = self._conn
                _, rows = await bounded(rows_of(conn, sql, args, True), self.timeout_s + GRACE_S, conn)
                return rows[0] if rows else None
            except (psycopg.Error, TimeoutError) as exc:  # connect() raises LedgerUnavailable itself
                broken, self._conn = self._conn, None
                discard(broken)
                raise LedgerUnavailable(f"lease: {type(exc).__name__}: {exc}") from exc

    # --- the term ----------------------------------------------------------------------------

    @property
    def held(self) -> bool:
        """True while this process holds a term whose local deadline has not passed."""
        return self.epoch is not None and self.monotonic() < self.deadline

    def check(self) -> int:
        """The epoch held now; :class:`LeaseLost` if none (called before every side effect)."""
        epoch = self.epoch
        if epoch is None or self.monotonic() >= self.deadline:
            raise LeaseLost(f"{self.identity} does not hold the lease (epoch {epoch}, past its deadline)")
        return epoch

    async def try_acquire(self) -> bool:
        """Take the lease if it has expired (or was never taken); True when this process now leads."""
        sent = self.monotonic()
        row = await self._one(
            "INSERT INTO ftd_lease AS l (name, holder, epoch, expires_at, renewed_at) "
            "VALUES (%s, %s, 1, clock_timestamp() + make_interval(secs => %s), clock_timestamp()) "
            "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, epoch = l.epoch + 1, "
            "expires_at = excluded.expires_at, renewed_at = excluded.renewed_at "
            "WHERE l.expires_at <= clock_timestamp() RETURNING epoch",
            (self.name, self.identity, self.ttl_s),
        )
        if row is None:
            return False
        self.epoch, self.deadline = int(row[0]), sent + self.ttl_s
        self.terms += 1
        log.info("lease_acquired", identity=self.identity, epoch=self.epoch, ttl_s=self.ttl_s)
        return True

    async def renew(self) -> bool:
        """Extend the term held; False (and no term any more) when it is over. A database error is
        raised (:class:`LedgerUnavailable`): the term is still valid until its local deadline."""
        if self.epoch is None:
            return False
        if self.monotonic() >= self.deadline:
            self._lose("deadline_passed")
            return False
        sent = self.monotonic()
        row = await self._one(
            "UPDATE ftd_lease SET expires_at = clock_timestamp() + make_interval(secs => %s), "
            "renewed_at = clock_timestamp() WHERE name = %s AND holder = %s AND epoch = %s "
            "AND expires_at > clock_timestamp() RETURNING epoch",
            (self.ttl_s, self.name, self.identity, self.epoch),
        )
        if row is None:
            self._lose("taken_or_expired")
            return False
        self.deadline = sent + self.ttl_s
        return True

    def _lose(self, why: str) -> None:
        log.warning("lease_lost", identity=self.identity, epoch=self.epoch, why=why)
        self.epoch = None
        self.deadline = 0.0

    async def release(self) -> None:
        """End the term now (clean shutdown): a standby need not wait for the TTL."""
        epoch, self.epoch, self.deadline = self.epoch, None, 0.0
        if epoch is None:
            return
        try:
            await self._one(
                "UPDATE ftd_lease SET expires_at = clock_timestamp() WHERE name = %s AND holder = %s "
                "AND epoch = %s RETURNING epoch",
                (self.name, self.identity, epoch),
            )
            log.info("lease_released", identity=self.identity, epoch=epoch)
        except LedgerUnavailable as exc:
            log.warning("lease_release_failed", identity=self.identity, epoch=epoch, error=str(exc))

    async def info(self) -> LeaseInfo:
        """The lease as the database sees it now (epoch 0: never taken)."""
        row = await self._one(
            "SELECT holder, epoch, EXTRACT(EPOCH FROM clock_timestamp() - renewed_at)::float8, "
            "EXTRACT(EPOCH FROM expires_at - clock_timestamp())::float8 FROM ftd_lease WHERE name = %s",
            (self.name,),
        )
        if row is None:
            return LeaseInfo(None, 0, None, None)
        return LeaseInfo(row[0], int(row[1]), float(row[2]), float(row[3]))

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        discard(conn)


# --- guards: no side effect without the lease ---------------------------------------------------

Check = Callable[[], object]


class FencedScheduler:
    """A :class:`Scheduler` that checks the lease before every call (reads included: cheap, and a
    fenced coordinator has no business asking either)."""

    def __init__(self, inner: Scheduler, check: Check) -> None:
        self.inner = inner
        self.check = check
        self.name = inner.name

    async def drain(self, node: str, reason: str) -> None:
        self.check()
        await self.inner.drain(node, reason)

    async def resume(self, node: str) -> None:
        self.check()
        await self.inner.resume(node)

    async def requeue(self, job: str, exclude: Sequence[str] = ()) -> None:
        self.check()
        await self.inner.requeue(job, exclude)

    def _holder(self) -> JobHolder:
        """The inner scheduler's holds, once the lease is checked (the pinned-job hold)."""
        self.check()
        holder = job_holder(self.inner)
        if holder is None:
            raise SchedulerError(f"scheduler {self.name} cannot hold jobs")
        return holder

    async def requeue_held(self, job: str) -> None:
        await self._holder().requeue_held(job)

    async def release(self, job: str) -> None:
        await self._holder().release(job)

    async def node_info(self, node: str) -> NodeInfo:
        self.check()
        return await self.inner.node_info(node)

    async def job_info(self, job: str) -> JobInfo:
        self.check()
        return await self.inner.job_info(job)

    async def list_nodes(self) -> list[NodeInfo]:
        self.check()
        return await self.inner.list_nodes()

    async def reboot(self, node: str, reason: str, nextstate: str = "RESUME") -> None:
        self.check()
        await self.inner.reboot(node, reason, nextstate)

    async def job_nodes(self, job: str) -> tuple[str, ...]:
        self.check()
        return await self.inner.job_nodes(job)

    def __getattr__(self, name: str) -> Any:  # a backend's extras (settings the executors read)
        return getattr(self.inner, name)


class FencedBus(ForwardingBus):
    """A :class:`~ftd.bus.base.Bus` that publishes (directives, receipts, status) and acknowledges
    deliveries to the broker only while the lease is held: a fenced leader's unacknowledged messages
    stay in the shared persistent session for the next leader. (The birth message the MQTT client
    itself repeats on a reconnect is not guarded: a fenced coordinator stops its bus at once.)"""

    def __init__(self, inner: Bus, check: Check) -> None:
        super().__init__(inner)
        self.check = check

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self.check()
        await self.inner.publish(topic, payload, retain=retain)

    def ack(self, message: Message) -> None:
        try:
            self.check()
        except LeaseLost:
            return  # left for the next leader (redelivered from the session)
        self.inner.ack(message)


class _Guarded:
    """A plain executor, called only while the lease is held."""

    def __init__(self, inner: Executor, check: Check) -> None:
        self.inner, self.check = inner, check

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        self.check()
        return dict(await self.inner(record))


class _GuardedPhased(_Guarded):
    """A phased executor (:class:`~ftd.coordinator.model.plan.PhasedExecutor`), each phase guarded."""

    def __init__(self, inner: Executor, check: Check) -> None:
        super().__init__(inner, check)
        self.phases: tuple[str, ...] = tuple(getattr(inner, "phases", ()))
        for attr in ("disruptive_phase", "settled_phase"):
            if hasattr(inner, attr):
                setattr(self, attr, getattr(inner, attr))

    async def run_phase(self, record: ActionRecord, phase: str) -> dict[str, Any]:
        self.check()
        result: Mapping[str, Any] = await getattr(self.inner, "run_phase")(record, phase)  # noqa: B009
        return dict(result)


def guard_executors(executors: Mapping[str, Executor], check: Check) -> dict[str, Executor]:
    """Each executor wrapped so it starts (and each phase starts) only while the lease is held."""
    out: dict[str, Executor] = {}
    for kind, executor in executors.items():
        phased = getattr(executor, "phases", None) and callable(getattr(executor, "run_phase", None))
        out[kind] = _GuardedPhased(executor, check) if phased else _Guarded(executor, check)
    return out
