"""ftd's drains persisted and reconciled with the scheduler (:mod:`ftd.coordinator.upkeep.reconcile`).

In-process: the coordinator's own engine, policy gate, ledger (a file, so a "restart" reopens it)
and drain/resume executors on the :class:`FakeScheduler` (which passes the same listing contract as
Slurm and Kubernetes: ``tests/contract/test_scheduler_listing.py``). The real-Slurm end-to-end
versions of the operator's resume and the restart are in ``tests/e2e/test_reconcile_slurm.py``.
Budget in every test: 1 drained node (``max_drained_fraction = 0.25`` of 4 nodes).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ftd.coordinator.actions.drain import DrainNode, ResumeNode
from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.coordinator.api.views import jobs_out
from ftd.coordinator.decide.engine import Engine
from ftd.coordinator.decide.plugins import make_plugin_manager
from ftd.coordinator.decide.policy import PolicyGate
from ftd.coordinator.ledger.sqlite import NOTICE_NODE, Ledger, SqliteStore
from ftd.coordinator.model.state import ClusterState
from ftd.coordinator.upkeep.reconcile import Reconciler
from ftd.events import JobAllocation, JobPresence, Kind, NodeStatus, RankInfo
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState

NODES = ("node-1", "node-2", "node-3", "node-4")


@dataclass
class Coordinator:
    """The parts of a coordinator that drains touch, on one ledger file."""

    sched: FakeScheduler
    ledger: Ledger
    state: ClusterState
    engine: Engine
    reconciler: Reconciler
    now: list[float]
    notified: list[ActionRecord] = field(default_factory=list)

    async def drain(self, node: str, reason: str = "xid 79") -> ActionRecord:
        record = await self.engine.submit(
            ActionRequest(kind=ActionKind.DRAIN_NODE, target=node, reason=reason)
        )
        assert await self.engine.wait_idle(5)
        return record

    def problems(self) -> list[tuple[str, str]]:
        """(node, problem) of the scheduler's events in the ledger, oldest first."""
        events = [e for e in reversed(self.ledger.events(limit=1000)) if e.source == "scheduler"]
        assert all(e.kind == Kind.AGENT_HEALTH for e in events)
        return [(e.node, str(e.data["problem"])) for e in events]


async def start(sched: FakeScheduler, path: Path, now: list[float] | None = None) -> Coordinator:
    clock_now = now if now is not None else [1000.0]
    ledger = Ledger(path)
    store = SqliteStore(ledger)
    state = ClusterState()
    for node in NODES:  # the agents' retained status: four nodes known
        state.apply_status(NodeStatus(node=node, state="online", ts=1.0))
    gate = PolicyGate(max_drained_fraction=0.25, min_drain_budget=1, cooldown_s=0.0)
    notified: list[ActionRecord] = []

    async def notify(record: ActionRecord) -> dict[str, Any]:
        notified.append(record)
        return {}

    engine = Engine(
        state=state,
        ledger=store,
        gate=gate,
        plugins=make_plugin_manager(builtins=False, entry_points=False),
        executors={
            ActionKind.DRAIN_NODE: DrainNode(sched, state),
            ActionKind.RESUME_NODE: ResumeNode(sched, state),
            ActionKind.NOTIFY: notify,
        },
    )
    reconciler = Reconciler(
        state=state,
        ledger=store,
        scheduler=sched,
        engine=engine,
        pending_alert_s=600.0,
        clock=lambda: clock_now[0],
    )
    await engine.load()  # what a restarted coordinator remembers: the gate, then ftd's drains
    await reconciler.restore()
    engine.observe(reconciler.observe)
    return Coordinator(sched, ledger, state, engine, reconciler, clock_now, notified)


@pytest.fixture
def sched() -> FakeScheduler:
    fake = FakeScheduler()
    for node in NODES:
        fake.add_node(node)
    return fake


@pytest.fixture
async def coord(sched: FakeScheduler, tmp_path: Path) -> AsyncIterator[Coordinator]:
    c = await start(sched, tmp_path / "ledger.sqlite")
    yield c
    await c.engine.close()
    c.ledger.close()


def suppressed_by_budget(record: ActionRecord) -> bool:
    return record.state == ActionState.SUPPRESSED and "blast radius" in record.detail.get("policy", "")


async def test_drain_is_recorded_in_the_ledger(coord: Coordinator) -> None:
    record = await coord.drain("node-2")
    assert record.state == ActionState.SUCCEEDED
    [drain] = coord.ledger.drains()
    assert (drain.node, drain.origin, drain.reason) == ("node-2", "ftd", "ftd: xid 79")
    assert drain.action_id == record.id
    assert coord.state.drained_nodes() == {"node-2": "ftd: xid 79"}
    assert await coord.reconciler.reconcile() == {}  # the scheduler agrees: nothing to change
    assert coord.problems() == []


