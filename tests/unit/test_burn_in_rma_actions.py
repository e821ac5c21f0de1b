"""Issue #36 on the coordinator: burn-in gating the return to service, the RMA bundle after a repair
drain, and both executors' directives and answers."""

from __future__ import annotations

import asyncio
import itertools

from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.burn_in import BURN_IN, BurnIn
from ftd.coordinator.actions.directive import node_sender
from ftd.coordinator.actions.rma import RMA_BUNDLE, RmaBundle, is_repair_drain
from ftd.coordinator.model.state import ClusterState
from ftd.coordinator.upkeep.return_service import PREFLIGHT, ReturnToService
from ftd.coordinator.upkeep.rma_bundles import RmaBundles
from ftd.events import NODE_RANK, Ack, Directive, Kind, decode, make_event
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState

ids = itertools.count()


def record(
    kind: str, state: ActionState, *, reason: str = "", rule: str = "xid_catalog", **params: object
) -> ActionRecord:
    request = ActionRequest(
        kind=kind, target="n1", reason=reason or f"{kind} because", rule=rule, params=params
    )
    return ActionRecord(id=f"a{next(ids)}", request=request, state=state)


class Engine:
    def __init__(self) -> None:
        self.submitted: list[ActionRecord] = []

    async def submit(self, request: ActionRequest) -> ActionRecord:
        done = ActionRecord(id=f"s{next(ids)}", request=request, state=ActionState.PENDING)
        self.submitted.append(done)
        return done

    def kinds(self) -> list[str]:
        return [r.request.kind for r in self.submitted]


async def _finish(rts: ReturnToService, rec: ActionRecord, state: ActionState, **detail: object) -> None:
    rec.state = state
    rec.detail.update(detail)
    rts.observe("action", rec)
    await rts.settle()


async def _to_preflight_passed(rts: ReturnToService, engine: Engine) -> None:
    reset = record(ActionKind.GPU_RESET, ActionState.PENDING)
    rts.observe("action", reset)
    await rts.settle()
    await _finish(rts, reset, ActionState.SUCCEEDED)
    await _finish(rts, engine.submitted[0], ActionState.SUCCEEDED)
    assert engine.kinds() == [ActionKind.DRAIN_NODE, PREFLIGHT]
    await _finish(rts, engine.submitted[1], ActionState.SUCCEEDED, passed=True)


async def test_a_site_that_requires_burn_in_resumes_only_after_it_passed() -> None:
    engine = Engine()
    rts = ReturnToService(engine.submit, rules=["xid_catalog"], require_burn_in=True)
    await _to_preflight_passed(rts, engine)
    assert engine.kinds() == [ActionKind.DRAIN_NODE, PREFLIGHT, BURN_IN]  # not resumed yet
    await _finish(rts, engine.submitted[2], ActionState.SUCCEEDED, passed=True, verdict="passed")
    assert engine.kinds()[-1] == ActionKind.RESUME_NODE
    assert engine.submitted[-1].request.reason == "preflight and burn-in passed after GPU reset"


async def test_a_burn_in_that_did_not_pass_drains_for_rma() -> None:
    engine = Engine()
    rts = ReturnToService(engine.submit, rules=["xid_catalog"], require_burn_in=True)
    await _to_preflight_passed(rts, engine)
    await _finish(rts, engine.submitted[2], ActionState.ESCALATED, burn_in="matmul: GPU 5 480.0 TFLOPS < 80%")
    last = engine.submitted[-1].request
    assert last.kind == ActionKind.DRAIN_NODE and last.params["rma"] is True
    assert last.reason.startswith("RMA: burn-in failed after GPU reset: matmul: GPU 5 480.0 TFLOPS")


async def test_without_the_requirement_a_passing_preflight_resumes_as_before() -> None:
    engine = Engine()
    rts = ReturnToService(engine.submit, rules=["xid_catalog"])
    await _to_preflight_passed(rts, engine)
    assert engine.kinds() == [ActionKind.DRAIN_NODE, PREFLIGHT, ActionKind.RESUME_NODE]


async def test_a_repair_drain_gets_one_bundle_and_other_drains_none() -> None:
    engine = Engine()
    rma = RmaBundles(engine.submit, reasons=["RMA", "repair"])
    ordinary = record(ActionKind.DRAIN_NODE, ActionState.SUCCEEDED, reason="ftd: xid 79: drain")
    rma.observe("action", ordinary)
    running = record(ActionKind.DRAIN_NODE, ActionState.RUNNING, reason="RMA: preflight failed")
    rma.observe("action", running)
    await rma.settle()
    assert engine.submitted == []  # not for repair, or not drained yet
    running.state = ActionState.SUCCEEDED
    rma.observe("action", running)
    rma.observe("action", running)  # seen twice (a replay): still one bundle
    await rma.settle()
    [bundle] = engine.submitted
    assert bundle.request.kind == RMA_BUNDLE and bundle.request.params == {"drain_action": running.id}
    assert is_repair_drain("sent for Repair by ops", {}, ["repair"])
    assert is_repair_drain("x", {"rma": True}, [])
    assert not is_repair_drain("ftd: hang culprit", {}, ["RMA", "repair"])


