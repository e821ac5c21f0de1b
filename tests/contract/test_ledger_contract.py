"""One ledger contract, two backends: SQLite (the embedded default) and PostgreSQL (the HA ledger).

Every test runs against both: a fresh SQLite file, and a fresh database on a real PostgreSQL this
module starts itself (``tests/realparts.start_postgres``; skipped without the package, failed under
``FTD_REQUIRE_REAL=1``).
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftd.bench.postgres import LocalPostgres
from ftd.coordinator.ledger import Drain, Ledger
from ftd.coordinator.ledger_seam import LedgerStore
from ftd.coordinator.plan import Dependency, Plan, Step
from ftd.events import Event, Kind, Severity
from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState
from tests.realparts import start_postgres

_db_numbers = itertools.count()


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPostgres]:
    server = start_postgres(tmp_path_factory.mktemp("pg"))
    yield server
    server.remove()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[LedgerStore, Clock]]:
    clock = Clock()
    store: LedgerStore
    if request.param == "sqlite":
        store = Ledger(tmp_path / "ledger.sqlite", clock=clock)
    else:
        import psycopg

        from ftd.coordinator.ledger_pg import PgLedger

        server: LocalPostgres = request.getfixturevalue("postgres")
        name = f"contract_{next(_db_numbers)}"
        with psycopg.connect(server.dsn, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        store = PgLedger(server.dsn.replace("dbname=ftd", f"dbname={name}"), clock=clock)
    yield store, clock
    store.close()


def event(n: int, *, node: str = "node-1", ts: float | None = None, count: int = 1) -> Event:
    return Event(
        id=f"ev-{n}",
        ts=ts if ts is not None else 100.0 + n,
        node=node,
        kind=Kind.XID,
        severity=Severity.ERROR,
        source="kmsg",
        data={"code": 79, "count": count},
    )


def record(n: int, state: ActionState = ActionState.PENDING, kind: str = "drain_node") -> ActionRecord:
    req = ActionRequest(kind=kind, target=f"node-{n}", reason="xid 79", params={"n": n}, rule="xid")
    return ActionRecord(id=f"act-{n}", request=req, state=state)


def test_events_dedupe_order_filter_export(ledger: tuple[LedgerStore, Clock]) -> None:
    store, _ = ledger
    assert store.record_event(event(1)) is True
    assert store.record_event(event(1)) is False  # the same id again: a duplicate
    assert store.record_event(event(2, node="node-2")) is True
    assert store.record_event(event(3)) is True
    assert [e.id for e in store.events()] == ["ev-3", "ev-2", "ev-1"]  # newest first
    assert [e.id for e in store.events(limit=2)] == ["ev-3", "ev-2"]
    assert [e.id for e in store.events(node="node-1")] == ["ev-3", "ev-1"]
    assert store.events()[0] == event(3)  # the body round-trips
    out = io.StringIO()
    assert store.export_events(out) == 3
    assert [line[:40].count("ev-") for line in out.getvalue().splitlines()] == [1, 1, 1]


def test_summary_replaces_its_row(ledger: tuple[LedgerStore, Clock]) -> None:
    store, _ = ledger
    store.record_summary(event(7, count=1))
    store.record_summary(event(7, count=5))
    assert [(e.id, e.data["count"]) for e in store.events()] == [("ev-7", 5)]
    assert store.record_event(event(7)) is False


def test_actions_saved_updated_and_listed(ledger: tuple[LedgerStore, Clock]) -> None:
    store, clock = ledger
    a, b, c = record(1), record(2), record(3, ActionState.SUCCEEDED)
    for r in (a, b, c):
        store.save_action(r)
        clock.now += 1
    assert (a.created, a.updated) == (1000.0, 1000.0)
    b.state = ActionState.RUNNING
    b.detail["phases_done"] = ["save"]
    store.save_action(b)
    assert b.created == 1001.0 and b.updated == 1003.0
    got = store.action("act-2")
    assert got is not None and got == b
    assert store.action("nope") is None
    assert [r.id for r in store.actions()] == ["act-3", "act-2", "act-1"]
    assert [r.id for r in store.actions(limit=1)] == ["act-3"]
    assert [(r.id, r.state) for r in store.unfinished()] == [
        ("act-1", ActionState.PENDING),
        ("act-2", ActionState.RUNNING),
    ]
    assert [r.id for r in store.recent(1002.0)] == ["act-2", "act-3"]


def test_plans_and_their_steps(ledger: tuple[LedgerStore, Clock]) -> None:
    store, clock = ledger
    store.save_action(record(1, kind="checkpoint_restart"))
    after = Dependency("act-1", 1)
    steps = [
        Step(action="act-1", kind="checkpoint_restart", target="node-1", role="job"),
        Step(action="act-2", kind="gpu_reset", target="node-2", role="node", after={0: [after]}),
    ]
    plan = Plan(id="plan-1", event_id="ev-1", steps=steps)
    store.save_plan(plan)
    clock.now += 5
    store.save_plan(Plan(id="plan-2", event_id=None, steps=[], state="finished"))
    assert store.plan("plan-1") == plan
    assert store.plan("nope") is None
    assert store.plan_states("plan-1") == [
        ("act-1", "checkpoint_restart", "node-1", "pending"),
        ("act-2", "gpu_reset", "node-2", None),  # no row yet
    ]
    assert store.plan_states("nope") == []
    assert [p.id for p in store.plans()] == ["plan-2", "plan-1"]
    assert [p.id for p in store.plans(unfinished=True)] == ["plan-1"]
    plan.state = "finished"
    store.save_plan(plan)
    assert store.plans(unfinished=True) == []
    assert plan.created == 1000.0 and plan.updated == 1005.0


def test_drains(ledger: tuple[LedgerStore, Clock]) -> None:
    store, _ = ledger
    store.save_drain(Drain("node-2", "ftd", "ftd: xid 79", 5.0, "drain", "act-1"))
    store.save_drain(Drain("node-1", "external", "maint", 6.0))
    store.save_drain(Drain("node-2", "ftd", "ftd: xid 79 again", 7.0, "drained", "act-1"))
    assert store.drains() == [
        Drain("node-1", "external", "maint", 6.0, "", None),
        Drain("node-2", "ftd", "ftd: xid 79 again", 7.0, "drained", "act-1"),
    ]
    assert [d.node for d in store.drains("ftd")] == ["node-2"]
    assert store.drop_drain("node-2") is True
    assert store.drop_drain("node-2") is False
    assert [d.node for d in store.drains()] == ["node-1"]


def test_transaction_groups_and_nests(ledger: tuple[LedgerStore, Clock]) -> None:
    store, _ = ledger
    with store.transaction():
        assert store.record_event(event(1)) is True
        with store.transaction():  # joins the outer one
            store.save_action(record(1))
        assert store.record_event(event(1)) is False  # sees its own write
    assert [e.id for e in store.events()] == ["ev-1"]
    with pytest.raises(RuntimeError), store.transaction():
        store.record_event(event(2))
        raise RuntimeError("caller failed")
    assert [e.id for e in store.events()] == ["ev-2", "ev-1"]  # committed on leaving, as documented
    assert store.action("act-1") is not None