async def test_operator_resume_releases_the_budget(coord: Coordinator, sched: FakeScheduler) -> None:
    """The report: after an operator's resume ftd still counted the node, and the next Xid 79's
    drain was held back by the budget. Without a round of reconciliation it still is (first half);
    after one, the node is released and the next drain goes through."""
    await coord.drain("node-2")
    await sched.resume("node-2")  # the operator: scontrol update nodename=node-2 state=resume
    assert suppressed_by_budget(await coord.drain("node-3"))

    assert await coord.reconciler.reconcile() == {"ftd_drain_released": ["node-2"]}
    assert coord.state.drained_nodes() == {} and coord.ledger.drains() == []
    assert coord.problems() == [("node-2", "ftd_drain_released")]
    record = await coord.drain("node-3")
    assert record.state == ActionState.SUCCEEDED
    assert (await sched.node_info("node-3")).drained
    assert [d.node for d in coord.ledger.drains()] == ["node-3"]


async def test_restart_remembers_drains(sched: FakeScheduler, tmp_path: Path) -> None:
    first = await start(sched, tmp_path / "ledger.sqlite")
    await first.drain("node-2")
    await first.engine.close()
    first.ledger.close()

    second = await start(sched, tmp_path / "ledger.sqlite")  # before any reconciliation round
    try:
        assert second.state.drained_nodes() == {"node-2": "ftd: xid 79"}
        record = await second.drain("node-3")
        assert suppressed_by_budget(record), record
        assert not (await sched.node_info("node-3")).drained
    finally:
        await second.engine.close()
        second.ledger.close()


async def test_ftd_drain_missing_from_the_ledger_is_adopted(coord: Coordinator, sched: FakeScheduler) -> None:
    await sched.drain("node-4", "xid 79 (drained before a crash)")  # ftd's reason, not in the ledger
    assert await coord.reconciler.reconcile() == {"ftd_drain_adopted": ["node-4"]}
    assert coord.state.drained_nodes() == {"node-4": "ftd: xid 79 (drained before a crash)"}
    assert [(d.node, d.origin) for d in coord.ledger.drains()] == [("node-4", "ftd")]
    assert suppressed_by_budget(await coord.drain("node-1"))
    assert await coord.reconciler.reconcile() == {}  # adopted once


async def test_external_drain_is_an_event_not_ftds_budget(coord: Coordinator, sched: FakeScheduler) -> None:
    sched.operator_drain("node-3", "maintenance")
    assert await coord.reconciler.reconcile() == {"external_drain": ["node-3"]}
    assert await coord.reconciler.reconcile() == {}  # seen once, not every round
    assert coord.state.unavailable == {"node-3": "IDLE+DRAIN: maintenance"}
    assert coord.state.drained_nodes() == {}
    record = await coord.drain("node-2")  # budget 1: the operator's drain does not use it
    assert record.state == ActionState.SUCCEEDED

    await sched.resume("node-3")
    coord.now[0] += 60
    assert await coord.reconciler.reconcile() == {"external_returned": ["node-3"]}
    assert coord.state.unavailable == {}
    assert coord.problems() == [("node-3", "external_drain"), ("node-3", "external_returned")]
    [event] = [e for e in coord.ledger.events(node="node-3") if e.data["problem"] == "external_drain"]
    assert event.severity == "warning" and event.data["reason"] == "maintenance"


async def test_node_down_is_an_event(coord: Coordinator, sched: FakeScheduler) -> None:
    sched.set_state("node-4", "DOWN")
    assert await coord.reconciler.reconcile() == {"node_down": ["node-4"]}
    assert coord.state.unavailable == {"node-4": "DOWN"}
    assert [(d.node, d.origin, d.state) for d in coord.ledger.drains()] == [("node-4", "external", "DOWN")]


async def test_reason_replaced_by_operator_is_not_ftds(coord: Coordinator, sched: FakeScheduler) -> None:
    await coord.drain("node-2")
    sched.operator_drain("node-2", "RMA ticket 4711")
    assert await coord.reconciler.reconcile() == {"external_drain": ["node-2"]}
    assert sorted(coord.problems()) == [("node-2", "external_drain"), ("node-2", "ftd_drain_released")]
    assert coord.state.drained_nodes() == {}
    assert [(d.node, d.origin) for d in coord.ledger.drains()] == [("node-2", "external")]


async def test_resume_by_ftd_forgets_the_drain(coord: Coordinator) -> None:
    await coord.drain("node-2")
    await coord.engine.submit(ActionRequest(kind=ActionKind.RESUME_NODE, target="node-2", reason="fixed"))
    assert await coord.engine.wait_idle(5)
    assert coord.ledger.drains() == [] and coord.state.drained_nodes() == {}
    assert await coord.reconciler.reconcile() == {}


