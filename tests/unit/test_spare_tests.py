"""The spare's pair tests against the job's nodes (issue #35): whom it is tested against, what makes
it unfit, what the agents count as training. The end-to-end test on real Slurm and agents is
tests/e2e/test_spare_pair_test.py; here the decision, with the pair test's answers scripted."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ftd.agent.pair_tests.service import NO_RANKS, training, training_jobs
from ftd.coordinator.actions.spare_tests import SpareTests, neighbours
from ftd.events import SupervisorInfo
from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState

SLOTS = ["n1", "s1", "n3", "n4"]


def record(slots: list[str] = SLOTS, swapped: dict[str, str] | None = None) -> ActionRecord:
    rec = ActionRecord(
        id="a1",
        request=ActionRequest(kind="checkpoint_restart", target="job-7", reason="xid 79 on n2", rule="xid"),
        state=ActionState.RUNNING,
    )
    rec.detail.update({"path": "spare", "slots": slots, "swapped": swapped or {"n2": "s1"}})
    return rec


class Scripted:
    """PairTest.measure answering from a script: (node, peer) -> list of outcomes, in turn."""

    def __init__(self, script: dict[tuple[str, str], list[dict[str, Any]]]) -> None:
        self.script = script
        self.asked: list[tuple[str, str, str | None]] = []

    async def measure(
        self, record: ActionRecord, node: str, peer: str, *, suffix: str | None = None, allreduce: bool = True
    ) -> Any:
        self.asked.append((node, peer, suffix))
        answers = self.script[(node, peer)]
        return dict(answers.pop(0) if len(answers) > 1 else answers[0])


def passed(peer: str) -> dict[str, Any]:
    return {"status": "pass", "why": "ok", "slow_senders": [], "result": {"b": peer, "error": ""}}


def run(tests: SpareTests, rec: ActionRecord) -> dict[str, str]:
    return asyncio.run(tests.unfit(rec))


def test_a_spare_is_tested_against_the_slots_after_and_before_its_own() -> None:
    pair = Scripted({("s1", "n3"): [passed("n3")], ("s1", "n1"): [passed("n1")]})
    rec = record()
    assert run(SpareTests(pair, peers=2), rec) == {}  # type: ignore[arg-type]
    assert [(n, p) for n, p, _ in pair.asked] == [("s1", "n3"), ("s1", "n1")]
    assert rec.detail["spare_tests"]["s1"]["fit"] is True
    # tested once per action: a resumed restart asks nothing again
    assert run(SpareTests(pair, peers=2), rec) == {}  # type: ignore[arg-type]
    assert len(pair.asked) == 2


def test_slow_on_the_spares_side_or_not_completed_makes_it_unfit_and_stops_there() -> None:
    slow = {"status": "slow", "why": "s1 -> n3: 0.1 Gbit/s < 8", "slow_senders": ["s1"], "result": {}}
    pair = Scripted({("s1", "n3"): [slow], ("s1", "n1"): [passed("n1")]})
    got = run(SpareTests(pair), record())  # type: ignore[arg-type]
    assert got == {"s1": "pair test with n3 slow: s1 -> n3: 0.1 Gbit/s < 8"}
    assert [p for _, p, _ in pair.asked] == ["n3"]
    unanswered = {"status": "failed", "answered": False, "why": "no answer from s1's agent within 20 s"}
    got = run(SpareTests(Scripted({("s1", "n3"): [unanswered]})), record())  # type: ignore[arg-type]
    assert got == {"s1": "pair test with n3 failed: no answer from s1's agent within 20 s"}


def test_the_other_ends_slowness_or_an_unjudged_test_does_not_hold_the_spare_back_and_is_said() -> None:
    peer_slow = {"status": "slow", "why": "n3 -> s1 slow", "slow_senders": ["n3"], "result": {}}
    unjudged = {"status": "skipped", "why": "nothing to judge against", "slow_senders": [], "result": {}}
    pair = Scripted({("s1", "n3"): [peer_slow], ("s1", "n1"): [unjudged]})
    rec = record()
    assert run(SpareTests(pair), rec) == {}  # type: ignore[arg-type]
    why = rec.detail["spare_tests"]["s1"]["why"]
    assert "n3's own egress was the slow side" in why and "with n1: not judged" in why


def test_a_peer_still_training_is_asked_again_then_the_spare_counts_as_untested() -> None:
    busy = {"status": "failed", "why": "x", "result": {"error": "refused: n3: training (job job-7)"}}
    pair = Scripted({("s1", "n3"): [busy, passed("n3")], ("s1", "n1"): [passed("n1")]})
    tests = SpareTests(pair, busy_wait_s=5.0)  # type: ignore[arg-type]
    tests.retry_s = 0.01
    rec = record()
    assert run(tests, rec) == {}
    assert rec.detail["spare_tests"]["s1"]["results"][0]["attempts"] == 2
    assert len({suffix for _, _, suffix in pair.asked}) == 3, "each attempt its own directive id"
    always = Scripted({("s1", "n3"): [busy]})
    tests = SpareTests(always, busy_wait_s=0.05)  # type: ignore[arg-type]
    tests.retry_s = 0.01
    got = run(tests, record())
    assert "pair test with n3 failed" in got["s1"]


def test_a_one_slot_job_has_nobody_to_test_against() -> None:
    pair = Scripted({})
    rec = record(["s1"], {"n1": "s1"})
    assert run(SpareTests(pair), rec) == {}  # type: ignore[arg-type]
    assert rec.detail["spare_tests"]["s1"]["why"] == "no other slot node to test against" and not pair.asked


@given(
    st.lists(st.sampled_from([f"n{i}" for i in range(8)]), min_size=1, max_size=8, unique=True),
    st.data(),
    st.integers(min_value=1, max_value=5),
)
def test_neighbours_are_other_slot_nodes_never_avoided_nearest_first(
    slots: list[str], data: st.DataObject, count: int
) -> None:
    index = data.draw(st.integers(min_value=0, max_value=len(slots) - 1))
    avoid = set(data.draw(st.lists(st.sampled_from(slots), max_size=3)))
    got = neighbours(slots, index, avoid, count)
    assert len(got) == len(set(got)) <= count
    assert all(n in slots and n not in avoid and n != slots[index] for n in got)
    allowed = [n for n in slots if n not in avoid and n != slots[index]]
    assert len(got) == min(count, len(allowed))
    if got and len(slots) > 1 and slots[(index + 1) % len(slots)] in allowed:
        assert got[0] == slots[(index + 1) % len(slots)]


def test_training_is_ranks_or_a_scheduler_job_whose_supervisor_here_runs_ranks() -> None:
    def sup(state: str, role: str = "active") -> SupervisorInfo:
        return SupervisorInfo(role=role, state=state)  # type: ignore[arg-type]

    assert training_jobs({}, {"7": 1}) == ["7"], "no supervisor here: what runs is not known"
    for state in ("idle", "stopped", "exited", "failed"):
        assert state in NO_RANKS
        assert training_jobs({}, {"7": 1}, {"7": sup(state)}) == []
    for state in ("starting", "running", "lost"):
        assert training_jobs({}, {"7": 1}, {"7": sup(state)}) == ["7"], state
    assert training_jobs({"7": []}, {"7": 1}, {"7": sup("idle", "spare")}) == ["7"], "a registered rank"
    assert training_jobs({}, {"7": 1, "8": 1}, {"7": sup("idle", "spare")}) == ["8"]
    busy = training(lambda: {}, lambda: {"7": 1}, lambda: {"7": sup("running")})
    assert busy() == "training (job 7)"
    assert training(lambda: {}, lambda: {"7": 1}, lambda: {"7": sup("stopped")})() is None
