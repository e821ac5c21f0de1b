"""Restarts that happen and no dead ends at the gate (issue #20, items 4 and 6), with in-process parts.

The real-parts reproduction is ``tests/e2e/test_crash_loop_slurm.py``; these pin the pieces: a
restart of the job by ftd ends an application-fault incident early (the rule), a crash-loop restart
is paced by its own backoff and not by the cooldown, a failed action cools down only briefly, and
only an operator's forced action through the API steps past the cooldown (the gate).
"""

from __future__ import annotations

from typing import Any

from ftd.coordinator.decide.policy import PolicyGate
from ftd.events import Event, Kind
from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState
from ftd.plugin.settings import AppFaultPolicy
from ftd.rules import xid_catalog
from ftd.testing import evaluate_rule, make_event, view_with


def xid13(ts: float, pci: str = "0000:3b:00.0") -> Event:
    return make_event("node-1", Kind.XID, severity="error", data={"code": 13, "pci": pci}, ts=ts)


def test_an_xid13_after_ftd_restarted_the_job_is_a_new_occurrence_inside_the_window() -> None:
    view = view_with(jobs={"j1": ["node-1"]})
    first = evaluate_rule(xid_catalog, [xid13(1000.0)], view)
    assert [(a.kind, a.params["attempt"], a.params["delay_s"]) for a in first] == [
        ("checkpoint_restart", 1, 0.0)
    ]
    view.note_restart("j1", 1005.0)
    again = evaluate_rule(xid_catalog, [xid13(1030.0)], view)  # 30 s later: inside the 60 s window
    assert [(a.kind, a.params["attempt"], a.params["delay_s"]) for a in again] == [
        ("checkpoint_restart", 2, AppFaultPolicy().backoff_s)
    ]


def test_without_a_restart_in_between_it_is_the_same_incident() -> None:
    view = view_with(jobs={"j1": ["node-1"]})
    actions = evaluate_rule(
        xid_catalog, [xid13(1000.0), xid13(1001.0, pci="0000:1b:00.0"), xid13(1030.0)], view
    )
    assert [a.params["attempt"] for a in actions] == [1]


def test_a_restart_before_the_incident_began_does_not_split_it() -> None:
    view = view_with(jobs={"j1": ["node-1"]})
    view.note_restart("j1", 900.0)
    actions = evaluate_rule(xid_catalog, [xid13(1000.0), xid13(1002.0, pci="0000:1b:00.0")], view)
    assert [a.params["attempt"] for a in actions] == [1]


def test_the_limit_ends_in_a_notification_naming_the_signature() -> None:
    view = view_with(jobs={"j1": ["node-1"]})
    out = []
    for n in range(4):
        ts = 1000.0 + 20 * n
        out += evaluate_rule(xid_catalog, [xid13(ts)], view)
        view.note_restart("j1", ts + 5)
    assert [a.kind for a in out] == ["checkpoint_restart"] * 3 + ["notify"]
    assert [a.params["attempt"] for a in out[:3]] == [1, 2, 3]
    assert out[3].reason.startswith("crash loop: xid 13 on job j1, 3 restarts in 3600 s"), out[3].reason
    assert out[3].params["signature"] == "xid 13"


# --- the gate ------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def restart(rule: str = "xid_catalog", **params: Any) -> ActionRequest:
    return ActionRequest(
        kind="checkpoint_restart", target="j1", reason="t", rule=rule, params={"node": "node-1", **params}
    )


def finish(gate: PolicyGate, request: ActionRequest, state: ActionState = ActionState.SUCCEEDED) -> None:
    record = ActionRecord(id="a1", request=request, state=ActionState.RUNNING)
    gate.started(record)
    record.state = state
    gate.finished(record)


def test_a_crash_loop_restart_is_paced_by_its_backoff_not_the_cooldown() -> None:
    clock = Clock()
    gate = PolicyGate(cooldown_s=600, clock=clock)
    finish(gate, restart(attempt=1, delay_s=0.0))
    clock.now += 30
    verdict = gate.decide(restart(attempt=2, delay_s=30.0))
    assert verdict.allowed and "crash-loop restart 2" in verdict.reason, verdict
    plain = gate.decide(restart())  # any other job action is still held back
    assert plain.state == ActionState.SUPPRESSED and plain.reason.startswith("cooldown")


def test_a_failed_action_cools_down_only_briefly() -> None:
    clock = Clock()
    gate = PolicyGate(cooldown_s=600, failed_retry_s=30, clock=clock)
    drain = ActionRequest(kind="drain_node", target="node-1", reason="t", rule="xid_catalog")
    finish(gate, drain, ActionState.FAILED)
    clock.now += 10
    held = gate.decide(drain)
    assert held.state == ActionState.SUPPRESSED and "failed 10s ago" in held.reason, held
    clock.now += 21
    assert gate.decide(drain).allowed
    # Restored from the ledger after a restart: the same.
    restored = PolicyGate(cooldown_s=600, failed_retry_s=30, clock=clock)
    record = ActionRecord(id="a1", request=drain, state=ActionState.FAILED, updated=clock.now - 31)
    restored.restore([record])
    assert restored.decide(drain).allowed
    finish(gate, drain, ActionState.SUCCEEDED)  # a success starts the full cooldown
    clock.now += 31
    assert gate.decide(drain).state == ActionState.SUPPRESSED


def test_only_an_operators_forced_action_steps_past_the_cooldown() -> None:
    clock = Clock()
    gate = PolicyGate(cooldown_s=600, clock=clock)
    drain = ActionRequest(kind="drain_node", target="node-1", reason="t", rule="xid_catalog")
    finish(gate, drain)
    clock.now += 5
    forced = ActionRequest(
        kind="drain_node",
        target="node-1",
        reason="bad gpu",
        rule="api:alice",
        params={"force": True, "force_reason": "GPU 3 is smoking"},
    )
    verdict = gate.decide(forced)
    assert verdict.allowed and verdict.reason.startswith("force: cooldown"), verdict
    assert "api:alice: GPU 3 is smoking" in verdict.reason
    from_a_rule = ActionRequest(
        kind="drain_node",
        target="node-1",
        reason="t",
        rule="mine",
        params={"force": True, "force_reason": "x"},
    )
    assert gate.decide(from_a_rule).state == ActionState.SUPPRESSED
    unforced = ActionRequest(kind="drain_node", target="node-1", reason="t", rule="api:alice")
    assert gate.decide(unforced).state == ActionState.SUPPRESSED
