"""The dashboard's node row: "since" is when the node's problem began (not its last status change),
and the action beside it is the one awaiting an operator's approval before any other (issue #32)."""

from __future__ import annotations

from ftd.bus import topics
from ftd.bus.base import Message
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import Config, CoordinatorConfig
from ftd.coordinator.api.views import NodeIndex
from ftd.coordinator.ledger.sqlite import Ledger
from ftd.coordinator.model.state import ClusterState
from ftd.coordinator.wiring import build
from ftd.events import NodeConditions, NodeStatus, encode
from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState


def action(id_: str, kind: str, node: str, state: ActionState, created: float) -> ActionRecord:
    request = ActionRequest(kind=kind, target=node, reason=f"{kind} on {node}", rule="test")
    return ActionRecord(id=id_, request=request, state=state, created=created, updated=created)


def index(
    state: ClusterState, in_flight: tuple[ActionRecord, ...] = (), recent: tuple[ActionRecord, ...] = ()
) -> NodeIndex:
    return NodeIndex(state, {}, in_flight, recent)


def test_since_is_when_the_problem_began_not_the_last_status_change() -> None:
    state = ClusterState()
    state.apply_status(NodeStatus(node="n1", state="online", ts=100.0))
    state.mark_drained("n1", "ftd: xid 79", since=1_000.0)  # the ledger's drain time
    state.apply_status(NodeStatus(node="n1", state="online", ts=5_000.0))  # agent restarted later
    out = index(state).node_out("n1")
    assert out.last_change == 5_000.0
    assert out.since == 1_000.0


def test_since_is_the_earliest_problem_still_on_and_none_when_healthy() -> None:
    state = ClusterState()
    state.apply_status(NodeStatus(node="n1", state="online", ts=100.0))
    assert index(state).node_out("n1").since is None
    state.apply_conditions("n1", ["xid 48: double-bit ECC"], since=2_000.0)
    state.apply_conditions("n1", ["xid 48: double-bit ECC", "xid 63"], since=3_000.0)  # republished
    state.apply_status(NodeStatus(node="n1", state="offline", ts=4_000.0))
    assert index(state).node_out("n1").since == 2_000.0  # the condition came first
    state.apply_conditions("n1", [])
    assert index(state).node_out("n1").since == 4_000.0  # offline since its Last Will
    state.apply_status(NodeStatus(node="n1", state="online", ts=6_000.0))
    assert index(state).node_out("n1").since is None


def test_since_counts_an_action_in_flight_and_external_drains() -> None:
    state = ClusterState()
    for n in ("n1", "n2"):
        state.apply_status(NodeStatus(node=n, state="online", ts=100.0))
    state.mark_unavailable("n2", "admin: cable swap", since=700.0)
    state.mark_unavailable("n2", "admin: cable swap")  # seen again by the next reconcile
    reset = action("a1", "gpu_reset", "n1", ActionState.RUNNING, 900.0)
    idx = index(state, (reset,))
    assert idx.node_out("n1").since == 900.0
    assert idx.node_out("n2").since == 700.0


def test_the_action_awaiting_approval_is_shown_before_others() -> None:
    state = ClusterState()
    state.apply_status(NodeStatus(node="n1", state="online", ts=100.0))
    held = action("held", "drain_node", "n1", ActionState.AWAITING_APPROVAL, 1_000.0)
    running = action("run", "gpu_reset", "n1", ActionState.RUNNING, 2_000.0)  # newer, running
    suppressed = action("old", "drain_node", "n1", ActionState.SUPPRESSED, 3_000.0)  # newest, done
    out = index(state, (held, running), (suppressed, held)).node_out("n1")
    assert out.action is not None and out.action.id == "held"
    assert out.state == "acting" and out.since == 1_000.0


async def test_a_condition_began_when_its_agent_published_it() -> None:
    """Through the coordinator's own handling of the agent's retained ``conditions/ftd``: the time in
    the message (when the agent's set changed), kept while any condition stays, gone when cleared."""
    config = Config(coordinator=CoordinatorConfig(ledger_path=":memory:", scheduler="none"))
    coordinator = build(config, bus=MemoryBus(MemoryBroker()), scheduler=None, ledger=Ledger(":memory:"))
    topic = topics.node_condition("n1", topics.FTD_CONDITIONS)

    async def publish(ts: float, conditions: list[str]) -> None:
        payload = encode(NodeConditions(node="n1", ts=ts, conditions=conditions))
        assert await coordinator.handle_message(Message(topic, payload, retain=True))

    try:
        coordinator.state.apply_status(NodeStatus(node="n1", state="online", ts=100.0))
        await publish(2_000.0, ["xid 48: double-bit ECC"])
        await publish(3_000.0, ["xid 48: double-bit ECC", "xid 63: row remap pending"])
        assert index(coordinator.state).node_out("n1").since == 2_000.0
        await publish(4_000.0, [])
        assert index(coordinator.state).node_out("n1").since is None
    finally:
        await coordinator.engine.close()
