"""Engine: rule isolation, event dedupe through the ledger, recording before/after, restart safety."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ftd.coordinator.actions.directive import node_sender
from ftd.coordinator.decide.engine import Engine
from ftd.coordinator.decide.plugins import PluginError, make_plugin_manager
from ftd.coordinator.decide.policy import PolicyGate
from ftd.coordinator.ledger.sqlite import Ledger, SqliteStore
from ftd.coordinator.model.state import ClusterState
from ftd.events import JobPresence, Kind, RankInfo, make_event
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState
from ftd.plugin.hookspecs import hookimpl
from ftd.plugin.view import ClusterView


class Broken:
    @hookimpl
    def ftd_evaluate(self, event: Any, view: ClusterView) -> list[ActionRequest]:
        raise RuntimeError("rule bug")


class DrainOnEcc:
    @hookimpl
    def ftd_evaluate(self, event: Any, view: ClusterView) -> list[ActionRequest] | None:
        if event.kind == Kind.ECC:
            return [ActionRequest(kind=ActionKind.DRAIN_NODE, target=event.node, reason="ecc")]
        return None


class Recorder:
    def __init__(self, fail: bool = False, block: asyncio.Event | None = None) -> None:
        self.calls: list[str] = []
        self.fail = fail
        self.block = block

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        self.calls.append(record.request.target)
        if self.block is not None:
            await self.block.wait()
        if self.fail:
            raise RuntimeError("scontrol exploded")
        return {"done": True}


async def make_engine(
    tmp_path: Path, executor: Recorder, plugins: tuple[object, ...] = (DrainOnEcc(),)
) -> Engine:
    pm = make_plugin_manager(extra=plugins, entry_points=False, disabled=["xid_catalog"])
    engine = Engine(
        state=ClusterState(),
        ledger=SqliteStore(Ledger(tmp_path / "ledger.sqlite")),
        gate=PolicyGate(cooldown_s=600),
        plugins=pm,
        executors={ActionKind.DRAIN_NODE: executor},
    )
    await engine.load()  # what an earlier engine on the same ledger left (a restart)
    return engine


async def test_a_raising_rule_does_not_silence_the_others(tmp_path: Path) -> None:
    executor = Recorder()
    engine = await make_engine(tmp_path, executor, (Broken(), DrainOnEcc()))
    records = await engine.handle_event(make_event("node-1", Kind.ECC))
    assert [r.request.kind for r in records] == ["drain_node"]
    assert records[0].request.rule  # the proposing rule is named
    assert engine.counters["rule_errors"] == 1
    await engine.wait_idle(5)
    assert executor.calls == ["node-1"]
    assert (await engine.ledger.action(records[0].id)).state == ActionState.SUCCEEDED


async def test_duplicate_event_ids_are_evaluated_once(tmp_path: Path) -> None:
    executor = Recorder()
    engine = await make_engine(tmp_path, executor)
    event = make_event("node-1", Kind.ECC)
    assert await engine.handle_event(event)
    assert await engine.handle_event(event) == []
    assert engine.counters["duplicates"] == 1


async def test_failed_executor_is_recorded_with_its_error(tmp_path: Path) -> None:
    engine = await make_engine(tmp_path, Recorder(fail=True))
    [record] = await engine.handle_event(make_event("node-1", Kind.ECC))
    await engine.wait_idle(5)
    stored = await engine.ledger.action(record.id)
    assert stored.state == ActionState.FAILED
    assert "scontrol exploded" in stored.detail["error"]


async def test_action_without_executor_fails_visibly(tmp_path: Path) -> None:
    pm = make_plugin_manager(extra=(DrainOnEcc(),), entry_points=False, disabled=["xid_catalog"])
    engine = Engine(
        state=ClusterState(),
        ledger=SqliteStore(Ledger(":memory:")),
        gate=PolicyGate(),
        plugins=pm,
        executors={},
    )
    [record] = await engine.handle_event(make_event("node-1", Kind.ECC))
    # No notify executor either (executors={}): it fails, with a sentence and no repr (issue #20).
    error = record.detail["error"]
    assert record.state == ActionState.FAILED and error.startswith("cannot drain node-1: no scheduler"), error
    assert "<ActionKind" not in error and error.endswith(".")


async def test_a_drain_without_a_scheduler_becomes_a_notification(tmp_path: Path) -> None:
    pm = make_plugin_manager(extra=(DrainOnEcc(),), entry_points=False, disabled=["xid_catalog"])
    sent = Recorder()
    engine = Engine(
        state=ClusterState(),
        ledger=SqliteStore(Ledger(":memory:")),
        gate=PolicyGate(),
        plugins=pm,
        executors={ActionKind.NOTIFY: sent},
    )
    [record] = await engine.handle_event(make_event("node-1", Kind.ECC))
    assert record.request.kind == ActionKind.NOTIFY and record.request.params["instead_of"] == "drain_node"
    assert record.request.reason.startswith("node-1 should be drained (")
    assert (
        'coordinator.scheduler = "none" (detect and notify only): drain it by hand' in record.request.reason
    )
    await engine.wait_idle(5)
    assert record.state == ActionState.SUCCEEDED


async def test_restart_neither_repeats_finished_nor_loses_unfinished_actions(tmp_path: Path) -> None:
    first = Recorder()
    engine = await make_engine(tmp_path, first)
    event_done = make_event("node-1", Kind.ECC)
    await engine.handle_event(event_done)
    await engine.wait_idle(5)
    block = asyncio.Event()
    engine.executors[ActionKind.DRAIN_NODE] = Recorder(block=block)
    [unfinished] = await engine.handle_event(make_event("node-2", Kind.ECC))
    await asyncio.sleep(0.05)
    await engine.close()  # "crash" while node-2's drain is running
    await engine.ledger.close()

    second = Recorder()
    engine2 = await make_engine(tmp_path, second)
    assert await engine2.handle_event(event_done) == []  # redelivered event: already seen
    assert not engine2.gate.decide(ActionRequest(kind="drain_node", target="node-1", reason="x")).allowed
    resumed = await engine2.resume_unfinished()
    assert [r.id for r in resumed] == [unfinished.id]
    await engine2.wait_idle(5)
    assert second.calls == ["node-2"]
    assert (await engine2.ledger.action(unfinished.id)).state == ActionState.SUCCEEDED


async def test_resume_leaves_alone_what_this_run_already_started(tmp_path: Path) -> None:
    """The coordinator handles bus messages a moment before it resumes the last run's actions; an
    action decided in that moment is in the ledger as running, and resuming it again ran it twice
    (seen in the coordinator-crash e2e when the Xid came early)."""
    block = asyncio.Event()
    executor = Recorder(block=block)
    engine = await make_engine(tmp_path, executor)
    [record] = await engine.handle_event(make_event("node-1", Kind.ECC))
    await asyncio.sleep(0.01)
    assert await engine.resume_unfinished() == []
    block.set()
    await engine.wait_idle(5)
    assert executor.calls == ["node-1"]
    stored = await engine.ledger.action(record.id)
    assert stored.state == ActionState.SUCCEEDED and "resumed" not in stored.detail


def test_plugin_with_unknown_hook_fails_at_startup() -> None:
    class Typo:
        @hookimpl
        def ftd_evaluat(self, event: Any, view: Any) -> None: ...

    with pytest.raises(PluginError, match="unknown hook"):
        make_plugin_manager(extra=(Typo(),), entry_points=False)


async def test_builtin_xid_rule_drains_on_79_and_restarts_the_job_elsewhere(tmp_path: Path) -> None:
    executor = Recorder()
    pm = make_plugin_manager(entry_points=False)
    state = ClusterState()
    state.apply_presence("node-2", "1001", JobPresence(job="1001", node="node-2", ranks=[RankInfo(rank=1)]))
    restarts = Recorder()
    engine = Engine(
        state=state,
        ledger=SqliteStore(Ledger(":memory:")),
        gate=PolicyGate(),
        plugins=pm,
        executors={ActionKind.DRAIN_NODE: executor, ActionKind.CHECKPOINT_RESTART: restarts},
    )
    records = await engine.handle_event(
        make_event("node-2", Kind.XID, data={"code": 79, "pci": "0000:3b:00.0"})
    )
    by_kind = {r.request.kind: r.request for r in records}
    assert set(by_kind) == {"drain_node", "checkpoint_restart"}
    assert by_kind["drain_node"].reason == "xid 79 gpu 0000:3b:00.0 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
    assert by_kind["checkpoint_restart"].target == "1001"
    assert by_kind["checkpoint_restart"].params["exclude"] == ["node-2"]
    assert await engine.handle_event(make_event("node-2", Kind.XID, data={"code": 43})) == []
    await engine.wait_idle(5)


async def test_approval_queue_holds_then_approve_starts_and_reject_closes(tmp_path: Path) -> None:
    executor = Recorder()
    pm = make_plugin_manager(extra=(DrainOnEcc(),), entry_points=False, disabled=["xid_catalog"])
    engine = Engine(
        state=ClusterState(),
        ledger=SqliteStore(Ledger(tmp_path / "ledger.sqlite")),
        gate=PolicyGate(approval_required_kinds=["drain_node"]),
        plugins=pm,
        executors={ActionKind.DRAIN_NODE: executor},
    )
    [held] = await engine.handle_event(make_event("node-1", Kind.ECC))
    assert held.state == ActionState.AWAITING_APPROVAL and "approval" in held.detail["policy"]
    assert (await engine.ledger.action(held.id)).state == ActionState.AWAITING_APPROVAL
    [dup] = await engine.handle_event(make_event("node-1", Kind.ECC))
    assert dup.state == ActionState.SUPPRESSED  # the held one occupies its key
    approved = await engine.approve(held.id, by="alice")
    assert approved.state == ActionState.PENDING
    await engine.wait_idle(5)
    assert executor.calls == ["node-1"]
    assert (await engine.ledger.action(held.id)).state == ActionState.SUCCEEDED
    with pytest.raises(KeyError):
        await engine.approve(held.id)

    [other] = await engine.handle_event(make_event("node-2", Kind.ECC))
    rejected = await engine.reject(other.id, "known flaky sensor", by="bob")
    assert rejected.state == ActionState.SUPPRESSED
    assert (await engine.ledger.action(other.id)).detail["policy"] == "rejected by bob: known flaky sensor"
    assert executor.calls == ["node-1"]
    [pending_human] = await engine.handle_event(make_event("node-3", Kind.ECC))
    await engine.ledger.close()

    restarted = await make_engine(tmp_path, Recorder())  # a held action survives a restart
    assert list(restarted.awaiting) == [pending_human.id]
    assert (await restarted.handle_event(make_event("node-3", Kind.ECC)))[0].state == ActionState.SUPPRESSED


def test_checkpoint_is_served_by_the_checkpoint_restart_executor() -> None:
    """``checkpoint`` (save only) is the same executor: it reads ``params["stop"]`` and the kind."""
    from ftd.config import Config
    from ftd.coordinator.actions import ExecutorContext, build_executors
    from ftd.coordinator.actions.acks import AckBook

    async def publish(topic: str, payload: bytes) -> None: ...

    ctx = ExecutorContext(
        config=Config(),
        state=ClusterState(),
        acks=AckBook(),
        publish=publish,
        send_to_node=node_sender(publish),
        scheduler=None,
    )
    executors = build_executors(ctx)
    assert executors[ActionKind.CHECKPOINT] is executors[ActionKind.CHECKPOINT_RESTART]


async def test_history_is_folded_in_after_the_rules_and_rebuilt_from_the_ledger(tmp_path: Path) -> None:
    engine = await make_engine(tmp_path, Recorder())
    await engine.handle_event(
        make_event("node-1", Kind.XID, severity="error", data={"code": 13, "uuid": "GPU-1"})
    )
    assert [f.code for f in engine.state.node_history("node-1")] == [13]
    await engine.wait_idle(5)
    await engine.ledger.close()
    again = await make_engine(tmp_path, Recorder())
    assert [f.code for f in again.state.node_history("node-1")] == [13]
    assert again.state.gpu("GPU-1") is not None
