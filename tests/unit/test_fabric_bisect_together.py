"""A pair slow as a whole, every direction fine (its all-reduce step or its round trip): the bisection.

:func:`ftd.fabric.pairs.judge_pair` names no sender when only a pair's all-reduce (or RTT) is slow;
:class:`ftd.fabric.bisect.Bisection` takes that as ``pair_slow`` and reasons by reproduction: a node
slow together with two partners is pinned, one slow pair not reproduced is dismissed, a pair slow
twice with both ends fine elsewhere is a bad link. Property tests drive it with a fault model (one
node whose collective is slow with anyone) and with arbitrary outcomes (the planner never crashes,
its waves stay disjoint and within budget); the coordinator's bisection (upkeep/fabric_tests.py) is
driven through an operator catalog that gives the profile an ``expected_allreduce_gbps``.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.config.schema import HardwareConfig
from ftd.coordinator.model.state import ClusterState
from ftd.coordinator.upkeep.fabric_tests import FabricTests
from ftd.events import Kind, NodeStatus, Severity, make_event
from ftd.fabric.bisect import Bisection
from ftd.fabric.pairs import PairExpectation, PairResult, judge_pair
from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState
from tests.properties import examples

ids = itertools.count()


def _drive(bisection: Bisection, bad: str) -> None:
    """Every test with ``bad`` in it is slow as a pair; every direction is fine."""
    while wave := bisection.next_wave():
        busy = [n for pair in wave for n in pair]
        assert len(busy) == len(set(busy)), "a wave's pairs must be disjoint"
        for a, b in wave:
            bisection.record(a, b, [], pair_slow=bad in (a, b))


@settings(max_examples=examples(300))
@given(st.integers(3, 24), st.data())
def test_a_node_whose_collective_is_slow_with_anyone_is_pinned_and_no_other(
    n: int, data: st.DataObject
) -> None:
    nodes = [f"n{i:02d}" for i in range(n)]
    bad = data.draw(st.sampled_from(nodes))
    bisection = Bisection(data.draw(st.permutations(nodes)), budget=(n + 1) // 2 + 3)
    _drive(bisection, bad)
    finding = bisection.finding()
    assert finding.bad_nodes == (bad,) and finding.confirmed, finding
    assert not finding.unresolved and not finding.bad_links and not finding.untested
    assert any(r.startswith(f"{bad}: slow as a pair") for r in finding.reasons)


@settings(max_examples=examples(200))
@given(st.integers(3, 16), st.data())
def test_a_slow_pairs_ends_are_suspects_first_and_the_slow_one_is_pinned(n: int, data: st.DataObject) -> None:
    nodes = [f"n{i:02d}" for i in range(n)]
    a, b = data.draw(st.permutations(nodes))[:2]
    bad = data.draw(st.sampled_from([a, b]))
    bisection = Bisection(nodes, suspects=[a, b], budget=n // 2 + 3)
    first = bisection.next_wave()
    assert {a, b} <= {x for pair in first for x in pair}, "the suspects are tested in the first wave"
    for x, y in first:
        bisection.record(x, y, [], pair_slow=bad in (x, y))
    _drive(bisection, bad)
    finding = bisection.finding()
    assert finding.bad_nodes == (bad,) and finding.confirmed, finding


@settings(max_examples=examples(300))
@given(st.integers(2, 12), st.data())
def test_any_outcomes_never_crash_the_planner_and_every_wave_is_disjoint_and_within_budget(
    n: int, data: st.DataObject
) -> None:
    nodes = [f"n{i:02d}" for i in range(n)]
    budget = data.draw(st.integers(1, n + 4))
    suspects = data.draw(st.lists(st.sampled_from(nodes), max_size=3))
    bisection = Bisection(nodes, suspects=suspects, budget=budget)
    while wave := bisection.next_wave():
        busy = [x for pair in wave for x in pair]
        assert len(busy) == len(set(busy)) and set(busy) <= set(nodes)
        for a, b in wave:
            senders = data.draw(st.lists(st.sampled_from([a, b]), max_size=2, unique=True))
            failed = data.draw(st.booleans())
            bisection.record(a, b, senders, failed=failed, pair_slow=data.draw(st.booleans()))
    finding = bisection.finding()
    assert finding.tests == bisection.tests <= budget
    named = {*finding.bad_nodes, *finding.unresolved, *finding.untested}
    named |= {x for link in finding.bad_links for x in link}
    assert named <= set(nodes)
    assert finding.as_dict()["tests"] == finding.tests


def test_one_slow_pair_not_reproduced_is_dismissed_and_a_pair_slow_twice_is_the_link() -> None:
    hiccup = Bisection(["a", "b", "c", "d"])
    hiccup.record("a", "b", [], pair_slow=True)  # once: both ends unresolved, tested elsewhere next
    assert set(hiccup.finding().unresolved) == {"a", "b"} and not hiccup.finding().clean
    while wave := hiccup.next_wave():
        assert ("a", "b") not in wave and ("b", "a") not in wave
        for x, y in wave:
            hiccup.record(x, y, [])
    finding = hiccup.finding()
    assert finding.clean and not finding.bad_nodes, finding
    assert any("slow as a pair once" in r and "dismissed" in r for r in finding.reasons)

    link = Bisection(["a", "b", "c", "d"])
    link.record("a", "b", [], pair_slow=True)
    link.record("a", "c", [])
    link.record("b", "d", [])
    link.record("a", "b", [], pair_slow=True)
    finding = link.finding()
    assert finding.bad_links == (("a", "b"),) and not finding.bad_nodes, finding


def test_a_slow_direction_is_reasoned_as_before_not_as_a_pair() -> None:
    """A test with a slow sender is the directional case even when the caller says pair_slow."""
    bisection = Bisection(["a", "b", "c"])
    bisection.record("a", "b", ["a"], pair_slow=True)
    bisection.record("a", "c", ["a"])
    finding = bisection.finding()
    assert finding.bad_nodes == ("a",) and finding.confirmed
    assert all("as a pair" not in r for r in finding.reasons), finding.reasons


def test_judge_pair_names_no_sender_for_an_all_reduce_only_slowness() -> None:
    result = PairResult(a="a", b="b", a_to_b_gbps=20.0, b_to_a_gbps=20.0, rtt_ms=0.1, allreduce_gbps=0.5)
    verdict = judge_pair(result, PairExpectation(expected_gbps=10.0, expected_allreduce_gbps=4.0), None)
    assert verdict.status == "slow" and verdict.slow_senders == ()
    assert any(r.startswith("all-reduce 0.5 Gbit/s <") for r in verdict.reasons)


class CollectiveAgents:
    """Pair tests as the agents would answer them: every direction at 20 Gbit/s, the all-reduce at
    5 Gbit/s, except with ``slow`` in the pair (0.2 Gbit/s)."""

    def __init__(self, slow: str) -> None:
        self.slow = slow
        self.tests: list[tuple[str, str]] = []

    async def submit(self, request: ActionRequest) -> ActionRecord:
        a, b = request.target, str(request.params["peer"])
        self.tests.append((a, b))
        result = PairResult(
            a=a,
            b=b,
            a_to_b_gbps=20.0,
            b_to_a_gbps=21.0,
            rtt_ms=0.1,
            allreduce_gbps=0.2 if self.slow in (a, b) else 5.0,
        )
        record = ActionRecord(id=f"c{next(ids)}", request=request, state=ActionState.SUCCEEDED)
        record.detail["result"] = result.as_dict()
        return record


def _state(n: int) -> ClusterState:
    state = ClusterState()
    for i in range(n):
        state.apply_status(NodeStatus(node=f"n{i:02d}", state="online", ts=1.0, addresses=[f"10.0.0.{i}"]))
    return state


def _hardware(tmp_path: Path, gbps: float | None) -> HardwareConfig:
    if gbps is None:
        return HardwareConfig(profile="h200-sxm")
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(f"[pair.h200-sxm]\nexpected_allreduce_gbps = {gbps}\n")
    return HardwareConfig(profile="h200-sxm", catalog=str(catalog))


def test_the_coordinators_bisection_pins_the_node_with_the_slow_collective(tmp_path: Path) -> None:
    # against the operator's expected_allreduce_gbps, and (no key) against the fleet's all-reduce
    # baseline, which this bisection's own results feed
    for gbps in (4.0, None):
        agents = CollectiveAgents(slow="n05")
        tests = FabricTests(agents.submit, _state(8), hardware=_hardware(tmp_path, gbps), deadline_s=5.0)
        last = asyncio.run(tests.bisect())
        assert last["bad_nodes"] == ["n05"] and last["confirmed"], last
        slow = [t for t in last["pair_tests"] if t["status"] == "slow"]
        assert slow and all("n05" in (t["a"], t["b"]) for t in slow)
        assert all(t["slow_senders"] == [] for t in slow), "a slow collective names no sender"


def test_a_pair_test_slow_only_in_its_all_reduce_starts_a_bisection_with_both_ends(tmp_path: Path) -> None:
    async def main() -> tuple[dict[str, Any] | None, list[tuple[str, str]]]:
        agents = CollectiveAgents(slow="n03")
        tests = FabricTests(
            agents.submit,
            _state(6),
            hardware=_hardware(tmp_path, 4.0),
            auto=True,
            cooldown_s=600.0,
        )
        slow = PairResult(
            a="n02", b="n03", a_to_b_gbps=24.0, b_to_a_gbps=24.0, rtt_ms=0.1, allreduce_gbps=0.2
        ).as_dict()
        tests.observe("event", make_event("n02", Kind.PAIR_TEST, severity=Severity.INFO, data=slow))
        await tests.settle()
        return tests.last, agents.tests

    last, tested = asyncio.run(main())
    assert last is not None and last["suspects"] == ["n02", "n03"], last
    assert last["bad_nodes"] == ["n03"] and last["confirmed"], last
    assert set(tested[0]) == {"n02", "n03"}, "both ends are tested first (no node is proven yet)"
