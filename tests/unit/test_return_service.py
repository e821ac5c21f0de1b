"""The return-to-service sequence, step by step (ftd.coordinator.upkeep.return_service): the observer sees the
engine's action records and submits the next step (as a task: ``settle`` waits for it); here a recorder
stands in for Engine.submit and the records are made by hand, so each branch is checked on its own (the
whole path on real Slurm: tests/e2e/test_return_to_service.py)."""

from __future__ import annotations

import itertools

from ftd.coordinator.model.state import ClusterState
from ftd.coordinator.upkeep.return_service import PREFLIGHT, ReturnToService
from ftd.events import Kind, make_event
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState

ids = itertools.count()


def record(kind: str, state: ActionState, *, rule: str = "xid_catalog", **detail: object) -> ActionRecord:
    request = ActionRequest(kind=kind, target="n1", reason=f"{kind} because", rule=rule)
    return ActionRecord(id=f"a{next(ids)}", request=request, state=state, detail=dict(detail))


class Engine:
    """Engine.submit's stand-in: records every request, answers with a pending (or given) record."""

    def __init__(self, answers: dict[str, ActionState] | None = None) -> None:
        self.submitted: list[ActionRecord] = []
        self.answers = answers or {}

    async def submit(self, request: ActionRequest) -> ActionRecord:
        state = self.answers.get(request.kind, ActionState.PENDING)
        done = ActionRecord(id=f"s{next(ids)}", request=request, state=state)
        self.submitted.append(done)
        return done

    def kinds(self) -> list[str]:
        return [r.request.kind for r in self.submitted]


async def observe(rts: ReturnToService, rec: ActionRecord) -> None:
    """What the engine does with each record, and then the steps it led to, submitted."""
    rts.observe("action", rec)
    await rts.settle()


async def finish(rts: ReturnToService, rec: ActionRecord, state: ActionState, **detail: object) -> None:
    rec.state = state
    rec.detail.update(detail)
    await observe(rts, rec)


async def test_reset_then_passing_preflight_resumes() -> None:
    engine = Engine()
    rts = ReturnToService(engine.submit, rules=["xid_catalog"])
    reset = record(ActionKind.GPU_RESET, ActionState.PENDING)
    await observe(rts, reset)
    assert engine.kinds() == [ActionKind.DRAIN_NODE]
    assert engine.submitted[0].request.reason.startswith("return-to-service: GPU reset")
    await finish(rts, reset, ActionState.SUCCEEDED)
    assert engine.kinds() == [ActionKind.DRAIN_NODE]  # the drain has not finished: no preflight yet
    await finish(rts, engine.submitted[0], ActionState.SUCCEEDED)
    assert engine.kinds() == [ActionKind.DRAIN_NODE, PREFLIGHT]
    assert engine.submitted[1].request.params["after"] == "GPU reset"
    await finish(rts, engine.submitted[1], ActionState.SUCCEEDED, passed=True)
    assert engine.kinds() == [ActionKind.DRAIN_NODE, PREFLIGHT, ActionKind.RESUME_NODE]


async def test_a_failing_preflight_after_a_reboot_drains_for_rma_with_the_history() -> None:
    engine = Engine()
    state = ClusterState()
    state.apply_event(make_event("n1", Kind.XID, severity="critical", data={"code": 79}, ts=0.0))
    rts = ReturnToService(engine.submit, rules=["xid_catalog"], state=state)
    reset = record(ActionKind.GPU_RESET, ActionState.RUNNING)
    await observe(rts, reset)
    await finish(rts, engine.submitted[0], ActionState.SUCCEEDED)
    await finish(rts, reset, ActionState.ESCALATED, escalation="reboot", reboot_cleared=True)
    assert engine.submitted[1].request.params["after"] == "reboot"
    await finish(
        rts, engine.submitted[1], ActionState.ESCALATED, preflight="gpu_inventory: 7 GPUs found, 8 expected"
    )
    rma = engine.submitted[-1].request
    assert (
        rma.kind == ActionKind.DRAIN_NODE
        and rma.params["rma"] is True
        and rma.params["severity"] == "critical"
    )
    assert rma.reason == (
        "RMA: preflight failed after reboot: gpu_inventory: 7 GPUs found, 8 expected; "
        "history: gpu_reset because; reboot done; xid 79 at 00:00:00"
    )


async def test_a_reset_that_did_not_work_and_rules_not_opted_in_are_left_alone() -> None:
    engine = Engine()
    rts = ReturnToService(engine.submit, rules=["ecc_remap"])
    await observe(rts, record(ActionKind.GPU_RESET, ActionState.PENDING, rule="xid_catalog"))
    assert engine.submitted == []
    reset = record(ActionKind.GPU_RESET, ActionState.PENDING, rule="ecc_remap")
    await observe(rts, reset)
    await finish(rts, engine.submitted[0], ActionState.SUCCEEDED)
    await finish(rts, reset, ActionState.ESCALATED, escalation="drain")  # its own escalation drained for RMA
    assert engine.kinds() == [ActionKind.DRAIN_NODE]


async def test_a_drain_the_gate_suppresses_does_not_stop_the_preflight() -> None:
    engine = Engine({ActionKind.DRAIN_NODE: ActionState.SUPPRESSED})  # e.g. the drain budget is spent
    rts = ReturnToService(engine.submit, rules=["xid_catalog"])
    reset = record(ActionKind.GPU_RESET, ActionState.PENDING)
    await observe(rts, reset)
    await finish(rts, reset, ActionState.SUCCEEDED)
    assert engine.kinds() == [ActionKind.DRAIN_NODE, PREFLIGHT]


async def test_a_held_back_preflight_gives_no_verdict() -> None:
    engine = Engine({PREFLIGHT: ActionState.DRY_RUN})
    rts = ReturnToService(engine.submit, rules=["xid_catalog"])
    reset = record(ActionKind.GPU_RESET, ActionState.PENDING)
    await observe(rts, reset)
    await finish(rts, engine.submitted[0], ActionState.SUCCEEDED)
    await finish(rts, reset, ActionState.SUCCEEDED)
    assert engine.kinds() == [ActionKind.DRAIN_NODE, PREFLIGHT]  # neither resumed nor drained for RMA


async def test_a_suspect_drained_by_an_opted_in_rule_returns_only_after_its_preflight() -> None:
    engine = Engine()
    rts = ReturnToService(engine.submit, rules=["hang"])
    request = ActionRequest(
        kind=ActionKind.DRAIN_NODE, target="n1", reason="hang culprit", rule="hang", params={"suspect": True}
    )
    drain = ActionRecord(id="d1", request=request, state=ActionState.PENDING)
    await observe(rts, drain)
    assert engine.submitted == []  # nothing before the drain is done
    await finish(rts, drain, ActionState.SUCCEEDED)
    assert engine.kinds() == [PREFLIGHT]
    assert engine.submitted[0].request.params["after"] == "suspect drain"
    await finish(rts, engine.submitted[0], ActionState.FAILED, preflight="nccl_allreduce: timed out")
    rma = engine.submitted[-1].request
    assert rma.kind == ActionKind.DRAIN_NODE and rma.params["rma"] is True and "hang culprit" in rma.reason
    # the same suspect drain from a rule not opted in: the node waits for a human
    other = ReturnToService(Engine().submit, rules=["xid_catalog"])
    await observe(other, ActionRecord(id="d2", request=request, state=ActionState.PENDING))
    assert other._nodes == {}
