"""Policy gate: dedupe, cooldown, dry-run, rate limit, blast radius, approval — with property tests."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ftd.coordinator.decide.policy import DomainBudget, PolicyGate, RateLimit
from ftd.coordinator.model.state import ClusterState
from ftd.events import JobPresence, RankInfo
from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState


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


def test_one_rules_notification_does_not_hold_back_anothers() -> None:
    """Notifications are deduped and cooled down per rule: a thermal notice on node-1 must not
    silence a crash-loop notice on node-1 for the cooldown (they shared ``notify:node-1``)."""
    clock = Clock()
    gate = PolicyGate(cooldown_s=600, clock=clock)
    thermal = run(gate, req("notify", rule="thermal"))
    assert gate.decide(req("notify", rule="app_faults")).allowed
    assert gate.decide(req("notify", rule="thermal")).reason.startswith("duplicate")
    gate.finished(thermal)
    clock.now += 10
    assert gate.decide(req("notify", rule="thermal")).reason.startswith("cooldown")
    assert gate.decide(req("notify", rule="app_faults")).allowed


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


# --- rate limit, blast radius, approval ------------------------------------------------------------


def cluster(n: int, jobs: dict[str, list[str]] | None = None) -> ClusterState:
    state = ClusterState()
    for i in range(n):
        state._node(f"node-{i}")
    for job, nodes in (jobs or {}).items():
        for rank, node in enumerate(nodes):
            state.apply_presence(node, job, JobPresence(job=job, node=node, ranks=[RankInfo(rank=rank)]))
    return state


def test_rate_limit_per_kind_in_a_sliding_window() -> None:
    clock = Clock()
    gate = PolicyGate(rate_limits=[RateLimit("checkpoint_restart", 2, 60)], clock=clock)
    for i, job in enumerate(["j1", "j2"]):
        assert gate.decide(req("checkpoint_restart", job)).allowed
        run(gate, req("checkpoint_restart", job), i)
    verdict = gate.decide(req("checkpoint_restart", "j3"))
    assert verdict.state == ActionState.SUPPRESSED and verdict.reason.startswith("rate limit")
    assert gate.decide(req("drain_node", "node-1")).allowed  # other kinds are not limited
    clock.now += 61
    assert gate.decide(req("checkpoint_restart", "j3")).allowed


def test_blast_radius_fraction_counts_drained_and_in_flight_nodes() -> None:
    state = cluster(20)
    gate = PolicyGate(max_drained_fraction=0.1, min_drain_budget=1)  # budget: 2 of 20
    state.mark_drained("node-0", "earlier")
    assert gate.decide(req(target="node-1"), state).allowed
    run(gate, req(target="node-1"))
    verdict = gate.decide(req(target="node-2"), state)
    assert verdict.state == ActionState.SUPPRESSED and "blast radius" in verdict.reason
    assert "budget 2" in verdict.reason
    assert gate.decide(req("checkpoint_restart", "j1"), state).allowed  # job actions are not budgeted
    state.mark_drained("node-0", "", drained=False)  # resumed: room again
    assert gate.decide(req(target="node-2"), state).allowed


def test_blast_radius_per_job_and_per_domain() -> None:
    state = cluster(40, jobs={"big": [f"node-{i}" for i in range(8)]})
    labels = {f"node-{i}": {"rack": f"r{i // 10}", "nvlink_domain": f"d{i // 5}"} for i in range(40)}
    gate = PolicyGate(
        max_drained_fraction=1.0,
        max_drained_per_job=1,
        domain_budgets=[DomainBudget("rack", 2)],
        node_labels=labels,
    )
    state.mark_drained("node-0", "x")
    verdict = gate.decide(req(target="node-1"), state)
    assert "job big" in verdict.reason and not verdict.allowed
    state.mark_drained("node-10", "x")
    assert gate.decide(req(target="node-11"), state).allowed  # rack r1 has 1 of 2
    state.mark_drained("node-11", "x")
    verdict = gate.decide(req(target="node-12"), state)
    assert not verdict.allowed and "rack r1" in verdict.reason
    assert gate.decide(req(target="node-25"), state).allowed  # another rack


def test_approval_required_kinds_are_held_and_occupy_their_key() -> None:
    gate = PolicyGate(approval_required_kinds=["drain_node"])
    verdict = gate.decide(req())
    assert verdict.state == ActionState.AWAITING_APPROVAL
    held = ActionRecord(id="h1", request=req(), state=verdict.state)
    gate.hold(held)
    assert gate.decide(req()).reason.startswith("duplicate")
    assert gate.decide(req(), approving="h1").allowed  # the approval itself is not a duplicate
    assert gate.decide(req("checkpoint_restart", "j1")).allowed


drain_ops = st.lists(
    st.tuples(
        st.sampled_from(["drain", "finish", "resume", "tick"]),
        st.integers(0, 11),
        st.floats(0, 40),
    ),
    max_size=80,
)


@given(drain_ops, st.floats(0, 1), st.integers(0, 3), st.integers(1, 4))
def test_never_exceeds_the_drain_budget_nor_the_rate_limit(
    history: list[tuple[str, int, float]], fraction: float, floor: int, rate: int
) -> None:
    clock = Clock()
    state = cluster(12)
    window = 100.0
    gate = PolicyGate(
        cooldown_s=30,
        max_drained_fraction=fraction,
        min_drain_budget=floor,
        rate_limits=[RateLimit("drain_node", rate, window)],
        domain_budgets=[DomainBudget("rack", 2)],
        node_labels={f"node-{i}": {"rack": f"r{i % 3}"} for i in range(12)},
        clock=clock,
    )
    budget = gate.drain_budget(12)
    running: dict[str, ActionRecord] = {}
    starts: list[float] = []
    last_finish: dict[str, float] = {}
    for i, (op, n, dt) in enumerate(history):
        node = f"node-{n}"
        if op == "tick":
            clock.now += dt
        elif op == "finish" and node in running:
            record = running.pop(node)
            state.mark_drained(node, "ftd")
            gate.finished(record)
            last_finish[node] = clock.now
        elif op == "resume":
            state.mark_drained(node, "", drained=False)
        elif op == "drain":
            verdict = gate.decide(req(target=node), state)
            if not verdict.allowed:
                continue
            assert node not in running, "allowed a duplicate"
            assert clock.now - last_finish.get(node, -1e9) >= 30, "allowed inside the cooldown"
            running[node] = run(gate, req(target=node), i)
            starts.append(clock.now)
            out = {f"node-{k}" for k in range(12) if state.nodes[f"node-{k}"].drained_by_ftd} | set(running)
            assert len(out) <= budget, "drained more than the budget"
            for rack in ("r0", "r1", "r2"):
                assert sum(1 for x in out if f"r{int(x.split('-')[1]) % 3}" == rack) <= 2, "rack budget"
            assert sum(1 for t in starts if t > clock.now - window) <= rate, "rate limit exceeded"


def test_job_restart_cools_down_per_faulty_node_but_dedupes_per_job() -> None:
    """A second fault on the same bad node is not acted on twice; a fault on another node of the
    (requeued) job is a new reason, however soon; two restarts of one job never run at once."""
    clock = Clock()
    gate = PolicyGate(cooldown_s=600, clock=clock)

    def restart(node: str) -> ActionRequest:
        return ActionRequest(kind="checkpoint_restart", target="1001", reason="x", params={"node": node})

    first = run(gate, restart("node-1"), 1)
    assert gate.decide(restart("node-2")).reason.startswith("duplicate")  # one restart at a time
    gate.finished(first)
    clock.now += 30
    assert gate.decide(restart("node-1")).reason.startswith("cooldown: checkpoint_restart:1001@node-1")
    assert gate.decide(restart("node-2")).allowed
    later = ActionRecord(id="z", request=restart("node-2"), state=ActionState.SUCCEEDED, updated=clock.now)
    restored = PolicyGate(cooldown_s=600, clock=clock)
    restored.restore([later])
    assert not restored.decide(restart("node-2")).allowed and restored.decide(restart("node-3")).allowed


def test_a_move_off_the_node_is_not_held_back_by_an_in_place_restarts_cooldown() -> None:
    """An Xid 13 restarted the job in place on node-3; an Xid 79 there a second later must move the
    job off node-3 (else the node is drained under a job left on a GPU that fell off the bus). The
    same move again, or another in-place restart, still cools down."""
    clock = Clock()
    gate = PolicyGate(cooldown_s=600, clock=clock)

    def restart(exclude: list[str] | None = None) -> ActionRequest:
        params: dict[str, object] = {"node": "node-3"}
        if exclude is not None:
            params["exclude"] = exclude
        return ActionRequest(kind="checkpoint_restart", target="1", reason="x", rule="r", params=params)

    gate.finished(run(gate, restart(), 1))  # the in-place restart
    clock.now += 1
    assert gate.decide(restart()).reason.startswith("cooldown: checkpoint_restart:1@node-3")
    move = gate.decide(restart(["node-3"]))
    assert move.allowed and "moves the job off node-3" in move.reason, move
    gate.finished(run(gate, restart(["node-3"]), 2))
    clock.now += 1
    assert gate.decide(restart(["node-3"])).reason.startswith("cooldown: checkpoint_restart:1@node-3")
    assert gate.decide(restart()).reason.startswith("cooldown")


def test_a_supervisor_swap_off_the_node_is_not_held_back_by_an_in_place_restarts_cooldown() -> None:
    """Issue #24: the job was restarted in place on node-3; its rank supervisor there is killed a
    minute later: the supervisor rule's restart avoiding node-3 (its slot to a spare, no drain) must
    run, else the job's slot stays dead. The same swap again still cools down."""
    clock = Clock()
    gate = PolicyGate(cooldown_s=600, clock=clock)

    def restart(**params: object) -> ActionRequest:
        return ActionRequest(
            kind="checkpoint_restart", target="1", reason="x", rule="r", params={"node": "node-3", **params}
        )

    gate.finished(run(gate, restart(), 1))
    clock.now += 60
    swap = gate.decide(restart(avoid=["node-3"]))
    assert swap.allowed and "moves the job off node-3" in swap.reason, swap
    gate.finished(run(gate, restart(avoid=["node-3"]), 2))
    clock.now += 1
    assert gate.decide(restart(avoid=["node-3"])).reason.startswith("cooldown: checkpoint_restart:1@node-3")
