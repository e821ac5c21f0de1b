"""The ledger seam: what the engine, the reconciler and the API need from a ledger, whatever holds it.

The seam is asynchronous (:class:`LedgerStore`): a ledger on another host (PostgreSQL) must never
stall the coordinator's event loop -- its bus session, lease renewals, API and running actions --
while the database is slow or unreachable. Two backends implement it:
:class:`ftd.coordinator.ledger.sqlite.SqliteStore` (the SQLite
:class:`~ftd.coordinator.ledger.sqlite.Ledger`, the embedded default: one machine, ``ftd demo``,
replays, the simulator; its calls are local file I/O and run inline) and
:class:`ftd.coordinator.ledger.postgres.PgLedger` (PostgreSQL through psycopg's async connection,
for an active/standby coordinator pair: ``coordinator.ha``). The same contract suite
(``tests/contract/test_ledger_contract.py``) runs against both.

Fencing (:mod:`ftd.coordinator.ha.lease`): a ledger shared by several coordinators takes writes only from
the holder of the current lease epoch. A write carrying a stale epoch raises :class:`LedgerFenced` and
changes nothing; the coordinator that gets it has lost the lease and must stop acting.
:class:`LedgerUnavailable` (an :class:`OSError`, like the storage errors of the SQLite backend the
coordinator already counts and retries) says the database could not be reached or answered too late.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Protocol

import msgspec

from ftd.events import JobPresence
from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState

if TYPE_CHECKING:
    from ftd.coordinator.model.plan import Plan
    from ftd.events import Event


@dataclass
class Drain:
    """A node out of service: ``origin`` ``"ftd"`` or ``"external"``; ``state`` the scheduler's
    spelling when last seen (empty until listed); ``action_id`` the drain_node action, if ftd's."""

    node: str
    origin: str
    reason: str
    since: float
    state: str = ""
    action_id: str | None = None


#: The ``node`` of events the coordinator writes about itself (not a node of the cluster: the engine
#: leaves them out of the cluster history). Every backend and every stage spells it the same.
NOTICE_NODE = "ftd-coordinator"

_request_decoder = msgspec.json.Decoder(ActionRequest)
_presence_decoder = msgspec.json.Decoder(JobPresence)


def presence_row(presence: JobPresence) -> tuple[str, str, str]:
    """The ``presence`` row of ``presence``, the same in both backends: node, job, body (JSON)."""
    return presence.node, presence.job, msgspec.json.encode(presence).decode()


def presence_from_row(body: str) -> JobPresence:
    return _presence_decoder.decode(body)


def action_row(record: ActionRecord, now: float) -> tuple[Any, ...]:
    """Stamp ``record`` (created once, updated now) and give its ``actions`` row, the same in both
    backends: id, key, kind, target, state, request (JSON), detail (JSON), created, updated."""
    record.created = record.created or now
    record.updated = now
    req = record.request
    return (
        record.id,
        req.key,
        req.kind,
        req.target,
        str(record.state),
        msgspec.json.encode(req).decode(),
        json.dumps(record.detail, default=str),
        record.created,
        record.updated,
    )


def action_from_row(
    id_: str, state: str, request: str, detail: str, created: float, updated: float
) -> ActionRecord:
    """The record of a ``SELECT id, state, request, detail, created, updated`` row."""
    return ActionRecord(
        id=id_,
        request=_request_decoder.decode(request),
        state=ActionState(state),
        detail=json.loads(detail),
        created=created,
        updated=updated,
    )


class LedgerFenced(OSError):
    """A write by a coordinator whose lease epoch is no longer the current one (or has expired).

    An ``OSError`` so the coordinator treats it as it treats a storage error: the bus message in hand
    is left unacknowledged (the next leader gets it), nothing is receipted."""

    def __init__(self, epoch: int | None, current: int | None, holder: str | None) -> None:
        super().__init__(f"write with lease epoch {epoch} refused: the current epoch is {current} ({holder})")
        self.epoch, self.current, self.holder = epoch, current, holder


class LedgerUnavailable(OSError):
    """The ledger's database could not be reached, or did not answer within its statement timeout."""


class LedgerStore(Protocol):
    """The ledger's contract (see :class:`ftd.coordinator.ledger.sqlite.Ledger` for each method's meaning).

    ``transaction()`` groups the writes made inside it by the task that opened it into one commit;
    another task's calls wait for it to end (a transaction is never shared across tasks)."""

    path: str
    clock: Callable[[], float]

    async def close(self) -> None: ...

    def transaction(self) -> contextlib.AbstractAsyncContextManager[None]: ...

    async def record_event(self, event: Event) -> bool: ...

    async def record_summary(self, event: Event) -> None: ...

    async def events(self, *, limit: int = 100, node: str | None = None) -> list[Event]: ...

    async def export_events(self, out: IO[str]) -> int: ...

    async def save_action(self, record: ActionRecord) -> None: ...

    async def actions(self, *, limit: int = 100) -> list[ActionRecord]: ...

    async def action(self, action_id: str) -> ActionRecord | None: ...

    async def unfinished(self) -> list[ActionRecord]: ...

    async def recent(self, since: float) -> list[ActionRecord]: ...

    async def action_counts(self) -> dict[tuple[str, str], int]:
        """How many actions the ledger holds, by (kind, state): the metrics' totals that survive a
        restart (each action is counted once, in the state it is in now)."""
        ...

    async def save_plan(self, plan: Plan) -> None: ...

    async def plan(self, plan_id: str) -> Plan | None: ...

    async def plan_states(self, plan_id: str) -> list[tuple[str, str, str, str | None]]: ...

    async def plans(self, *, limit: int = 100, unfinished: bool = False) -> list[Plan]: ...

    async def save_drain(self, drain: Drain) -> None: ...

    async def drop_drain(self, node: str) -> bool: ...

    async def drains(self, origin: str | None = None) -> list[Drain]: ...

    async def save_presence(self, presence: JobPresence) -> None:
        """Remember which ranks of a job run on a node (replacing that node's row for the job)."""

    async def drop_presence(self, node: str, job: str) -> bool:
        """Forget a job's presence on a node; False when none was remembered."""

    async def presences(self) -> list[JobPresence]:
        """Every remembered presence, by node then job."""