class Agent:
    """The bus and one agent: records directives, answers each with the ack given."""

    def __init__(self, acks: AckBook, answer: dict[str, object] | None) -> None:
        self.acks = acks
        self.answer = answer
        self.sent: list[Directive] = []

    async def publish(self, topic: str, payload: bytes) -> None:
        directive = decode(payload, Directive)
        self.sent.append(directive)
        if self.answer is not None:
            ack = Ack(directive_id=directive.id, job="", rank=NODE_RANK, node="n1", **self.answer)  # type: ignore[arg-type]
            asyncio.get_running_loop().call_later(0.01, self.acks.record, ack)


async def test_the_burn_in_executor_passes_failed_and_silent() -> None:
    acks = AckBook()
    report = {"verdict": "incomplete", "reason": "not every step ran (pair: no partner)"}
    agent = Agent(acks, {"ok": False, "reason": report["reason"], "data": {"report": report}})
    detail = await BurnIn(send=node_sender(agent.publish), acks=acks, deadline_s=2)(
        record(BURN_IN, ActionState.RUNNING)
    )
    assert agent.sent[0].action == "burn_in" and agent.sent[0].node == "n1"
    assert detail["state"] == "escalated" and detail["verdict"] == "incomplete"
    silent = Agent(acks, None)
    detail = await BurnIn(send=node_sender(silent.publish), acks=acks, deadline_s=0.2)(
        record(BURN_IN, ActionState.RUNNING)
    )
    assert detail["state"] == "failed" and "no answer" in detail["burn_in"]


async def test_the_rma_executor_sends_the_evidence_and_keeps_the_bundles_path() -> None:
    acks = AckBook()
    state = ClusterState()
    state.apply_event(make_event("n1", Kind.XID, severity="critical", data={"code": 79}, ts=0.0))
    agent = Agent(acks, {"ok": True, "reason": "6 file(s)", "path": "/var/lib/ftd/rma/n1-x.tar.gz"})
    executor = RmaBundle(
        send=node_sender(agent.publish),
        acks=acks,
        deadline_s=2,
        kmsg_window_s=900,
        bug_report_timeout_s=60,
        state=state,
    )
    detail = await executor(
        record(RMA_BUNDLE, ActionState.RUNNING, reason="RMA: preflight failed", drain_action="a1")
    )
    [directive] = agent.sent
    assert directive.action == "rma_bundle" and directive.params["kmsg_window_s"] == 900
    assert directive.params["evidence"]["faults"][0]["code"] == 79
    assert detail == {
        "drain_action": "a1",
        "bundle": "/var/lib/ftd/rma/n1-x.tar.gz",
        "rma_bundle": "6 file(s)",
    }


def test_the_fleet_figure_is_the_median_of_passed_burn_ins_per_profile() -> None:
    from ftd.coordinator.actions.burn_in import FleetFigures

    fleet = FleetFigures()

    def report(median: float, verdict: str = "passed", profile: str = "h100-sxm") -> dict[str, object]:
        steps = [{"name": "dcgm", "figures": {}}, {"name": "matmul", "figures": {"median": median}}]
        return {"verdict": verdict, "profile": profile, "steps": steps}

    fleet.add(report(700.0))
    fleet.add(report(720.0))
    assert fleet.figures() == {}  # too few yet
    fleet.add(report(100.0, verdict="failed"))  # a failed node is not the fleet
    fleet.add(report(710.0))
    fleet.add(report(300.0, profile="l40s"))
    fleet.add({"verdict": "passed", "profile": "h100-sxm", "steps": "junk"})  # bad input: ignored
    assert fleet.figures() == {"h100-sxm": 710.0}


async def test_the_burn_in_directive_carries_the_fleets_figures() -> None:
    acks = AckBook()
    report = {
        "verdict": "passed",
        "profile": "h100-sxm",
        "steps": [{"name": "matmul", "figures": {"median": 700.0}}],
    }
    agent = Agent(acks, {"ok": True, "reason": "4 step(s) passed", "data": {"report": report}})
    executor = BurnIn(send=node_sender(agent.publish), acks=acks, deadline_s=2)
    for _ in range(4):
        await executor(record(BURN_IN, ActionState.RUNNING))
    assert agent.sent[0].params == {"fleet_tflops": {}}
    assert agent.sent[3].params == {"fleet_tflops": {"h100-sxm": 700.0}}


async def test_the_burn_in_names_a_known_good_pair_peer_and_the_baseline_when_there_is_one() -> None:
    """The pair step's peer (issue #35's choice of an idle, known-good node) and the fleet's baseline
    travel with the directive; without a peer the directive names none (the agent skips the step)."""
    acks = AckBook()
    report = {"verdict": "passed", "profile": "h100-sxm", "steps": []}
    agent = Agent(acks, {"ok": True, "reason": "passed", "data": {"report": report}})
    peer = {"node": "n9", "host": "10.0.0.9", "port": 8790}
    peers: list[dict[str, object] | None] = [peer, None]
    executor = BurnIn(
        send=node_sender(agent.publish),
        acks=acks,
        deadline_s=2,
        pair_peer=lambda node: peers.pop(0),
        pair_baseline=lambda: 42.0,
        pair_rtt_baseline=lambda: 0.08,
    )
    await executor(record(BURN_IN, ActionState.RUNNING))
    await executor(record(BURN_IN, ActionState.RUNNING))
    assert agent.sent[0].params == {
        "fleet_tflops": {},
        "pair_peer": peer,
        "pair_baseline_gbps": 42.0,
        "pair_rtt_baseline_ms": 0.08,
    }
    assert agent.sent[1].params == {"fleet_tflops": {}}
