"""Pair tests gate the return to service (issue #35), and the pair_test executor fails closed.

The return-to-service observer with ``pair_gate`` on: after a passing preflight it asks for a
``pair_test``; only a passing one resumes the node, a slow or failed one drains it for RMA with the
reason. The executor (ftd/coordinator/actions/pair_test.py) picks an idle, online, undrained peer
with an address (a known-good one first), sends the directive, and judges the agent's answer: a
slow direction is escalated, no peer or no answer is failed, never a pass.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from ftd.config.schema import HardwareConfig
from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.pair_test import PAIR_TEST, PairTest, choose_peer
from ftd.coordinator.actions.restart_phase import InAllocation
from ftd.coordinator.model.state import ClusterState
from ftd.coordinator.upkeep.return_service import PREFLIGHT, ReturnToService
from ftd.events import NODE_RANK, Ack, Directive, Event, Kind, NodeStatus, Severity, make_event
from ftd.fabric.pairs import PairResult
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState
from ftd.plugin.view import JobRecord
from tests.unit.helpers import supervisor_info
from tests.unit.test_return_service import Engine, finish, observe, record


async def _through_preflight(pair_gate: bool) -> tuple[Engine, ReturnToService]:
    """A reset node drained, reset and past a passing preflight."""
    engine = Engine()
    rts = ReturnToService(engine.submit, rules=["xid_catalog"], pair_gate=pair_gate)
    reset = record(ActionKind.GPU_RESET, ActionState.PENDING)
    await observe(rts, reset)
    await finish(rts, reset, ActionState.SUCCEEDED)
    await finish(rts, engine.submitted[0], ActionState.SUCCEEDED)
    await finish(rts, engine.submitted[1], ActionState.SUCCEEDED, passed=True)
    return engine, rts


async def test_a_passing_preflight_then_a_passing_pair_test_resumes() -> None:
    engine, rts = await _through_preflight(True)
    assert engine.kinds() == [ActionKind.DRAIN_NODE, PREFLIGHT, PAIR_TEST]
    await finish(rts, engine.submitted[2], ActionState.SUCCEEDED, passed=True)
    assert engine.kinds()[-1] == ActionKind.RESUME_NODE
    assert engine.submitted[-1].request.reason.startswith("preflight and pair test passed")


async def test_a_slow_pair_test_drains_the_node_for_rma_with_the_reason() -> None:
    engine, rts = await _through_preflight(True)
    why = "n1 -> n2: 0.02 Gbit/s < 20 (0.8 x spec 25 Gbit/s)"
    await finish(rts, engine.submitted[2], ActionState.ESCALATED, pair_test=why)
    drain = engine.submitted[-1]
    assert drain.request.kind == ActionKind.DRAIN_NODE and drain.request.params["rma"] is True
    assert drain.request.reason.startswith(f"RMA: pair test failed after GPU reset: {why}")


async def test_without_the_gate_a_passing_preflight_resumes_at_once() -> None:
    engine, _ = await _through_preflight(False)
    assert PAIR_TEST not in engine.kinds() and engine.kinds()[-1] == ActionKind.RESUME_NODE


def _state(*idle: str) -> ClusterState:
    state = ClusterState()
    for i, name in enumerate(("n1", *idle), start=1):
        state.apply_status(NodeStatus(node=name, state="online", ts=1.0, addresses=[f"h{i}", f"10.0.0.{i}"]))
    return state


def test_the_peer_is_idle_online_undrained_and_has_an_address() -> None:
    state = _state("n2", "n3")
    assert choose_peer(state, "n1") == "n2"
    state.nodes["n2"].drained_by_ftd = True
    assert choose_peer(state, "n1") == "n3"
    state.nodes["n3"].online = False
    assert choose_peer(state, "n1") is None


def _run(state: ClusterState, answer: dict[str, Any] | None) -> tuple[dict[str, Any], list[Directive]]:
    sent: list[Directive] = []
    acks = AckBook()

    async def send(node: str, directive: Directive) -> None:
        sent.append(directive)
        if answer is not None:
            acks.record(
                Ack(
                    directive_id=directive.id, job="", rank=NODE_RANK, node=node, ok=True, ts=0.0, data=answer
                )
            )

    executor = PairTest(
        send=send,
        acks=acks,
        state=state,
        hardware=HardwareConfig(profile="h200-sxm"),
        port=7411,
        deadline_s=0.2,
    )
    request = ActionRequest(kind=PAIR_TEST, target="n1", reason="check", rule="t")
    rec = ActionRecord(id="p1", request=request, state=ActionState.RUNNING)
    return asyncio.run(executor(rec)), sent


def test_the_executor_judges_the_agents_answer_and_fails_closed() -> None:
    state = _state("n2")
    fast = PairResult(a="n1", b="n2", a_to_b_gbps=24.0, b_to_a_gbps=23.0, rtt_ms=0.1).as_dict()
    detail, sent = _run(state, {"pair_test": fast})
    assert detail["passed"] is True and detail["peer"] == "n2"
    assert sent[0].action == "pair_test" and sent[0].params == {
        "peer": "n2",
        "host": "10.0.0.2",
        "port": 7411,
    }
    slow = PairResult(a="n1", b="n2", a_to_b_gbps=2.0, b_to_a_gbps=23.0, rtt_ms=0.1).as_dict()
    detail, _ = _run(state, {"pair_test": slow})
    assert detail["state"] == str(ActionState.ESCALATED) and "n1 -> n2" in detail["pair_test"]
    detail, _ = _run(state, None)
    assert detail["state"] == str(ActionState.FAILED) and "no answer" in detail["pair_test"]
    detail, sent = _run(_state(), {"pair_test": fast})
    assert detail["state"] == str(ActionState.FAILED) and "no idle peer" in detail["pair_test"] and not sent


def test_a_spare_whose_newest_pair_test_was_slow_does_not_join_the_job() -> None:
    state = ClusterState()
    job = JobRecord(
        id="j1",
        supervisors={
            "n0": supervisor_info("active", 0),
            "n1": supervisor_info("active", 1),
            "s1": supervisor_info("spare", preflight="ok", state="idle"),
            "s2": supervisor_info("spare", preflight="ok", state="idle"),
        },
    )
    for i, (a, b) in enumerate([("n0", "n1"), ("x1", "x2"), ("s2", "x3")]):
        state.pairs.note(_pair_event(a, b, 10.0, 10.5, float(i)))
    state.pairs.note(_pair_event("s1", "n0", 0.02, 10.0, 10.0))  # s1's egress is slow
    restart = InAllocation(publish=_no_publish, state=state)
    rec = ActionRecord(
        id="r1",
        request=ActionRequest(kind=ActionKind.CHECKPOINT_RESTART, target="j1", reason="x", rule="t"),
        state=ActionState.RUNNING,
    )
    unfit = restart.unfit(rec, job)
    assert unfit["s1"].startswith("pair test with n0 slow: s1 -> n0")
    assert "s2" not in unfit and "n0" not in unfit, "the other end of a slow pair is not blamed"


async def _no_publish(topic: str, payload: bytes) -> None:
    return None


def _pair_event(a: str, b: str, ab: float, ba: float, ts: float) -> Event:
    data = PairResult(a=a, b=b, a_to_b_gbps=ab, b_to_a_gbps=ba, rtt_ms=0.1).as_dict()
    event = make_event(a, Kind.PAIR_TEST, severity=Severity.INFO, source="pair_tests", data=data)
    return msgspec.structs.replace(event, ts=ts)
