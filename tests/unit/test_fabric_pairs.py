"""Pair-test judgement (ftd/fabric/pairs.py) and the bisection that pins a degraded node (bisect.py).

Pure: generated fleets with one degraded node (its egress, its ingress, or both) and clean fleets;
outcomes come from the fault model the planner assumes, so the properties say the planner finds what
the tests can show, in the number of tests the issue allows, and invents nothing on a clean fleet.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.catalog.hardware_profiles import load_hardware_catalog
from ftd.fabric.bisect import Bisection
from ftd.fabric.pairs import PairExpectation, PairResult, expectation, fleet_baseline, judge_pair
from tests.properties import examples

SPEC = PairExpectation(expected_gbps=100.0, fraction=0.8, baseline_fraction=0.5)


def _result(ab: float | None, ba: float | None, **kw: Any) -> PairResult:
    return PairResult(a="n1", b="n2", a_to_b_gbps=ab, b_to_a_gbps=ba, rtt_ms=0.1, **kw)


def test_a_pair_at_spec_passes_and_a_slow_direction_names_its_sender() -> None:
    assert judge_pair(_result(95.0, 90.0), SPEC, None).status == "pass"
    slow = judge_pair(_result(95.0, 20.0), SPEC, None)
    assert slow.status == "slow" and slow.slow_senders == ("n2",)
    assert "0.8 x spec 100" in slow.reasons[0]


def test_a_direction_held_back_by_the_other_sides_slow_egress_is_not_blamed() -> None:
    # measured in namespaces: 20 Mbit/s tbf on n2's egress; its ingress slowed by its own ACKs
    verdict = judge_pair(
        _result(1.75, 0.0191), PairExpectation(expected_gbps=None, baseline_fraction=0.2), 9.2
    )
    assert verdict.slow_senders == ("n2",) and "held back by n2's slow egress" in verdict.reasons[-1]
    both = judge_pair(_result(1.0, 0.5), SPEC, None)
    assert both.slow_senders == ("n1", "n2"), "two sides degraded alike are both slow"


def test_the_fleet_baseline_catches_a_pair_slower_than_its_peers_below_spec() -> None:
    peers = [_result(40.0, 41.0), _result(39.0, 40.0)]
    baseline = fleet_baseline(peers)
    assert baseline == pytest.approx(40.0)
    no_spec = PairExpectation(expected_gbps=None)
    assert judge_pair(_result(38.0, 39.0), no_spec, baseline).status == "pass"
    assert judge_pair(_result(38.0, 10.0), no_spec, baseline).slow_senders == ("n2",)


def test_an_unknown_profile_is_judged_against_the_baseline_only_or_skipped_with_its_reason() -> None:
    skipped = judge_pair(_result(1.0, 1.0), None, None, profile="mystery")
    assert skipped.status == "skipped"
    assert any("mystery" in r for r in skipped.reasons) and any(
        "nothing to judge" in r for r in skipped.reasons
    )
    judged = judge_pair(_result(1.0, 0.1), None, 1.0, profile="mystery")
    assert judged.status == "slow" and any("baseline only" in r for r in judged.reasons)


def test_a_test_that_did_not_complete_or_a_direction_not_measured_is_never_a_pass() -> None:
    assert judge_pair(_result(None, None, error="refused: node is training"), SPEC, 50.0).status == "failed"
    assert judge_pair(_result(95.0, None), SPEC, 50.0).status == "failed"


def test_the_packaged_pair_section_gives_each_profile_an_expectation_and_an_unknown_one_none() -> None:
    catalog = load_hardware_catalog()
    for profile in catalog.profiles:
        expect = expectation(catalog.section("pair", profile))
        assert expect is not None and expect.expected_gbps is not None and 0 < expect.fraction <= 1
    assert expectation(catalog.section("pair", "no-such-profile")) is None


@settings(max_examples=examples(300))
@given(
    st.dictionaries(
        st.sampled_from(["a", "b", "a_to_b_gbps", "rtt_ms", "bytes_moved", "error"]),
        st.from_type(object) | st.floats(),
    )
)
def test_a_malformed_result_never_crashes_and_numbers_stay_finite(data: dict[str, Any]) -> None:
    result = PairResult.from_dict(data)
    for value in (result.a_to_b_gbps, result.b_to_a_gbps, result.rtt_ms):
        assert value is None or math.isfinite(value)
    judge_pair(result, SPEC, 10.0)


def _run(nodes: list[str], slow_egress: set[str], slow_ingress: set[str], bisection: Bisection) -> None:
    """Drive ``bisection`` with outcomes from the fault model (egress or ingress of a node slow)."""
    while wave := bisection.next_wave():
        busy = [n for pair in wave for n in pair]
        assert len(busy) == len(set(busy)), "a wave's pairs must be disjoint"
        for a, b in wave:
            slow = [s for s, r in ((a, b), (b, a)) if s in slow_egress or r in slow_ingress]
            bisection.record(a, b, slow)


@settings(max_examples=examples(300))
@given(st.integers(2, 32), st.data())
def test_one_egress_degraded_node_is_named_in_half_the_fleet_of_tests(n: int, data: st.DataObject) -> None:
    nodes = [f"n{i:02d}" for i in range(n)]
    bad = data.draw(st.sampled_from(nodes))
    budget = (n + 1) // 2
    bisection = Bisection(data.draw(st.permutations(nodes)), budget=budget)
    _run(nodes, {bad}, set(), bisection)
    finding = bisection.finding()
    assert finding.bad_nodes == (bad,) and finding.tests <= budget and not finding.untested


@settings(max_examples=examples(300))
@given(st.integers(3, 32), st.data())
def test_with_budget_to_spare_the_degraded_node_is_confirmed_whichever_way_it_is_slow(
    n: int, data: st.DataObject
) -> None:
    nodes = [f"n{i:02d}" for i in range(n)]
    bad = data.draw(st.sampled_from(nodes))
    way = data.draw(st.sampled_from(["egress", "ingress", "both"]))
    bisection = Bisection(nodes, budget=(n + 1) // 2 + 3)
    _run(nodes, {bad} if way != "ingress" else set(), {bad} if way != "egress" else set(), bisection)
    finding = bisection.finding()
    assert finding.bad_nodes == (bad,) and finding.confirmed, finding


@settings(max_examples=examples(200))
@given(st.integers(2, 32), st.data())
def test_a_clean_fleet_gives_no_finding(n: int, data: st.DataObject) -> None:
    nodes = [f"n{i:02d}" for i in range(n)]
    suspects = data.draw(st.lists(st.sampled_from(nodes), max_size=3))
    bisection = Bisection(nodes, suspects=suspects)
    _run(nodes, set(), set(), bisection)
    finding = bisection.finding()
    assert finding.clean and finding.confirmed and not finding.untested


def test_a_suspect_is_tested_first_against_a_known_good_node_confirmed_once_and_then_nothing_more() -> None:
    nodes = [f"n{i}" for i in range(16)]
    bisection = Bisection(nodes, suspects=["n7"], known_good=["n0", "n1"])
    assert bisection.next_wave() == [("n7", "n0")]
    bisection.record("n7", "n0", ["n7"])
    assert bisection.finding().bad_nodes == ("n7",) and not bisection.finding().confirmed
    assert bisection.next_wave() == [("n7", "n1")], "one slow direction is confirmed before it is pinned"
    bisection.record("n7", "n1", ["n7"])
    finding = bisection.finding()
    assert finding.bad_nodes == ("n7",) and finding.confirmed and finding.tests == 2
    assert bisection.next_wave() == []


def test_one_slow_direction_not_reproduced_is_dismissed_not_blamed() -> None:
    bisection = Bisection(["a", "b", "c", "d"])
    assert bisection.next_wave() == [("a", "b"), ("c", "d")]
    bisection.record("a", "b", ["a"])  # a hiccup
    bisection.record("c", "d", [])
    while wave := bisection.next_wave():
        for x, y in wave:
            bisection.record(x, y, [])
    finding = bisection.finding()
    assert finding.clean and finding.confirmed, finding
    assert any("not reproduced" in r for r in finding.reasons)


def test_a_slow_link_between_two_good_nodes_is_named_as_the_link_when_it_repeats() -> None:
    bisection = Bisection(["a", "b", "c", "d"], known_good=["a", "b"])
    bisection.record("a", "b", ["a", "b"])
    finding = bisection.finding()
    assert finding.bad_links == (("a", "b"),) and not finding.bad_nodes


def test_a_failed_test_proves_nothing() -> None:
    bisection = Bisection(["a", "b"], budget=1)
    bisection.record("a", "b", [], failed=True)
    finding = bisection.finding()
    assert finding.untested == ("a", "b") and not finding.bad_nodes and bisection.next_wave() == []
