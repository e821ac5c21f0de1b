"""How the all-reduce figure of a pair test is judged (ftd/fabric/pairs.py), as properties.

For any directions that met their floor and any all-reduce figure: the verdict is ``slow`` exactly
when the figure is below the higher of ``fraction`` x the profile's ``expected_allreduce_gbps`` and
``baseline_fraction`` x the fleet's all-reduce baseline, and then names no sender (a collective has
no direction); with neither, the figure is ``not judged`` and cannot fail the pair; a faster
collective never turns a pass into slow. The fleet's all-reduce baseline is the median of the
completed results' finite positive figures, ``None`` below three. Malformed wire values never crash
and stay finite.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.fabric.pairs import (
    MIN_BASELINE_SAMPLES,
    PairExpectation,
    PairResult,
    fleet_allreduce_baseline,
    judge_pair,
)
from tests.properties import examples

gbps = st.floats(min_value=0.001, max_value=1e4, allow_nan=False)
maybe = st.none() | gbps
fractions = st.floats(min_value=0.05, max_value=1.0)


def _result(collective: float | None, error: str = "") -> PairResult:
    # both directions far above any floor drawn here: only the collective can make the pair slow
    return PairResult(
        a="a", b="b", a_to_b_gbps=1e6, b_to_a_gbps=1e6, rtt_ms=0.05, allreduce_gbps=collective, error=error
    )


@settings(max_examples=examples(500))
@given(gbps, maybe, maybe, fractions, fractions)
def test_slow_exactly_below_the_higher_floor_and_never_naming_a_sender(
    measured: float, expected: float | None, baseline: float | None, fraction: float, base_fraction: float
) -> None:
    spec = PairExpectation(
        expected_gbps=1.0,
        fraction=fraction,
        baseline_fraction=base_fraction,
        expected_allreduce_gbps=expected,
    )
    verdict = judge_pair(_result(measured), spec, None, allreduce_baseline_gbps=baseline)
    floors = [f for f in (expected and expected * fraction, baseline and baseline * base_fraction) if f]
    assert verdict.slow_senders == ()
    if not floors:
        assert verdict.status == "pass"
        assert any("not judged" in r for r in verdict.reasons), verdict.reasons
    elif measured < max(floors):
        assert verdict.status == "slow", (measured, floors, verdict)
        assert any(r.startswith("all-reduce ") and " < " in r for r in verdict.reasons)
    else:
        assert verdict.status == "pass", (measured, floors, verdict)


@settings(max_examples=examples(300))
@given(gbps, gbps, maybe, maybe)
def test_a_faster_collective_never_turns_a_pass_into_slow(
    x: float, y: float, expected: float | None, baseline: float | None
) -> None:
    low, high = sorted((x, y))
    spec = PairExpectation(expected_gbps=1.0, expected_allreduce_gbps=expected)
    slow_low = judge_pair(_result(low), spec, None, allreduce_baseline_gbps=baseline).status == "slow"
    slow_high = judge_pair(_result(high), spec, None, allreduce_baseline_gbps=baseline).status == "slow"
    assert slow_low or not slow_high


@settings(max_examples=examples(300))
@given(gbps, maybe)
def test_an_unknown_profile_judges_the_collective_against_the_baseline_only(
    measured: float, baseline: float | None
) -> None:
    verdict = judge_pair(_result(measured), None, 10.0, allreduce_baseline_gbps=baseline)
    assert verdict.slow_senders == ()
    assert (verdict.status == "slow") == (baseline is not None and measured < 0.5 * baseline), verdict


@settings(max_examples=examples(300))
@given(
    st.lists(
        st.tuples(st.none() | st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["", "x"]))
    )
)
def test_the_fleet_all_reduce_baseline_is_the_median_of_completed_finite_positive_figures(
    rows: list[tuple[float | None, str]],
) -> None:
    results = [_result(value, error) for value, error in rows]
    valid = [v for v, e in rows if not e and v is not None and math.isfinite(v) and v > 0]
    baseline = fleet_allreduce_baseline(results)
    if len(valid) < MIN_BASELINE_SAMPLES:
        assert baseline is None
    else:
        assert baseline == statistics.median(valid)


def test_a_failed_step_is_never_a_pass_whatever_its_figure() -> None:
    failed = _result(50.0, error="all-reduce step: the all-reduce rank exited 3 without a result")
    spec = PairExpectation(expected_gbps=1.0, expected_allreduce_gbps=1.0)
    assert judge_pair(failed, spec, 10.0, allreduce_baseline_gbps=5.0).status == "failed"


@settings(max_examples=examples(300))
@given(
    st.dictionaries(
        st.sampled_from(["a", "b", "a_to_b_gbps", "b_to_a_gbps", "allreduce_gbps", "allreduce_skipped"]),
        st.from_type(object) | st.floats() | st.text(max_size=5),
    )
)
def test_malformed_all_reduce_fields_never_crash_and_stay_finite(data: dict[str, Any]) -> None:
    result = PairResult.from_dict(data)
    assert result.allreduce_gbps is None or math.isfinite(result.allreduce_gbps)
    assert isinstance(result.allreduce_skipped, str)
    spec = PairExpectation(expected_gbps=1.0, expected_allreduce_gbps=2.0)
    judge_pair(result, spec, 10.0, allreduce_baseline_gbps=3.0)
    fleet_allreduce_baseline([result, result, result])
