"""Plans (ftd.coordinator.model.plan) in the engine: dependencies by role, order not success, duplicates,
approvals; and the GPU reset's escalation after a reboot (verify phase)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from ftd.agent.gpu_reset import GpuResetter
from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.directive import node_sender
from ftd.coordinator.actions.gpu_reset import GpuReset
from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.coordinator.decide.engine import Engine
from ftd.coordinator.decide.plugins import make_plugin_manager
from ftd.coordinator.decide.policy import PolicyGate
from ftd.coordinator.ledger.sqlite import Ledger, SqliteStore
from ftd.coordinator.model.plan import Dependency, build, role_of, worth_a_plan
from ftd.coordinator.model.state import ClusterState
from ftd.events import Directive, Kind, NodeStatus, decode, make_event
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState
from ftd.plugin.hookspecs import hookimpl
from tests.unit.helpers import until

GPUS = "0, 00000000:3B:00.0, GPU-aaa\n"


def rec(id: str, kind: str, target: str = "n1") -> ActionRecord:
    request = ActionRequest(kind=kind, target=target, reason="r")
    return ActionRecord(id=id, request=request, state=ActionState.PENDING)


def test_build_orders_job_stop_then_node_actions_then_requeue_and_leaves_the_rest_free() -> None:
    records = [
        rec("job", ActionKind.CHECKPOINT_RESTART, "7"),
        rec("reset", ActionKind.GPU_RESET),
        rec("drain", ActionKind.DRAIN_NODE),
        rec("diag", ActionKind.COLLECT_DIAGNOSTICS),
        rec("mine", "power_cycle"),  # a plugin's own kind: free
    ]
    plan = build("p", "e", records)
    after = {s.action: s.after for s in plan.steps}
    assert after["reset"] == {0: [Dependency("job", 0)]}
    assert after["drain"] == {0: [Dependency("job", 0)]}
    assert after["job"] == {1: [Dependency("reset", 0), Dependency("drain", 0)]}
    assert after["diag"] == {} and after["mine"] == {}
    assert worth_a_plan(plan)
    assert not worth_a_plan(build("p", "e", [rec("job", ActionKind.CHECKPOINT_RESTART, "7")]))
    assert not worth_a_plan(build("p", "e", [rec("a", ActionKind.NOTIFY), rec("b", ActionKind.DRAIN_NODE)]))
    assert [role_of(k) for k in ("checkpoint", "drain_node", "notify")] == ["job", "node", "free"]


class Phased:
    """A phased executor whose phases wait for the test to let them go, recording their order."""

    def __init__(self, log: list[str], phases: tuple[str, ...] = ("stop", "requeue"), fail: str = "") -> None:
        self.phases = phases
        self.log = log
        self.fail = fail
        self.gates = {p: asyncio.Event() for p in phases}

    async def run_phase(self, record: ActionRecord, phase: str) -> dict[str, Any]:
        await self.gates[phase].wait()
        self.log.append(f"{record.request.kind}:{phase}")
        if phase == self.fail:
            raise RuntimeError(f"{phase} failed")
        return {phase: True}

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        raise AssertionError("the engine runs the phases")


class Plain:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        self.log.append(record.request.kind)
        return {}


class StopAndDrain:
    """The shape of a fatal-Xid decision: restart the job elsewhere, drain the node (Kubernetes: evict)."""

    @hookimpl
    def ftd_evaluate(self, event: Any, view: Any) -> list[ActionRequest] | None:
        if event.kind != Kind.XID:
            return None
        job = ActionRequest(
            kind=ActionKind.CHECKPOINT_RESTART, target="7", reason="x", params={"exclude": ["n1"]}
        )
        return [job, ActionRequest(kind=ActionKind.DRAIN_NODE, target="n1", reason="x")]


def engine(tmp_path: Path, executors: dict[str, Any], **gate: Any) -> Engine:
    pm = make_plugin_manager(extra=(StopAndDrain(),), entry_points=False, builtins=False)
    return Engine(
        state=ClusterState(),
        ledger=SqliteStore(Ledger(tmp_path / "ledger.sqlite")),
        gate=PolicyGate(**gate),
        plugins=pm,
        executors=executors,
    )


async def test_the_drain_waits_for_the_stop_and_the_requeue_for_the_drain(tmp_path: Path) -> None:
    log: list[str] = []
    job = Phased(log)
    eng = engine(tmp_path, {ActionKind.CHECKPOINT_RESTART: job, ActionKind.DRAIN_NODE: Plain(log)})
    records = await eng.handle_event(make_event("n1", Kind.XID, data={"code": 79}))
    assert [r.state for r in records] == [ActionState.PENDING, ActionState.PENDING]
    job.gates["requeue"].set()  # the requeue may go as soon as its turn comes
    await asyncio.sleep(0.05)
    assert log == []  # the drain (an eviction on Kubernetes) does not race the save
    drain = await eng.ledger.action(records[1].id)
    assert drain is not None and drain.state == ActionState.PENDING  # waiting, not running
    job.gates["stop"].set()
    assert await eng.wait_idle(5)
    assert log == ["checkpoint_restart:stop", "drain_node", "checkpoint_restart:requeue"]
    done = await eng.ledger.action(records[0].id)
    assert done is not None and done.state == ActionState.SUCCEEDED
    assert done.detail["phases_done"] == ["stop", "requeue"] and done.detail["stop"] is True
    assert await eng.ledger.plan_states(done.detail["plan"]) == [
        (records[0].id, "checkpoint_restart", "7", "succeeded"),
        (records[1].id, "drain_node", "n1", "succeeded"),
    ]


async def test_order_is_not_success_a_failed_stop_still_lets_the_drain_run(tmp_path: Path) -> None:
    log: list[str] = []
    job = Phased(log, fail="stop")
    for gate in job.gates.values():
        gate.set()
    eng = engine(tmp_path, {ActionKind.CHECKPOINT_RESTART: job, ActionKind.DRAIN_NODE: Plain(log)})
    records = await eng.handle_event(make_event("n1", Kind.XID, data={"code": 79}))
    assert await eng.wait_idle(5)
    assert log == ["checkpoint_restart:stop", "drain_node"]
    failed, drained = [await eng.ledger.action(r.id) for r in records]
    assert failed is not None and failed.state == ActionState.FAILED
    assert "stop failed" in failed.detail["error"]
    assert drained is not None and drained.state == ActionState.SUCCEEDED
    plan = await eng.ledger.plan(failed.detail["plan"])
    assert plan is not None and plan.state == "finished"


async def test_a_node_action_of_a_later_event_waits_for_the_stop_already_running(tmp_path: Path) -> None:
    log: list[str] = []
    job = Phased(log)
    eng = engine(tmp_path, {ActionKind.CHECKPOINT_RESTART: job, ActionKind.DRAIN_NODE: Plain(log)})
    await eng.handle_event(make_event("n1", Kind.ECC, data={}))  # nothing
    first = await eng.submit(ActionRequest(kind=ActionKind.CHECKPOINT_RESTART, target="7", reason="hang"))
    records = await eng.handle_event(make_event("n1", Kind.XID, data={"code": 79}))
    assert records[0].state == ActionState.SUPPRESSED  # the same job is already being restarted
    await asyncio.sleep(0.05)
    assert log == []  # ... so the drain waits for *that* stop
    job.gates["stop"].set()
    job.gates["requeue"].set()
    assert await eng.wait_idle(5)
    assert log == ["checkpoint_restart:stop", "drain_node", "checkpoint_restart:requeue"]
    assert await eng.ledger.action(first.id) is not None


async def test_an_approved_drain_still_waits_for_the_stop(tmp_path: Path) -> None:
    log: list[str] = []
    job = Phased(log)
    eng = engine(
        tmp_path,
        {ActionKind.CHECKPOINT_RESTART: job, ActionKind.DRAIN_NODE: Plain(log)},
        approval_required_kinds=(ActionKind.DRAIN_NODE,),
    )
    _, drain = await eng.handle_event(make_event("n1", Kind.XID, data={"code": 79}))
    assert drain.state == ActionState.AWAITING_APPROVAL
    await eng.approve(drain.id, by="op")
    await asyncio.sleep(0.05)
    assert log == []
    job.gates["stop"].set()
    job.gates["requeue"].set()
    assert await eng.wait_idle(5)
    assert log[:2] == ["checkpoint_restart:stop", "drain_node"]


# --- GPU reset escalation: reboot, then the check -----------------------------------------------


class NodeAgent:
    """The bus and the node's agent: directives answered by the real GpuResetter (fake nvidia-smi)."""

    def __init__(self, acks: AckBook, smi: Any) -> None:
        self.acks = acks
        self.resetter = GpuResetter("n1", runner=smi)
        self.sent: list[Directive] = []

    async def publish(self, topic: str, payload: bytes) -> None:
        directive = decode(payload, Directive)
        self.sent.append(directive)
        result = await self.resetter.reset(directive)
        _, ack = self.resetter.report(directive, result)
        self.acks.record(ack)


