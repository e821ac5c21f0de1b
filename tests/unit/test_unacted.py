"""Which unacted conditions get their drain asked for again (ftd.coordinator.upkeep.unacted), no I/O."""

from __future__ import annotations

from ftd.coordinator.model.state import ClusterState
from ftd.coordinator.upkeep.unacted import UnactedConditions, drain_remedy
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def drain_record(node: str, state: ActionState, at: float, **detail: object) -> ActionRecord:
    request = ActionRequest(
        kind=ActionKind.DRAIN_NODE,
        target=node,
        reason="xid 79 gpu 0000:3b:00.0 GPU_HAS_FALLEN_OFF_THE_BUS",
        params={"code": 79},
        rule="xid_catalog",
        event_id="ev-1",
    )
    return ActionRecord(
        id=f"act-{node}-{at}", request=request, state=state, detail=dict(detail), created=at, updated=at
    )


def setup(conditions: dict[str, list[str]]) -> tuple[UnactedConditions, ClusterState, Clock]:
    clock = Clock()
    state = ClusterState()
    for node, reasons in conditions.items():
        state.apply_conditions(node, reasons)
    return UnactedConditions(backoff_s=10.0, max_backoff_s=35.0, clock=clock), state, clock


def never_busy(node: str) -> bool:
    return False


def test_catalog_drain_remedies() -> None:
    assert drain_remedy("xid 79 on 0000:3b:00.0")
    assert drain_remedy("gpu_fallen_off_bus 0000:3b:00.0")
    assert not drain_remedy("xid 13 on 0000:3b:00.0")  # an application fault: restart, never drain
    assert not drain_remedy("xid 48 on 0000:3b:00.0")  # a reset
    assert not drain_remedy("fs /data 99% full (bytes)")


def test_a_failed_drain_is_retried_after_the_backoff_which_doubles_up_to_its_cap() -> None:
    unacted, state, clock = setup({"node-2": ["xid 79 on 0000:3b:00.0"]})
    unacted.observe(drain_record("node-2", ActionState.FAILED, 1000.0, error="SchedulerError: down"))
    assert unacted.due(state, busy=never_busy) == []  # not before backoff_s
    clock.now = 1010.0
    [retry] = unacted.due(state, busy=never_busy)
    assert retry.kind == ActionKind.DRAIN_NODE and retry.target == "node-2" and retry.rule == "reconcile"
    assert retry.reason == "retry of an unacted condition: xid 79 gpu 0000:3b:00.0 GPU_HAS_FALLEN_OFF_THE_BUS"
    assert retry.params["retry_of"] == "act-node-2-1000.0" and retry.params["last_state"] == "failed"
    assert retry.params["why"] == "SchedulerError: down" and retry.params["code"] == 79
    assert retry.params["conditions"] == ["xid 79 on 0000:3b:00.0"] and retry.event_id == "ev-1"
    assert unacted.due(state, busy=never_busy) == []  # once per round at most, then the back-off

    # The retry was suppressed by the gate (budget full): asked again after 20 s, then 35 s (capped).
    unacted.observe(drain_record("node-2", ActionState.SUPPRESSED, 1010.0, policy="blast radius: 1/1"))
    clock.now = 1029.0
    assert unacted.due(state, busy=never_busy) == []
    clock.now = 1030.0
    [again] = unacted.due(state, busy=never_busy)
    assert again.reason == retry.reason  # not "retry of ... retry of ..."
    assert again.params["last_state"] == "suppressed" and again.params["why"] == "blast radius: 1/1"
    clock.now = 1064.0
    assert unacted.due(state, busy=never_busy) == []
    clock.now = 1065.0
    assert len(unacted.due(state, busy=never_busy)) == 1


def test_nothing_is_asked_for_a_node_drained_out_of_service_or_with_a_drain_under_way() -> None:
    unacted, state, _ = setup({"n1": ["xid 79 on a"], "n2": ["xid 79 on a"], "n3": ["xid 79 on a"]})
    for node in ("n1", "n2", "n3"):
        unacted.observe(drain_record(node, ActionState.FAILED, 900.0))
    state.mark_drained("n1", "ftd: xid 79")
    state.mark_unavailable("n2", "drained: operator")
    assert unacted.due(state, busy=lambda node: node == "n3") == []
    assert [r.target for r in unacted.due(state, busy=never_busy)] == ["n3"]


def test_an_operators_rejection_a_dry_run_a_success_or_a_held_drain_is_not_retried() -> None:
    conditions = {n: ["xid 79 on a"] for n in ("rej", "dry", "ok", "held")}
    unacted, state, _ = setup(conditions)
    unacted.observe(
        drain_record("rej", ActionState.SUPPRESSED, 900.0, policy="rejected by alice: RMA booked")
    )
    unacted.observe(drain_record("dry", ActionState.DRY_RUN, 900.0))
    unacted.observe(drain_record("ok", ActionState.SUCCEEDED, 900.0))  # drained, then resumed by someone
    unacted.observe(drain_record("held", ActionState.AWAITING_APPROVAL, 900.0))
    assert unacted.due(state, busy=never_busy) == []


def test_a_condition_never_acted_on_is_drained_by_the_catalogs_remedy_only() -> None:
    unacted, state, _ = setup({"n1": ["xid 13 on a", "xid 79 on b"], "n2": ["xid 13 on a"]})
    [request] = unacted.due(state, busy=never_busy)
    assert request.target == "n1" and request.reason == "retry of an unacted condition: xid 79 on b"
    assert request.params["last_state"] == "never asked" and request.event_id is None


def test_the_backoff_starts_over_once_the_conditions_are_gone_and_zero_disables() -> None:
    unacted, state, clock = setup({"n1": ["xid 79 on a"]})
    assert len(unacted.due(state, busy=never_busy)) == 1
    assert unacted.retries["n1"].attempts == 1
    state.apply_conditions("n1", [])
    assert unacted.due(state, busy=never_busy) == [] and "n1" not in unacted.retries
    off = UnactedConditions(backoff_s=0.0, clock=clock)
    state.apply_conditions("n1", ["xid 79 on a"])
    assert off.due(state, busy=never_busy) == []