async def test_drain_in_flight_is_left_for_the_next_round(coord: Coordinator, sched: FakeScheduler) -> None:
    """A listing taken while ftd's own drain is under way must not adopt or release it."""
    request = ActionRequest(kind=ActionKind.DRAIN_NODE, target="node-2", reason="x")
    record = ActionRecord(id="act-x", request=request, state=ActionState.RUNNING)
    await coord.reconciler.observe("action", record)  # pending: in flight
    await sched.drain("node-2", "x")
    assert await coord.reconciler.reconcile() == {}
    assert coord.ledger.drains() == []
    record.state = ActionState.SUCCEEDED
    record.detail["reason"] = "ftd: x"
    await coord.reconciler.observe("action", record)  # finished: recorded by the observer, not adopted
    assert await coord.reconciler.reconcile() == {}
    assert [(d.node, d.action_id) for d in coord.ledger.drains()] == [("node-2", "act-x")]


async def test_job_stuck_pending_raises_one_alert(coord: Coordinator, sched: FakeScheduler) -> None:
    sched.add_job("77", ["node-1"])
    await sched.requeue("77", exclude=["node-1"])  # what checkpoint_restart did
    requeue = ActionRecord(
        id="act-cr",
        request=ActionRequest(kind=ActionKind.CHECKPOINT_RESTART, target="77", reason="xid 79"),
        state=ActionState.SUCCEEDED,
        detail={"requeued": {"scheduler": "fake", "exclude": ["node-1"]}},
        updated=1000.0,
    )
    await coord.reconciler.observe("action", requeue)
    coord.now[0] = 1000.0 + 599.0
    assert await coord.reconciler.reconcile() == {}
    coord.now[0] = 1000.0 + 601.0
    assert await coord.reconciler.reconcile() == {"job_pending": ["77"]}
    assert await coord.engine.wait_idle(5)
    assert await coord.reconciler.reconcile() == {}  # one alert per requeue
    [note] = [e for e in coord.ledger.events(node=NOTICE_NODE) if e.data.get("problem") == "job_pending"]
    assert (note.data["job"], note.data["pending_s"], note.data["excluded"]) == ("77", 601.0, ["node-1"])
    assert [(r.request.kind, r.request.target) for r in coord.notified] == [("notify", "77")]

    sched.start_job("77", ["node-2"])
    await coord.reconciler.reconcile()
    assert coord.reconciler.requeued == {}  # running again: no longer watched


async def test_requeued_jobs_are_found_again_after_a_restart(sched: FakeScheduler, tmp_path: Path) -> None:
    first = await start(sched, tmp_path / "ledger.sqlite")
    record = ActionRecord(
        id="act-cr",
        request=ActionRequest(kind=ActionKind.CHECKPOINT_RESTART, target="77", reason="xid 79"),
        state=ActionState.SUCCEEDED,
        detail={"requeued": {"scheduler": "fake", "exclude": []}},
    )
    first.ledger.save_action(record)
    await first.engine.close()
    first.ledger.close()
    second = await start(sched, tmp_path / "ledger.sqlite")
    try:
        assert set(second.reconciler.requeued) == {"77"}
    finally:
        await second.engine.close()
        second.ledger.close()


async def test_a_moved_job_stays_in_the_jobs_view_until_it_trains_again(
    coord: Coordinator, sched: FakeScheduler
) -> None:
    """Issue #32: the restart's action is over, the job has no rank nor allocation anywhere, yet it is
    shown as pending after requeue (excluding its bad node, since when, which action) until it runs."""
    sched.add_job("77", ["node-1"])
    await sched.requeue("77", exclude=["node-1"])
    requeue = ActionRecord(
        id="act-cr",
        request=ActionRequest(kind=ActionKind.CHECKPOINT_RESTART, target="77", reason="xid 79"),
        state=ActionState.SUCCEEDED,
        detail={"requeued": {"scheduler": "fake", "exclude": ["node-1"]}, "requeued_at": 990.0},
        updated=1000.0,
    )
    await coord.reconciler.observe("action", requeue)
    [job] = jobs_out(coord.state, [])
    assert (job.id, job.state, job.nodes, job.action) == ("77", "pending after requeue", [], None)
    assert job.moved is not None
    assert (job.moved.since, job.moved.excluding, job.moved.action) == (990.0, ["node-1"], "act-cr")
    assert job.moved.why.startswith("pending after requeue, excluding node-1 (action act-cr, since ")
    await coord.reconciler.reconcile()
    [job] = jobs_out(coord.state, [])
    assert job.moved is not None and job.moved.scheduler_state == "PENDING"
    assert "the scheduler says PENDING" in job.moved.why

    # an allocation its Prolog reported before the requeue does not make it run again
    old = JobAllocation(user="alice", started=900.0)
    coord.state.apply_presence("node-1", "77", JobPresence(job="77", node="node-1", allocation=old))
    [job] = jobs_out(coord.state, [])
    assert job.state == "pending after requeue" and job.moved is not None

    sched.start_job("77", ["node-2"])
    await coord.reconciler.reconcile()
    assert jobs_out(coord.state, [])[0].moved is None  # runs again: no longer pending after requeue


