"""Leader lease and fencing on a real PostgreSQL (``ftd.coordinator.ha.lease``).

First the failure it fixes: two coordinators on one shared ledger both resume the same unfinished
action (each thinks it is the one coordinator). Then: only the lease holder acts; a stale epoch's
ledger writes and side effects are refused; the next term's leader resumes the action once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ftd.bench.postgres import LocalPostgres
from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.coordinator.decide.engine import Engine
from ftd.coordinator.decide.plugins import make_plugin_manager
from ftd.coordinator.decide.policy import PolicyGate
from ftd.coordinator.ha.lease import FencedScheduler, Lease, LeaseLost, guard_executors
from ftd.coordinator.ledger.postgres import PgLedger
from ftd.coordinator.ledger.store import LedgerFenced
from ftd.coordinator.model.state import ClusterState
from ftd.events import Kind, make_event
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState
from tests.realparts import fresh_database


@pytest.fixture
def dsn(postgres: LocalPostgres) -> str:
    return fresh_database(postgres, "lease")


class Clock:
    """A monotonic clock the test moves (the lease's local deadline)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    def __init__(self, hold: asyncio.Event | None = None) -> None:
        self.calls: list[str] = []
        self.hold = hold  # set: each call waits for it (an action still running)

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        self.calls.append(record.id)
        if self.hold is not None:
            await self.hold.wait()
        return {"done": True}


def engine(ledger: PgLedger, executor: Recorder) -> Engine:
    pm = make_plugin_manager(extra=(), entry_points=False, disabled=["xid_catalog"])
    return Engine(
        state=ClusterState(),
        ledger=ledger,
        gate=PolicyGate(cooldown_s=600),
        plugins=pm,
        executors={ActionKind.DRAIN_NODE: executor},
    )


async def unfinished_action(dsn: str) -> ActionRecord:
    """What a coordinator killed mid-action leaves in the ledger."""
    ledger = PgLedger(dsn)
    req = ActionRequest(kind=ActionKind.DRAIN_NODE, target="node-3", reason="xid 79", rule="xid")
    record = ActionRecord(id="act-killed", request=req, state=ActionState.RUNNING)
    await ledger.save_action(record)
    await ledger.close()
    return record


async def test_without_a_lease_two_coordinators_both_resume_the_same_action(dsn: str) -> None:
    await unfinished_action(dsn)
    running = asyncio.Event()  # the first one's drain is still under way when the second starts
    first, second = Recorder(running), Recorder(running)
    engines = [engine(PgLedger(dsn), first), engine(PgLedger(dsn), second)]
    for e in engines:
        await e.resume_unfinished()
    await asyncio.sleep(0.2)
    running.set()
    for e in engines:
        assert await e.wait_idle(10)
    assert first.calls == ["act-killed"] and second.calls == ["act-killed"]  # done twice


async def test_one_holder_at_a_time_and_every_takeover_a_new_epoch(dsn: str) -> None:
    clock = Clock()
    a = Lease(dsn, "a", ttl_s=0.5, monotonic=clock)
    b = Lease(dsn, "b", ttl_s=0.5, monotonic=clock)
    assert await a.try_acquire() is True and a.epoch == 1
    assert await b.try_acquire() is False and b.epoch is None
    assert await a.renew() is True
    info = await b.info()
    assert (info.holder, info.epoch) == ("a", 1)
    assert info.expires_in_s is not None and 0 < info.expires_in_s <= 0.5
    await a.release()  # a clean stop: b need not wait for the TTL
    assert a.epoch is None and await a.renew() is False
    assert await b.try_acquire() is True and b.epoch == 2
    assert await a.try_acquire() is False
    # b's term lapses in the database: a takes over with epoch 3, b's renewal finds it over
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE ftd_lease SET expires_at = clock_timestamp() - interval '1 second'")
    assert await a.try_acquire() is True and a.epoch == 3
    assert await b.renew() is False and b.epoch is None
    for lease in (a, b):
        await lease.close()


async def test_local_deadline_fences_a_frozen_holder_without_asking_the_database(dsn: str) -> None:
    clock = Clock()
    lease = Lease(dsn, "a", ttl_s=5.0, monotonic=clock)
    assert await lease.try_acquire()
    assert lease.check() == 1
    clock.now += 4.9
    assert lease.check() == 1
    clock.now += 0.2  # woke from SIGSTOP past its lease
    with pytest.raises(LeaseLost):
        lease.check()
    assert lease.held is False
    assert await lease.renew() is False  # and it does not extend a lapsed term
    await lease.close()


async def test_stale_epoch_writes_and_side_effects_are_refused_and_the_next_leader_resumes_once(
    dsn: str,
) -> None:
    record = await unfinished_action(dsn)
    clock = Clock()
    old, new = Lease(dsn, "old", ttl_s=5.0, monotonic=clock), Lease(dsn, "new", ttl_s=5.0, monotonic=clock)
    assert await old.try_acquire()
    old_ledger = PgLedger(dsn)
    old_ledger.epoch = old.epoch
    await old_ledger.save_action(record)  # the holder writes
    scheduler = FakeScheduler()
    scheduler.add_node("node-3")
    old_scheduler = FencedScheduler(scheduler, old.check)
    await old_scheduler.drain("node-3", "ftd: xid 79")
    assert [name for name, _ in scheduler.calls] == ["drain"]

    # the old leader freezes; its term lapses in the database and the new one takes over
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE ftd_lease SET expires_at = clock_timestamp() - interval '1 second'")
    assert await new.try_acquire() and new.epoch == 2
    new_ledger = PgLedger(dsn)
    new_ledger.epoch = new.epoch
    executor = Recorder()
    leader = engine(new_ledger, executor)
    leader.executors = guard_executors(leader.executors, new.check)
    assert [r.id for r in await leader.resume_unfinished()] == ["act-killed"]
    assert await leader.wait_idle(10)
    assert executor.calls == ["act-killed"]
    done = await new_ledger.action("act-killed")
    assert done is not None and done.state == ActionState.SUCCEEDED

    # the old one wakes (its local deadline passed): nothing it tries lands
    clock.now += 6
    record.state = ActionState.FAILED
    with pytest.raises(LedgerFenced) as fenced:
        await old_ledger.save_action(record)
    assert (fenced.value.epoch, fenced.value.current, fenced.value.holder) == (1, 2, "new")
    assert old_ledger.stale_writes_rejected == 1
    with pytest.raises(LedgerFenced):
        await old_ledger.record_event(make_event("node-3", Kind.XID))
    assert old_ledger.stale_writes_rejected == 2
    with pytest.raises(LeaseLost):
        await old_scheduler.requeue("job-1")
    assert [name for name, _ in scheduler.calls] == ["drain"]  # the requeue never reached it
    old_executor = Recorder()
    guarded = guard_executors({ActionKind.DRAIN_NODE: old_executor}, old.check)
    with pytest.raises(LeaseLost):
        await guarded[ActionKind.DRAIN_NODE](record)
    assert old_executor.calls == []
    after = await new_ledger.action("act-killed")
    assert after is not None and after.state == ActionState.SUCCEEDED  # the stale write changed nothing
    assert await new_ledger.events(limit=10) == []
    for closable in (old_ledger, new_ledger, old, new):
        await closable.close()


async def test_a_write_even_with_the_right_epoch_is_refused_once_the_term_expired(dsn: str) -> None:
    lease = Lease(dsn, "a", ttl_s=5.0)
    assert await lease.try_acquire()
    ledger = PgLedger(dsn)
    ledger.epoch = lease.epoch
    assert await ledger.record_event(make_event("node-1", Kind.XID)) is True
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE ftd_lease SET expires_at = clock_timestamp() - interval '1 second'")
    with pytest.raises(LedgerFenced):
        await ledger.record_event(make_event("node-1", Kind.XID))
    assert len(await ledger.events()) == 1
    await ledger.close()
    await lease.close()


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Lease("host=127.0.0.1 port=1", "a", ttl_s=0)
    with pytest.raises(ValueError):
        Lease("host=127.0.0.1 port=1", "a", ttl_s=5, renew_s=5)