class Smi:
    def __init__(self, gpus: str = GPUS, reset_rc: int = 1) -> None:
        self.gpus, self.reset_rc = gpus, reset_rc

    async def __call__(self, argv: list[str]) -> tuple[int, str]:
        if argv[1].startswith("--query-gpu"):
            return 0, self.gpus
        if argv[1].startswith("--query-compute-apps"):
            return 0, ""
        return self.reset_rc, "reset failed: GPU is lost"


async def escalate(smi: Smi, after_reboot: str) -> tuple[dict[str, Any], FakeScheduler, NodeAgent]:
    acks, state, scheduler = AckBook(), ClusterState(), FakeScheduler()
    scheduler.add_node("n1")
    agent = NodeAgent(acks, smi)
    ex = GpuReset(
        send=node_sender(agent.publish),
        acks=acks,
        deadline_s=2,
        scheduler=scheduler,
        state=state,
        reboot_deadline_s=5,
        reboot_poll_s=0.01,
    )
    record = ActionRecord(
        id="act-9",
        request=ActionRequest(kind=ActionKind.GPU_RESET, target="n1", reason="xid 48", params={"index": 0}),
        state=ActionState.RUNNING,
    )
    task = asyncio.create_task(ex(record))
    await until(lambda: any(op == "reboot" for op, _ in scheduler.calls))
    smi.gpus = after_reboot
    scheduler.finish_reboot("n1")
    state.apply_status(NodeStatus(node="n1", state="online", ts=time.time() + 1))  # the agent is back
    return await task, scheduler, agent


