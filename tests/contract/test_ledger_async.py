"""The async ledger seam under load and under a database that stops answering.

* A transaction belongs to the task that opened it: another task's write waits for it instead of
  slipping into it (both backends).
* A PostgreSQL that stops answering (every server process SIGSTOPped: a partition, a frozen VM)
  costs the coordinator one ``LedgerUnavailable`` per call after the statement timeout plus the
  client's grace -- and the event loop keeps turning meanwhile (the old synchronous backend froze
  it for as long as the call blocked). Once the server is back, the next call reconnects.
* Decisions and ledger transactions never deadlock: a chunk of events decided in one transaction
  and an operator's action submitted at the same moment both finish (the decision lock is always
  taken before the transaction).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from ftd.bench.postgres import LocalPostgres
from ftd.coordinator.decide.engine import Engine
from ftd.coordinator.decide.plugins import make_plugin_manager
from ftd.coordinator.decide.policy import PolicyGate
from ftd.coordinator.ledger.postgres import GRACE_S, PgLedger
from ftd.coordinator.ledger.sqlite import Ledger, SqliteStore
from ftd.coordinator.ledger.store import LedgerStore, LedgerUnavailable
from ftd.coordinator.model.state import ClusterState
from ftd.events import Event, Kind, Severity, make_event
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState
from tests.realparts import fresh_database, start_postgres
from tests.unit.helpers import loop_turns


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LedgerStore]:
    ledger: LedgerStore
    if request.param == "sqlite":
        ledger = SqliteStore(Ledger(tmp_path / "ledger.sqlite"))
    else:
        ledger = PgLedger(fresh_database(request.getfixturevalue("postgres")))
    yield ledger
    await ledger.close()


def event(n: int) -> Event:
    return Event(
        id=f"ev-{n}", ts=100.0 + n, node="node-1", kind=Kind.XID, severity=Severity.ERROR, source="kmsg"
    )


async def test_a_transaction_belongs_to_the_task_that_opened_it(store: LedgerStore) -> None:
    inside, leave = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with store.transaction():
            assert await store.record_event(event(1))
            inside.set()
            await leave.wait()  # e.g. a decision that awaits between two writes

    held = asyncio.create_task(holder())
    await inside.wait()
    other = asyncio.create_task(store.record_event(event(2)))
    await asyncio.sleep(0.1)
    assert not other.done()  # it waits for the transaction instead of slipping its write into it
    leave.set()
    await held
    assert await asyncio.wait_for(other, 5) is True
    assert sorted(e.id for e in await store.events()) == ["ev-1", "ev-2"]


def _server_processes(server: LocalPostgres) -> list[int]:
    postmaster = int((server.datadir / "postmaster.pid").read_text().split()[0])
    children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout
    return [postmaster, *(int(pid) for pid in children.split())]


@contextlib.contextmanager
def frozen(server: LocalPostgres) -> Iterator[None]:
    """Every process of the server stopped: connections stay open, nothing answers."""
    pids = _server_processes(server)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


async def test_a_database_that_stops_answering_never_stalls_the_event_loop(tmp_path: Path) -> None:
    server = start_postgres(tmp_path / "pg")  # its own: this test freezes it
    try:
        ledger = PgLedger(fresh_database(server), timeout_s=0.5)
        assert await ledger.record_event(event(1)) is True  # connected, schema made
        async with loop_turns(0.01) as turns:
            with frozen(server):
                for call in (ledger.record_event(event(2)), ledger.events()):  # a write, then a reconnect
                    started, before = time.monotonic(), turns.count
                    with pytest.raises(LedgerUnavailable):
                        await call
                    waited = time.monotonic() - started
                    assert waited < 0.5 + GRACE_S + 1.0, waited  # bounded by the client, not the server
                    assert turns.count - before >= 10, (turns.count - before, waited)  # the loop kept turning
        assert ledger.write_failures == 1
        assert await ledger.record_event(event(2)) is True  # back: reconnects, nothing half-written
        assert [e.id for e in await ledger.events()] == ["ev-2", "ev-1"]
        await ledger.close()
    finally:
        server.remove()


class Slow:
    """An executor that takes a moment (actions run while decisions go on)."""

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        return {}


async def test_a_chunk_and_an_operators_action_decided_together_never_deadlock(
    postgres: LocalPostgres,
) -> None:
    from ftd.plugin import hookimpl

    class Rule:  # every event: tell someone (an action per event, no budget in the way)
        @hookimpl
        def ftd_evaluate(self, event: Event, view: Any) -> list[ActionRequest]:
            return [ActionRequest(kind=ActionKind.NOTIFY, target=event.node, reason="xid", rule="t")]

    ledger = PgLedger(fresh_database(postgres))
    pm = make_plugin_manager(extra=(Rule(),), entry_points=False, disabled=["xid_catalog"])
    engine = Engine(
        state=ClusterState(),
        ledger=ledger,
        gate=PolicyGate(cooldown_s=0),
        plugins=pm,
        executors={ActionKind.NOTIFY: Slow()},
    )
    await engine.load()
    chunk = [make_event(f"node-{i}", Kind.XID, data={"code": 79}) for i in range(40)]
    manual = ActionRequest(kind=ActionKind.NOTIFY, target="node-x", reason="operator", rule="api:ops")
    _, record = await asyncio.wait_for(
        asyncio.gather(engine.handle_events(chunk), engine.submit(manual)), timeout=20
    )
    assert await engine.wait_idle(20)
    assert record.request.target == "node-x" and record.state == ActionState.SUCCEEDED
    assert engine.counters["events"] == 40
    assert len(await ledger.events(limit=100)) == 40
    stored = await ledger.actions(limit=100)
    assert len(stored) == 41 and all(r.state == ActionState.SUCCEEDED for r in stored)
    await engine.close()
    await ledger.close()
