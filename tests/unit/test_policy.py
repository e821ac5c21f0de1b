"""Policy gate: dedupe, cooldown, dry-run — with a property test over random histories."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ftd.coordinator.model import ActionRecord, ActionRequest, ActionState
from ftd.coordinator.policy import PolicyGate


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def req(kind: str = "drain_node", target: str = "node-1", rule: str = "r") -> ActionRequest:
    return ActionRequest(kind=kind, target=target, reason="test", rule=rule)


def run(gate: PolicyGate, request: ActionRequest, n: int = 0) -> ActionRecord:
    record = ActionRecord(id=f"a{n}", request=request, state=ActionState.RUNNING)
    gate.started(record)
    return record


def test_duplicate_in_progress_is_suppressed_then_cooldown_then_allowed() -> None:
    clock = Clock()
    gate = PolicyGate(cooldown_s=60, clock=clock)
    assert gate.decide(req()).allowed
    record = run(gate, req())
    verdict = gate.decide(req())
    assert verdict.state == ActionState.SUPPRESSED and verdict.reason.startswith("duplicate")
    assert gate.decide(req(target="node-2")).allowed  # other keys are independent
    gate.finished(record)
    clock.now += 59
    verdict = gate.decide(req())
    assert verdict.state == ActionState.SUPPRESSED and verdict.reason.startswith("cooldown")
    clock.now += 2
    assert gate.decide(req()).allowed


def test_dry_run_global_and_per_rule() -> None:
    assert PolicyGate(dry_run=True).decide(req()).state == ActionState.DRY_RUN
    gate = PolicyGate(dry_run_rules=["shadow"])
    assert gate.decide(req(rule="shadow")).state == ActionState.DRY_RUN
    assert gate.decide(req(rule="live")).allowed


def test_restore_from_ledger_keeps_dedupe_and_cooldown() -> None:
    clock = Clock()
    gate = PolicyGate(cooldown_s=60, clock=clock)
    gate.restore(
        [
            ActionRecord(id="x", request=req(target="node-1"), state=ActionState.RUNNING),
            ActionRecord(
                id="y", request=req(target="node-2"), state=ActionState.SUCCEEDED, updated=clock.now - 10
            ),
            ActionRecord(
                id="z", request=req(target="node-3"), state=ActionState.SUCCEEDED, updated=clock.now - 100
            ),
        ]
    )
    assert not gate.decide(req(target="node-1")).allowed
    assert not gate.decide(req(target="node-2")).allowed
    assert gate.decide(req(target="node-3")).allowed


ops = st.lists(
    st.tuples(
        st.sampled_from(["request", "finish", "tick"]),
        st.sampled_from(["node-1", "node-2"]),
        st.floats(0, 50),
    ),
    max_size=60,
)


@given(ops)
def test_never_two_at_once_and_never_inside_cooldown(history: list[tuple[str, str, float]]) -> None:
    cooldown = 30.0
    clock = Clock()
    gate = PolicyGate(cooldown_s=cooldown, clock=clock)
    running: dict[str, ActionRecord] = {}
    last_finish: dict[str, float] = {}
    for i, (op, target, dt) in enumerate(history):
        if op == "tick":
            clock.now += dt
        elif op == "finish" and target in running:
            gate.finished(running.pop(target))
            last_finish[target] = clock.now
        elif op == "request":
            verdict = gate.decide(req(target=target))
            if verdict.allowed:
                assert target not in running, "allowed a duplicate of a running action"
                assert clock.now - last_finish.get(target, -1e9) >= cooldown, "allowed inside the cooldown"
                running[target] = run(gate, req(target=target), i)
            else:
                assert target in running or clock.now - last_finish[target] < cooldown
