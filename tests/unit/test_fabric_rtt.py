"""Round trips judged against the fleet's RTT baseline (ftd/fabric/pairs.py, the coordinator's book).

A profile with no ``max_rtt_ms`` (or no profile) used to leave every round trip unjudged; the fleet's
own median round trip now judges it, as the bandwidth baseline judges throughput: a probe or a test
whose RTT is above ``rtt_baseline_factor`` x the median (and above the 1 ms floor) is slow, as a pair.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.coordinator.model.pairs import PairBook
from ftd.events import Kind, Severity, make_event
from ftd.fabric.pairs import (
    DEFAULT_RTT_BASELINE_FACTOR,
    RTT_BASELINE_FLOOR_MS,
    PairExpectation,
    PairResult,
    expectation,
    fleet_rtt_baseline,
    judge_pair,
    rtt_limit,
)
from tests.properties import examples

NO_SPEC = PairExpectation(expected_gbps=None, baseline_fraction=0.2)


def _probe(rtt: float | None, a: str = "n1", b: str = "n2", error: str = "") -> PairResult:
    return PairResult(a=a, b=b, rtt_ms=rtt, error=error)


def _test(rtt: float, a: str = "n1", b: str = "n2") -> PairResult:
    return PairResult(a=a, b=b, a_to_b_gbps=20.0, b_to_a_gbps=21.0, rtt_ms=rtt, bytes_moved=1 << 20)


def test_the_rtt_baseline_is_the_median_of_completed_probes_and_tests_and_none_below_three() -> None:
    assert fleet_rtt_baseline([_probe(0.1), _test(0.3)]) is None
    assert fleet_rtt_baseline([_probe(0.1), _test(0.3), _probe(0.2)]) == pytest.approx(0.2)
    unusable = [_probe(None), _probe(0.0), _probe(-1.0), _probe(math.inf), _probe(5.0, error="refused")]
    assert fleet_rtt_baseline([*unusable, _probe(0.1), _probe(0.2)]) is None
    assert fleet_rtt_baseline([*unusable, _probe(0.1), _probe(0.2), _test(0.4)]) == pytest.approx(0.2)


def test_the_limit_is_the_lower_of_max_rtt_ms_and_the_baselines_with_its_floor() -> None:
    assert rtt_limit(None, None) is None and rtt_limit(NO_SPEC, None) is None
    limit = rtt_limit(None, 0.5)
    assert limit is not None and limit[0] == pytest.approx(DEFAULT_RTT_BASELINE_FACTOR * 0.5)
    assert "fleet RTT baseline 0.5 ms" in limit[1]
    floored = rtt_limit(None, 0.01)
    assert floored is not None and floored[0] == RTT_BASELINE_FLOOR_MS
    profile = PairExpectation(expected_gbps=100.0, max_rtt_ms=2.0)
    assert rtt_limit(profile, None) == (2.0, "max_rtt_ms 2")
    both = rtt_limit(profile, 0.5)  # 10 x 0.5 = 5 ms is looser than the profile's 2
    assert both is not None and both[0] == 2.0
    tight = rtt_limit(PairExpectation(expected_gbps=100.0, max_rtt_ms=50.0, rtt_baseline_factor=3.0), 1.0)
    assert tight is not None and tight[0] == pytest.approx(3.0) and "3 x fleet RTT baseline" in tight[1]


def test_an_unknown_profile_judges_a_probe_and_a_tests_round_trip_against_the_baseline() -> None:
    assert judge_pair(_probe(12.0), None, None).status == "pass", "no limit and no baseline: not judged"
    assert "not judged" in judge_pair(_probe(12.0), None, None).reasons[0]
    slow = judge_pair(_probe(12.0), None, None, rtt_baseline_ms=0.07)
    assert slow.status == "slow" and slow.slow_senders == () and "12 ms > 1 ms" in slow.reasons[0]
    assert judge_pair(_probe(0.5), None, None, rtt_baseline_ms=0.07).status == "pass"
    test = judge_pair(_test(12.0), NO_SPEC, 20.0, rtt_baseline_ms=0.07)
    assert test.status == "slow" and test.slow_senders == (), "a round trip crosses both sides: names neither"
    assert any(r.startswith("rtt 12 ms > 1 ms") for r in test.reasons)
    assert judge_pair(_test(0.1), NO_SPEC, 20.0, rtt_baseline_ms=0.07).status == "pass"
    # no bandwidth reference yet: the bandwidth is unjudged, but a slow round trip is still slow
    unjudged = judge_pair(_test(12.0), NO_SPEC, None, rtt_baseline_ms=0.07)
    assert unjudged.status == "slow" and unjudged.slow_senders == ()
    assert any("nothing to judge against" in r for r in unjudged.reasons)
    assert judge_pair(_test(0.1), NO_SPEC, None, rtt_baseline_ms=0.07).status == "skipped", "never a pass"


def test_a_profiles_rtt_baseline_factor_is_read_and_nonsense_falls_back() -> None:
    section = {"expected_gbps": 100.0, "rtt_baseline_factor": 4}
    got = expectation(section)
    assert got is not None and got.rtt_baseline_factor == 4.0
    for bad in (0.5, 1.0, -3, "ten", True, math.nan):
        fallback = expectation({"expected_gbps": 100.0, "rtt_baseline_factor": bad})
        assert fallback is not None and fallback.rtt_baseline_factor == DEFAULT_RTT_BASELINE_FACTOR, bad


@settings(max_examples=examples(300))
@given(
    rtt=st.floats(min_value=1e-4, max_value=1e4),
    baseline=st.none() | st.floats(min_value=1e-4, max_value=1e3),
    max_rtt=st.none() | st.floats(min_value=1e-3, max_value=1e3),
    factor=st.floats(min_value=1.01, max_value=100.0),
    probe=st.booleans(),
)
def test_a_round_trip_is_slow_exactly_above_the_lower_limit_and_never_names_a_side(
    rtt: float, baseline: float | None, max_rtt: float | None, factor: float, probe: bool
) -> None:
    expect = PairExpectation(expected_gbps=None, max_rtt_ms=max_rtt, rtt_baseline_factor=factor)
    limits = [] if max_rtt is None else [max_rtt]
    if baseline is not None:
        limits.append(max(factor * baseline, RTT_BASELINE_FLOOR_MS))
    result = _probe(rtt) if probe else _test(rtt)
    verdict = judge_pair(result, expect, 20.0, rtt_baseline_ms=baseline)
    assert verdict.slow_senders == ()
    assert (verdict.status == "slow") == (bool(limits) and rtt > min(limits))


def _fold(book: PairBook, result: PairResult) -> None:
    book.note(make_event(result.a, Kind.PAIR_TEST, severity=Severity.INFO, source="t", data=result.as_dict()))


def test_the_book_keeps_probes_and_tests_round_trips_and_its_matrix_judges_them() -> None:
    book = PairBook()
    for a, b in (("n1", "n2"), ("n3", "n4"), ("n5", "n6")):
        _fold(book, _probe(0.08, a, b))
    _fold(book, _test(0.06, "n2", "n3"))
    _fold(book, _probe(9.7, "n6", "n1"))  # a node whose egress queue is full: measured 10-13 ms
    _fold(book, _probe(None, "n4", "n5", error="timed out after 2 s"))
    assert len(book.round_trips) == 5 and book.rtt_baseline() == pytest.approx(0.08)
    matrix = book.matrix(None, None, now=0.0)
    assert matrix["rtt_baseline_ms"] == pytest.approx(0.08) and matrix["rtt_limit_ms"] == 1.0
    assert "fleet RTT baseline" in matrix["rtt_limit"]
    probes = {(p["from"], p["to"]): p["status"] for p in matrix["probes"]}
    assert probes[("n6", "n1")] == "slow" and probes[("n1", "n2")] == "pass"
    assert book.probes[("n6", "n1")].result.rtt_ms == 9.7 and len(book.recent) == 1, "probes stay apart"
    cells = {(c["from"], c["to"]): c["status"] for c in matrix["cells"]}
    # one bandwidth result is no fleet: skipped, its round trip within the limit; a probe that did
    # not answer is a failed pair (never a pass), and no round trip
    assert cells[("n2", "n3")] == cells[("n3", "n2")] == "skipped"
    assert cells[("n4", "n5")] == cells[("n5", "n4")] == "failed"
    quiet = PairBook().matrix(None, None, now=0.0)
    assert quiet["rtt_baseline_ms"] is None and quiet["rtt_limit_ms"] is None and quiet["rtt_limit"] == ""