async def test_a_failed_reset_reboots_and_a_healthy_gpu_after_it_clears_the_action() -> None:
    detail, scheduler, agent = await escalate(Smi(reset_rc=1), after_reboot=GPUS)
    assert detail["state"] == "escalated" and detail["escalation"] == "reboot"
    assert detail["reboot_cleared"] is True
    assert [d.id for d in agent.sent] == ["act-9-gpu_reset", "act-9-gpu_reset-check"]
    assert agent.sent[1].params == {"index": 0, "check_only": True}
    assert not scheduler.nodes["n1"].drained  # back in service (nextstate=RESUME)


async def test_a_gpu_still_missing_after_the_reboot_is_drained_for_rma() -> None:
    detail, scheduler, _ = await escalate(Smi(reset_rc=1), after_reboot="")
    assert detail["state"] == "escalated" and detail["escalation"] == "reboot+drain"
    assert detail["reboot_cleared"] is False
    node = scheduler.nodes["n1"]
    assert node.drained and node.reason is not None and "still bad after reboot: RMA" in node.reason


async def test_a_rejected_step_does_not_keep_its_plan_open(tmp_path: Path) -> None:
    log: list[str] = []
    job = Phased(log)
    for gate in job.gates.values():
        gate.set()
    eng = engine(
        tmp_path,
        {ActionKind.CHECKPOINT_RESTART: job, ActionKind.DRAIN_NODE: Plain(log)},
        approval_required_kinds=(ActionKind.DRAIN_NODE,),
    )
    restart, drain = await eng.handle_event(make_event("n1", Kind.XID, data={"code": 79}))
    assert await eng.wait_idle(5)
    plan_id = restart.detail["plan"]

    async def plan_state() -> str | None:
        plan = await eng.ledger.plan(plan_id)
        return plan.state if plan else None

    assert await plan_state() == "running"  # the drain waits for a human
    await eng.reject(drain.id, reason="not this node", by="op")
    assert await plan_state() == "finished"
    assert log == ["checkpoint_restart:stop", "checkpoint_restart:requeue"]