async def test_a_moved_job_leaves_the_view_when_a_rank_registers_or_it_ends(
    coord: Coordinator, sched: FakeScheduler
) -> None:
    for job in ("77", "78"):
        sched.add_job(job, ["node-1"])
        await sched.requeue(job, exclude=["node-1"])
        record = ActionRecord(
            id=f"act-{job}",
            request=ActionRequest(kind=ActionKind.CHECKPOINT_RESTART, target=job, reason="xid 79"),
            state=ActionState.SUCCEEDED,
            detail={"requeued": {"scheduler": "fake", "exclude": ["node-1"]}, "requeued_at": 990.0},
            updated=1000.0,
        )
        await coord.reconciler.observe("action", record)
    assert [j.state for j in jobs_out(coord.state, [])] == ["pending after requeue"] * 2
    ranks = [RankInfo(rank=0, step=1)]
    coord.state.apply_presence("node-2", "77", JobPresence(job="77", node="node-2", ranks=ranks))
    sched.finish_job("78", "CANCELLED")
    await coord.reconciler.reconcile()
    assert [(j.id, j.state, j.moved) for j in jobs_out(coord.state, [])] == [("77", "training", None)]


async def test_a_restart_that_saw_its_job_train_again_does_not_show_it_pending(coord: Coordinator) -> None:
    """An in-place restart followed until the job trained again finishes after the ranks registered:
    its last record must not put the job back as pending after requeue."""
    detail: dict[str, Any] = {"requeued": {"scheduler": "fake", "exclude": []}, "requeued_at": 990.0}
    request = ActionRequest(kind=ActionKind.CHECKPOINT_RESTART, target="77", reason="hang")
    running = ActionRecord(id="act-cr", request=request, state=ActionState.RUNNING, detail=dict(detail))
    await coord.reconciler.observe("action", running)
    assert coord.state.moved.get("77") is not None
    ranks = [RankInfo(rank=0, step=1, run="slurm-restart-1")]
    coord.state.apply_presence("node-1", "77", JobPresence(job="77", node="node-1", ranks=ranks))
    assert coord.state.moved.get("77") is None
    done = ActionRecord(
        id="act-cr", request=request, state=ActionState.SUCCEEDED, detail={**detail, "resumed_at": 995.0}
    )
    await coord.reconciler.observe("action", done)
    assert coord.state.moved.get("77") is None


async def test_an_interruptions_skipped_save_is_notified_once_with_the_resume_step(
    coord: Coordinator,
) -> None:
    """Issue #37: a restart whose deadline decision was 'no save' tells the operator why and from which
    checkpoint the job resumes; a restart that saved, or a skipped save that no interruption asked
    for, is not notified by this path."""

    def restart(job: str, detail: dict[str, Any], interruption: bool = True) -> ActionRecord:
        params = {"interruption": True, "deadline": 2000.0} if interruption else {}
        request = ActionRequest(kind=ActionKind.CHECKPOINT_RESTART, target=job, reason="r", params=params)
        return ActionRecord(id=f"act-{job}", request=request, state=ActionState.SUCCEEDED, detail=detail)

    skipped = restart("77", {"save_skipped": "3.0 s left, p95 25.0 s", "resume_from_step": 400})
    for record in (
        skipped,
        skipped,  # observed again (another update): still one notification
        restart("78", {"saved": {"0": {}}}),
        restart("79", {"save_skipped": "the rule asked to stop without a save"}, interruption=False),
        restart("80", {"save_skipped": "1.0 s left", "resume_from_step": None}),
    ):
        await coord.reconciler.observe("action", record)
    assert await coord.engine.wait_idle(5)
    for _ in range(50):
        if len(coord.notified) >= 2:
            break
        await asyncio.sleep(0.01)
    assert [(r.request.target, r.request.rule) for r in coord.notified] == [
        ("77", "deadline"),
        ("80", "deadline"),
    ]
    first, second = (r.request.reason for r in coord.notified)
    assert "3.0 s left, p95 25.0 s" in first and "step 400" in first
    assert "no verified checkpoint" in second
