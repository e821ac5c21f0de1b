"""One ledger contract, two backends: SQLite (the embedded default) and PostgreSQL (the HA ledger).

Every test runs against both: a fresh SQLite file, and a fresh database on a real PostgreSQL this
module starts itself (``tests/realparts.start_postgres``; skipped without the package, failed under
``FTD_REQUIRE_REAL=1``).
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ftd.bench.postgres import LocalPostgres
from ftd.coordinator.ledger.sqlite import Ledger, SqliteStore
from ftd.coordinator.ledger.store import Drain, LedgerStore
from ftd.coordinator.model.plan import Dependency, Plan, Step
from ftd.events import Event, JobAllocation, JobPresence, Kind, RankInfo, Severity
from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState
from tests.realparts import fresh_database


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", "postgresql"])
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[LedgerStore, Clock]]:
    clock = Clock()
    store: LedgerStore
    if request.param == "sqlite":
        store = SqliteStore(Ledger(tmp_path / "ledger.sqlite", clock=clock))
    else:
        from ftd.coordinator.ledger.postgres import PgLedger

        server: LocalPostgres = request.getfixturevalue("postgres")
        store = PgLedger(fresh_database(server, "contract"), clock=clock)
    yield store, clock
    await store.close()


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


async def test_events_dedupe_order_filter_export(ledger: tuple[LedgerStore, Clock]) -> None:
    store, _ = ledger
    assert await store.record_event(event(1)) is True
    assert await store.record_event(event(1)) is False  # the same id again: a duplicate
    assert await store.record_event(event(2, node="node-2")) is True
    assert await store.record_event(event(3)) is True
    assert [e.id for e in await store.events()] == ["ev-3", "ev-2", "ev-1"]  # newest first
    assert [e.id for e in await store.events(limit=2)] == ["ev-3", "ev-2"]
    assert [e.id for e in await store.events(node="node-1")] == ["ev-3", "ev-1"]
    assert (await store.events())[0] == event(3)  # the body round-trips
    out = io.StringIO()
    assert await store.export_events(out) == 3
    assert [line[:40].count("ev-") for line in out.getvalue().splitlines()] == [1, 1, 1]


async def test_summary_replaces_its_row(ledger: tuple[LedgerStore, Clock]) -> None:
    store, _ = ledger
    await store.record_summary(event(7, count=1))
    await store.record_summary(event(7, count=5))
    assert [(e.id, e.data["count"]) for e in await store.events()] == [("ev-7", 5)]
    assert await store.record_event(event(7)) is False


async def test_actions_saved_updated_and_listed(ledger: tuple[LedgerStore, Clock]) -> None:
    store, clock = ledger
    a, b, c = record(1), record(2), record(3, ActionState.SUCCEEDED)
    for r in (a, b, c):
        await store.save_action(r)
        clock.now += 1
    assert (a.created, a.updated) == (1000.0, 1000.0)
    b.state = ActionState.RUNNING
    b.detail["phases_done"] = ["save"]
    await store.save_action(b)
    assert b.created == 1001.0 and b.updated == 1003.0
    got = await store.action("act-2")
    assert got is not None and got == b
    assert await store.action("nope") is None
    assert [r.id for r in await store.actions()] == ["act-3", "act-2", "act-1"]
    assert [r.id for r in await store.actions(limit=1)] == ["act-3"]
    assert [(r.id, r.state) for r in await store.unfinished()] == [
        ("act-1", ActionState.PENDING),
        ("act-2", ActionState.RUNNING),
    ]
    assert [r.id for r in await store.recent(1002.0)] == ["act-2", "act-3"]
    await store.save_action(record(4, ActionState.FAILED, kind="notify"))
    assert await store.action_counts() == {
        ("drain_node", "pending"): 1,
        ("drain_node", "running"): 1,
        ("drain_node", "succeeded"): 1,
        ("notify", "failed"): 1,
    }


async def test_plans_and_their_steps(ledger: tuple[LedgerStore, Clock]) -> None:
    store, clock = ledger
    await store.save_action(record(1, kind="checkpoint_restart"))
    after = Dependency("act-1", 1)
    steps = [
        Step(action="act-1", kind="checkpoint_restart", target="node-1", role="job"),
        Step(action="act-2", kind="gpu_reset", target="node-2", role="node", after={0: [after]}),
    ]
    plan = Plan(id="plan-1", event_id="ev-1", steps=steps)
    await store.save_plan(plan)
    clock.now += 5
    await store.save_plan(Plan(id="plan-2", event_id=None, steps=[], state="finished"))
    assert await store.plan("plan-1") == plan
    assert await store.plan("nope") is None
    assert await store.plan_states("plan-1") == [
        ("act-1", "checkpoint_restart", "node-1", "pending"),
        ("act-2", "gpu_reset", "node-2", None),  # no row yet
    ]
    assert await store.plan_states("nope") == []
    assert [p.id for p in await store.plans()] == ["plan-2", "plan-1"]
    assert [p.id for p in await store.plans(unfinished=True)] == ["plan-1"]
    plan.state = "finished"
    await store.save_plan(plan)
    assert await store.plans(unfinished=True) == []
    assert plan.created == 1000.0 and plan.updated == 1005.0


async def test_drains(ledger: tuple[LedgerStore, Clock]) -> None:
    store, _ = ledger
    await store.save_drain(Drain("node-2", "ftd", "ftd: xid 79", 5.0, "drain", "act-1"))
    await store.save_drain(Drain("node-1", "external", "maint", 6.0))
    await store.save_drain(Drain("node-2", "ftd", "ftd: xid 79 again", 7.0, "drained", "act-1"))
    assert await store.drains() == [
        Drain("node-1", "external", "maint", 6.0, "", None),
        Drain("node-2", "ftd", "ftd: xid 79 again", 7.0, "drained", "act-1"),
    ]
    assert [d.node for d in await store.drains("ftd")] == ["node-2"]
    assert await store.drop_drain("node-2") is True
    assert await store.drop_drain("node-2") is False
    assert [d.node for d in await store.drains()] == ["node-1"]


async def test_presence(ledger: tuple[LedgerStore, Clock]) -> None:
    store, _ = ledger
    two = JobPresence(job="7", node="node-2", ranks=[RankInfo(rank=1, local_rank=0, pid=42)], ts=5.0)
    one = JobPresence(job="7", node="node-1", ranks=[RankInfo(rank=0, local_rank=0, pid=41)], ts=5.0)
    prolog = JobPresence(job="8", node="node-1", allocation=JobAllocation(user="ann", uid=1000), ts=6.0)
    for presence in (two, one, prolog):
        await store.save_presence(presence)
    assert await store.presences() == [one, prolog, two]  # by node, then job
    moved = JobPresence(job="7", node="node-2", ranks=[RankInfo(rank=1), RankInfo(rank=2)], ts=9.0)
    await store.save_presence(moved)  # replaces node-2's row for job 7
    assert await store.presences() == [one, prolog, moved]
    assert await store.drop_presence("node-2", "7") is True
    assert await store.drop_presence("node-2", "7") is False
    assert await store.presences() == [one, prolog]


async def test_transaction_groups_and_nests(ledger: tuple[LedgerStore, Clock]) -> None:
    store, _ = ledger
    async with store.transaction():
        assert await store.record_event(event(1)) is True
        async with store.transaction():  # joins the outer one
            await store.save_action(record(1))
        assert await store.record_event(event(1)) is False  # sees its own write
    assert [e.id for e in await store.events()] == ["ev-1"]
    with pytest.raises(RuntimeError):
        async with store.transaction():
            await store.record_event(event(2))
            raise RuntimeError("caller failed")
    assert [e.id for e in await store.events()] == ["ev-2", "ev-1"]  # committed on leaving, as documented
    assert await store.action("act-1") is not None