class EvictingScheduler(FakeScheduler):
    """Kubernetes' shape: drain is cordon + evict, offered in halves."""

    log: list[str] | None = None

    async def cordon(self, node: str, reason: str) -> None:
        assert self.log is not None
        self.log.append("cordon")
        await self.drain(node, reason)

    async def evict_node(self, node: str) -> dict[str, Any]:
        assert self.log is not None
        self.log.append("evict")
        return {"node": node, "evicted": ["ns/pod-1"]}


async def test_the_node_stops_taking_work_at_once_and_only_the_eviction_waits_for_the_save(
    tmp_path: Path,
) -> None:
    from ftd.coordinator.actions.drain import DrainNode

    log: list[str] = []
    scheduler = EvictingScheduler()
    scheduler.log = log
    scheduler.add_node("n1")
    job = Phased(log)
    state = ClusterState()
    drainer = DrainNode(scheduler, state)
    executors: dict[str, Any] = {ActionKind.CHECKPOINT_RESTART: job, ActionKind.DRAIN_NODE: drainer}
    eng = engine(tmp_path, executors)
    restart, drain = await eng.handle_event(make_event("n1", Kind.XID, data={"code": 79}))
    plan = await eng.ledger.plan(restart.detail["plan"])
    assert plan is not None
    steps = {s.kind: s for s in plan.steps}
    assert steps["drain_node"].after == {1: [Dependency(restart.id, 0)]}  # only the eviction waits
    assert steps["checkpoint_restart"].after == {1: [Dependency(drain.id, 1)]}  # requeue after it
    await until(lambda: log == ["cordon"])
    assert scheduler.nodes["n1"].drained and state.nodes["n1"].drained_by_ftd  # out of service at once
    await asyncio.sleep(0.05)
    assert log == ["cordon"]  # no eviction while the job saves
    job.gates["stop"].set()
    job.gates["requeue"].set()
    assert await eng.wait_idle(5)
    assert log == ["cordon", "checkpoint_restart:stop", "evict", "checkpoint_restart:requeue"]
    done = await eng.ledger.action(drain.id)
    assert done is not None and done.state == ActionState.SUCCEEDED
    assert done.detail["evicted"]["evicted"] == ["ns/pod-1"]
    assert done.detail["phases_done"] == ["drain", "evict"]


async def test_on_slurm_the_drain_is_immediate_and_evicts_nothing(tmp_path: Path) -> None:
    from ftd.coordinator.actions.drain import DrainNode

    log: list[str] = []
    scheduler = FakeScheduler()
    scheduler.add_node("n1")
    job = Phased(log)
    drain = DrainNode(scheduler, ClusterState())
    executors: dict[str, Any] = {ActionKind.CHECKPOINT_RESTART: job, ActionKind.DRAIN_NODE: drain}
    eng = engine(tmp_path, executors)
    await eng.handle_event(make_event("n1", Kind.XID, data={"code": 79}))
    await until(lambda: scheduler.nodes["n1"].drained)
    assert log == []  # the job has not even saved yet: Slurm's drain leaves it running
    job.gates["stop"].set()
    job.gates["requeue"].set()
    assert await eng.wait_idle(5)
    assert [op for op, _ in scheduler.calls] == ["drain"]
