"""Pinned jobs (issue #31, item 3): the pure decision, and the hold, its notification and its
release across a coordinator restart (in-process, on the :class:`FakeScheduler`, which passes the
hold contract Slurm passes: ``tests/contract/test_scheduler_contract.py``). The real-Slurm loop and
its release are ``tests/e2e/test_pinned_hold_slurm.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftd.config import ConfigError, parse_config
from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.checkpoint_restart import CheckpointRestart
from ftd.coordinator.actions.pinned import PINNED_JOB_POLICIES, decide_pinned
from ftd.coordinator.actions.scheduler import FakeScheduler, job_holder
from ftd.coordinator.api.views import action_why
from ftd.coordinator.decide.engine import Engine
from ftd.coordinator.decide.plugins import make_plugin_manager
from ftd.coordinator.decide.policy import PolicyGate
from ftd.coordinator.ha.lease import FencedScheduler, LeaseLost
from ftd.coordinator.ledger.sqlite import Ledger, SqliteStore
from ftd.coordinator.model.state import ClusterState
from ftd.coordinator.upkeep.pinned_holds import RULE, still_active
from ftd.coordinator.upkeep.reconcile import Reconciler
from ftd.events import NodeStatus
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState

FULL = "fs /scratch 100.0% full (bytes)"

# -- the pure decision ------------------------------------------------------------------------------


def decide(**overrides: Any) -> Any:
    args: dict[str, Any] = {
        "exclude": ["node-1"],
        "required": ["node-1"],
        "out_of_service": {},
        "conditions": {"node-1": [FULL]},
        "policy": "hold",
        "can_hold": True,
    }
    args.update(overrides)
    return decide_pinned("42", **args)


def test_a_job_not_pinned_to_the_nodes_it_leaves_is_requeued_as_asked() -> None:
    move = decide(required=["node-2"], exclude=["node-1", "node-3"])
    assert (move.action, move.nodes, move.keep, move.why) == ("requeue", (), ("node-1", "node-3"), "")
    assert decide(required=[]).action == "requeue"


def test_a_pinned_node_out_of_service_is_waited_for() -> None:
    move = decide(out_of_service={"node-1": "IDLE+DRAIN (ftd: xid 79)"}, exclude=["node-1", "node-2"])
    assert (move.action, move.nodes, move.keep) == ("wait", ("node-1",), ("node-2",))
    assert "out of service (node-1: IDLE+DRAIN (ftd: xid 79))" in move.why
    assert "waits for node-1 to return to service" in move.why


def test_a_pinned_node_in_service_holds_the_job_until_its_conditions_clear() -> None:
    move = decide()
    assert (move.action, move.nodes, move.keep) == ("hold", ("node-1",), ())
    assert move.why == (
        f"job 42 is pinned to node-1 (sbatch -w / --nodelist) and node-1 stays in service with {FULL}: "
        "a requeue would start it there again at once, so ftd stopped it and requeued it held; ftd "
        "releases it when those conditions clear on node-1 (`scontrol release 42` releases it now; "
        "resubmit without the pin to run it elsewhere)"
    )
    assert "return to service" not in move.why


def test_a_hold_with_no_known_condition_waits_for_a_human() -> None:
    move = decide(conditions={})
    assert move.action == "hold"
    assert "with a condition that moves jobs" in move.why
    assert "stays held until someone releases it" in move.why


def test_stop_by_policy_or_when_the_scheduler_cannot_hold() -> None:
    by_policy = decide(policy="stop")
    assert by_policy.action == "stop" and "stopped it and did not requeue it;" in by_policy.why
    kubernetes = decide(can_hold=False)
    assert kubernetes.action == "stop" and "(this scheduler cannot hold a job)" in kubernetes.why
    unanswered = decide(policy="stop", stopped=False)
    assert "no rank of it answered ftd's stop: it may still be running on node-1" in unanswered.why


def test_one_pinned_node_in_service_is_enough_to_hold() -> None:
    move = decide(
        exclude=["node-1", "node-2"],
        required=["node-1", "node-2"],
        out_of_service={"node-2": "DOWN"},
    )
    assert move.action == "hold" and move.nodes == ("node-1", "node-2")
    assert "node-1 stays in service" in move.why and "node-2 stays" not in move.why


NODES = st.sampled_from(["node-1", "node-2", "node-3", "node-4"])


@given(
    exclude=st.lists(NODES, unique=True),
    required=st.lists(NODES, unique=True),
    out=st.dictionaries(NODES, st.one_of(st.none(), st.just("DRAIN"))),
    conditions=st.dictionaries(NODES, st.lists(st.just(FULL), max_size=1)),
    policy=st.sampled_from(PINNED_JOB_POLICIES),
    can_hold=st.booleans(),
    stopped=st.booleans(),
)
def test_never_requeued_onto_a_pinned_node_in_service(
    exclude: list[str],
    required: list[str],
    out: dict[str, str | None],
    conditions: dict[str, list[str]],
    policy: str,
    can_hold: bool,
    stopped: bool,
) -> None:
    move = decide_pinned(
        "7",
        exclude=exclude,
        required=required,
        out_of_service=out,
        conditions=conditions,
        policy=policy,
        can_hold=can_hold,
        stopped=stopped,
    )
    pinned = set(exclude) & set(required)
    assert set(move.nodes) == pinned and set(move.nodes) | set(move.keep) == set(exclude)
    assert not set(move.nodes) & set(move.keep)
    requeued_onto = set(move.nodes) if move.action in ("requeue", "wait") else set()
    assert not {n for n in requeued_onto if not out.get(n)}  # the loop: never onto one in service
    assert (move.action == "requeue") == (not pinned)
    assert move.action != "hold" or (policy == "hold" and can_hold)
    assert (move.why == "") == (move.action == "requeue")
    assert ("return to service" in move.why) == (move.action == "wait")


def test_still_active_compares_kinds_and_treats_an_unknown_kind_as_any_condition() -> None:
    waits = {"node-1": ["fs_fill"]}
    assert still_active(waits, {"node-1": ["fs_fill", "xid"]}) == {"node-1": ["fs_fill"]}
    assert still_active(waits, {"node-1": ["xid"]}) == {}
    assert still_active(waits, {}) == {}
    assert still_active({"node-1": ["unknown"]}, {"node-1": ["xid"]}) == {"node-1": ["xid"]}
    assert still_active({"node-1": ["unknown"]}, {}) == {}


# -- the hold, its notification and its release, across a restart ------------------------------------


@dataclass
class Coordinator:
    sched: FakeScheduler
    ledger: Ledger
    state: ClusterState
    engine: Engine
    reconciler: Reconciler
    notified: list[ActionRecord]

    async def close(self) -> None:
        await self.engine.close()
        self.ledger.close()

    def restarts(self) -> list[ActionRecord]:
        return [r for r in self.ledger.actions(limit=100) if r.request.kind == ActionKind.CHECKPOINT_RESTART]


async def start(sched: FakeScheduler, path: Path, now: list[float]) -> Coordinator:
    ledger = Ledger(path)
    state = ClusterState()
    state.apply_status(NodeStatus(node="node-1", state="online", ts=1.0))
    notified: list[ActionRecord] = []

    async def notify(record: ActionRecord) -> dict[str, Any]:
        notified.append(record)
        return {}

    restart = CheckpointRestart(
        publish=lambda topic, payload: _nothing(),
        state=state,
        acks=AckBook(),
        scheduler=sched,
        save_deadline_s=1,
        stop_deadline_s=1,
    )
    store = SqliteStore(ledger)
    engine = Engine(
        state=state,
        ledger=store,
        gate=PolicyGate(cooldown_s=0.0),
        plugins=make_plugin_manager(builtins=False, entry_points=False),
        executors={ActionKind.CHECKPOINT_RESTART: restart, ActionKind.NOTIFY: notify},
    )
    reconciler = Reconciler(
        state=state, ledger=store, scheduler=sched, engine=engine, interval_s=30.0, clock=lambda: now[0]
    )
    await engine.load()
    await reconciler.restore()
    engine.observe(reconciler.observe)
    return Coordinator(sched, ledger, state, engine, reconciler, notified)


async def _nothing() -> None:
    return None


@pytest.fixture
def sched() -> FakeScheduler:
    fake = FakeScheduler()
    fake.add_job("42", ["node-1"], required=["node-1"])  # sbatch -w node-1
    return fake


@pytest.fixture
async def coord(sched: FakeScheduler, tmp_path: Path) -> AsyncIterator[Coordinator]:
    c = await start(sched, tmp_path / "ledger.sqlite", [1000.0])
    yield c
    await c.close()


async def told(coord: Coordinator) -> None:
    """The notifications submitted so far have run (submitted as tasks, then run by the engine)."""
    await coord.reconciler.pinned.settle()
    assert await coord.engine.wait_idle(5)


async def hold(coord: Coordinator) -> ActionRecord:
    """The full filesystem's restart of job 42, excluding node-1 (rule fs_fill's request)."""
    coord.state.apply_conditions("node-1", [FULL], ["fs_fill"])
    record = await coord.engine.submit(
        ActionRequest(
            kind=ActionKind.CHECKPOINT_RESTART,
            target="42",
            reason="filesystem /scratch at 100%: save and stop, requeue elsewhere",
            params={"node": "node-1", "exclude": ["node-1"]},
            rule="fs_fill",
        )
    )
    assert await coord.engine.wait_idle(5)
    await told(coord)
    [done] = [r for r in coord.restarts() if r.id == record.id]
    return done


async def test_the_job_is_held_once_and_the_operator_told_what_happens(
    coord: Coordinator, sched: FakeScheduler
) -> None:
    record = await hold(coord)
    assert record.state == ActionState.SUCCEEDED, record.detail
    pinned = record.detail["pinned"]
    assert pinned["action"] == "hold" and pinned["waits_for"] == {"node-1": ["fs_fill"]}
    assert record.detail["requeued"] is None
    job = await sched.job_info("42")
    assert job.state == "PENDING" and job.held and job.restarts == 1 and job.excluded == ()
    assert [c[0] for c in sched.calls if c[0].startswith("requeue")] == ["requeue_held"]  # never a requeue
    [told] = coord.notified
    assert told.request.rule == RULE and told.request.reason == pinned["why"]
    # Rounds while the filesystem is still full: the job stays held, nothing more is said.
    assert "pinned_released" not in await coord.reconciler.reconcile()
    assert (await sched.job_info("42")).held and len(coord.notified) == 1


async def test_released_when_the_condition_clears_but_not_while_the_agent_is_offline(
    coord: Coordinator, sched: FakeScheduler
) -> None:
    await hold(coord)
    coord.state.apply_conditions("node-1", [])
    coord.state.apply_status(NodeStatus(node="node-1", state="offline", ts=2.0))
    assert "pinned_released" not in await coord.reconciler.reconcile()  # its conditions are not news
    assert (await sched.job_info("42")).held
    coord.state.apply_status(NodeStatus(node="node-1", state="online", ts=3.0))
    coord.state.apply_conditions("node-1", ["xid 13 on 0000:3b:00.0"], ["xid"])  # another kind
    assert (await coord.reconciler.reconcile())["pinned_released"] == ["42"]
    assert not (await sched.job_info("42")).held
    [record] = coord.restarts()  # saved with its release: the ledger says what happened
    released = record.detail["pinned"]["released"]
    assert released["by"] == "ftd" and released["why"] == "fs_fill cleared on node-1: ftd released job 42"
    await told(coord)
    assert [n.request.reason for n in coord.notified][1:] == [
        "job 42 released: fs_fill cleared on node-1; it runs there again"
    ]
    assert "pinned_released" not in await coord.reconciler.reconcile()  # once


async def test_a_restarted_coordinator_continues_the_hold_from_the_ledger(
    coord: Coordinator, sched: FakeScheduler, tmp_path: Path
) -> None:
    await hold(coord)
    await coord.close()
    now = [1000.0]
    again = await start(sched, tmp_path / "ledger.sqlite", now)
    try:
        assert sorted(again.reconciler.pinned.held) == ["42"]
        # Right after the start no agent's retained conditions have arrived: that is not "cleared".
        assert "pinned_released" not in await again.reconciler.reconcile()
        again.state.apply_conditions("node-1", [FULL], ["fs_fill"])
        now[0] += 31.0
        assert "pinned_released" not in await again.reconciler.reconcile()  # still full
        again.state.apply_conditions("node-1", [])
        assert (await again.reconciler.reconcile())["pinned_released"] == ["42"]
        assert not (await sched.job_info("42")).held
        await told(again)
        assert again.notified[0].request.reason.startswith("job 42 released")  # the hold was told before
    finally:
        await again.close()
    third = await start(sched, tmp_path / "ledger.sqlite", now)
    try:
        assert third.reconciler.pinned.held == {}  # released before this start: not watched again
    finally:
        await third.close()


async def test_a_job_someone_else_released_is_no_longer_watched(
    coord: Coordinator, sched: FakeScheduler
) -> None:
    await hold(coord)
    await sched.release("42")  # the operator: scontrol release 42
    sched.start_job("42", ["node-1"])
    assert "pinned_released" not in await coord.reconciler.reconcile()
    assert coord.reconciler.pinned.held == {}
    [record] = coord.restarts()
    assert record.detail["pinned"]["released"]["by"] == "other"
    assert "no longer held (RUNNING)" in record.detail["pinned"]["released"]["why"]


async def test_a_pinned_node_drained_by_the_rule_is_waited_for_not_held(
    coord: Coordinator, sched: FakeScheduler
) -> None:
    await sched.drain("node-1", "local storage lost")  # e.g. rule storage: move the job, then drain
    record = await hold(coord)
    assert record.detail["pinned"]["action"] == "wait" and record.state == ActionState.ESCALATED
    assert record.detail["requeued"]["exclude"] == []
    job = await sched.job_info("42")
    assert job.state == "PENDING" and not job.held and job.restarts == 1
    assert coord.notified[0].request.reason == record.detail["pinned"]["why"]


async def test_the_fenced_scheduler_holds_only_while_the_lease_is_held(sched: FakeScheduler) -> None:
    """HA: the hold and the release are side effects like a requeue: checked against the lease."""
    leading = [True]

    def check() -> None:
        if not leading[0]:
            raise LeaseLost("lease lost")

    fenced = FencedScheduler(sched, check)
    holder = job_holder(fenced)
    assert holder is not None
    await holder.requeue_held("42")
    assert (await sched.job_info("42")).held
    leading[0] = False
    with pytest.raises(LeaseLost):
        await holder.release("42")
    assert (await sched.job_info("42")).held and [c[0] for c in sched.calls][-1] == "requeue_held"


def test_a_scheduler_without_holds_is_no_job_holder(sched: FakeScheduler) -> None:
    sched.holds_jobs = False  # like Kubernetes: no per-job hold
    assert job_holder(sched) is None
    assert job_holder(FencedScheduler(sched, lambda: None)) is None
    assert job_holder(None) is None


def test_the_setting_is_hold_by_default_and_only_hold_or_stop() -> None:
    assert parse_config("").coordinator.pinned_jobs == "hold"
    assert parse_config('[coordinator]\npinned_jobs = "stop"\n').coordinator.pinned_jobs == "stop"
    with pytest.raises(ConfigError) as info:
        parse_config('[coordinator]\npinned_jobs = "requeue"\n', source="t.toml")
    [problem] = info.value.problems
    assert problem.path == "coordinator.pinned_jobs" and "'hold', 'stop'" in problem.message, problem


async def test_status_shows_the_hold_and_then_the_release(coord: Coordinator) -> None:
    """What ``ftd status`` and the dashboard print beside the node: the sentence, then the release."""
    record = await hold(coord)
    assert action_why(record) == record.detail["pinned"]["why"]
    coord.state.apply_conditions("node-1", [])
    await coord.reconciler.reconcile()
    [released] = coord.restarts()
    assert action_why(released) == "fs_fill cleared on node-1: ftd released job 42"


async def test_a_hold_the_scheduler_refuses_leaves_the_job_stopped_and_says_why(
    sched: FakeScheduler, tmp_path: Path
) -> None:
    sched.add_job("43", ["node-1"], required=["node-1"], requeue=False)  # sbatch --no-requeue -w node-1
    c = await start(sched, tmp_path / "ledger.sqlite", [1000.0])
    try:
        c.state.apply_conditions("node-1", [FULL], ["fs_fill"])
        await c.engine.submit(
            ActionRequest(
                kind=ActionKind.CHECKPOINT_RESTART,
                target="43",
                reason="filesystem /scratch at 100%",
                params={"exclude": ["node-1"]},
                rule="fs_fill",
            )
        )
        assert await c.engine.wait_idle(5)
        await told(c)
        [record] = c.restarts()
        pinned = record.detail["pinned"]
        assert record.state == ActionState.ESCALATED and pinned["action"] == "stop", record.detail
        assert "(holding it failed: job 43 does not allow requeue" in pinned["why"]
        assert c.reconciler.pinned.held == {}
        assert [n.request.reason for n in c.notified] == [pinned["why"]]
        assert (await sched.job_info("43")).restarts == 0
    finally:
        await c.close()
