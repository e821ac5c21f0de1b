"""The decision against an interruption's deadline (issue #37) and the save-time model it reads."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.coordinator.decide.deadline import (
    ASSUMED_P95_S,
    MAX_AHEAD_S,
    ORDER,
    BadDeadline,
    decide_save,
)
from ftd.coordinator.model.save_times import SaveStats, SaveTimes, percentile
from ftd.coordinator.model.state import ClusterState
from ftd.events import Event, Kind, make_event
from tests.properties import examples

NOW = 1_800_000_000.0
durations = st.floats(min_value=0.0, max_value=3600.0, allow_nan=False)
p95s = st.dictionaries(st.sampled_from(["local", "partner", "shared", "default"]), durations)
levels = st.sampled_from([None, "local", "partner", "shared"])
margins = st.floats(min_value=0.0, max_value=60.0)
lefts = st.floats(min_value=0.001, max_value=MAX_AHEAD_S)


@settings(max_examples=examples(300))
@given(p95=p95s, usual=levels, margin=margins, a=lefts, b=lefts)
def test_more_time_never_gives_a_lesser_choice(
    p95: dict[str, float], usual: str | None, margin: float, a: float, b: float
) -> None:
    short, long = sorted((a, b))
    first = decide_save(NOW, NOW + short, p95, usual, margin)
    second = decide_save(NOW, NOW + long, p95, usual, margin)
    assert ORDER.index(second.choice) >= ORDER.index(first.choice)


@settings(max_examples=examples(300))
@given(p95=p95s, usual=levels, margin=margins, left=lefts)
def test_never_a_save_whose_p95_exceeds_the_time_left(
    p95: dict[str, float], usual: str | None, margin: float, left: float
) -> None:
    d = decide_save(NOW, NOW + left, p95, usual, margin)
    if d.choice == "none":
        assert d.level is None and d.save_wait_s == 0.0
        return
    assert d.level is not None and d.p95_s is not None
    expected = p95.get(d.level, ASSUMED_P95_S.get(d.level, ASSUMED_P95_S["default"]))
    assert d.p95_s == expected
    assert d.p95_s + margin <= d.time_left_s
    if d.choice == "fast":
        assert d.level == "local"
    else:
        assert d.level == (usual or "default")


@settings(max_examples=examples(200))
@given(
    deadline=st.one_of(
        st.just(math.nan),
        st.just(math.inf),
        st.just(-math.inf),
        st.floats(max_value=NOW, allow_nan=False),  # past (or now)
        st.floats(min_value=NOW + MAX_AHEAD_S + 1, allow_infinity=False),  # years ahead
    ),
    p95=p95s,
)
def test_bogus_deadlines_are_refused_with_a_reason(deadline: float, p95: dict[str, float]) -> None:
    with pytest.raises(BadDeadline) as err:
        decide_save(NOW, deadline, p95)
    assert err.value.reason
    assert any(w in err.value.reason for w in ("not a finite", "in the past", "ahead"))


def test_full_fast_and_none_on_a_known_model() -> None:
    p95 = {"shared": 40.0, "local": 8.0}
    assert decide_save(NOW, NOW + 50, p95, "shared", 5).choice == "full"
    fast = decide_save(NOW, NOW + 20, p95, "shared", 5)
    assert (fast.choice, fast.level, fast.save_wait_s) == ("fast", "local", 15.0)
    none = decide_save(NOW, NOW + 10, p95, "shared", 5)
    assert none.choice == "none" and "last verified checkpoint" in none.reason


def test_without_a_model_the_assumption_is_used_and_said() -> None:
    d = decide_save(NOW, NOW + 40, {}, None, 5)
    assert (d.choice, d.level, d.assumed, d.p95_s) == ("fast", "local", True, ASSUMED_P95_S["local"])
    assert "assumed" in d.reason


def test_a_negative_margin_is_refused() -> None:
    with pytest.raises(ValueError):
        decide_save(NOW, NOW + 100, {}, None, -1)


def test_percentile_is_an_observed_value() -> None:
    values = [float(i) for i in range(1, 21)]
    assert percentile(values, 50) == 10.0
    assert percentile(values, 95) == 19.0
    assert percentile([3.0], 95) == 3.0


def test_save_times_keeps_the_last_saves_per_job_and_level() -> None:
    times = SaveTimes(keep=3, max_jobs=2)
    for s in (100.0, 1.0, 2.0, 3.0):  # the first is pushed out
        assert times.record("j1", "shared", s)
    assert times.record("j1", None, 7.0)
    stats = times.stats("j1")
    assert stats["shared"].count == 3 and stats["shared"].p95_s == 3.0
    assert times.p95("j1") == {"shared": 3.0, "default": 7.0}
    assert not times.record("j1", "local", math.nan)
    assert not times.record("j1", "local", -1.0)
    assert "local" not in times.stats("j1")
    times.record("j2", "local", 1.0)
    times.record("j1", "local", 1.0)  # j1 saved most recently
    times.record("j3", "local", 1.0)  # j2 forgotten
    assert times.stats("j2") == {} and times.stats("j1") and times.stats("j3")


def test_a_checkpoint_step_counts_once_at_its_slowest_rank() -> None:
    times = SaveTimes(keep=2)
    assert times.record_checkpoint("j", "local", 10, 1.0)
    assert times.record_checkpoint("j", "local", 10, 4.0)  # rank 1 of the same step: slower
    assert times.record_checkpoint("j", "local", 10, 2.0)  # rank 2: the step stays at 4 s
    assert times.stats("j")["local"] == SaveStats(1, 4.0, 4.0)
    assert times.record_checkpoint("j", "local", 20, 3.0)
    assert times.record_checkpoint("j", "local", 30, 5.0)  # step 10 is pushed out (keep=2)
    assert times.stats("j")["local"] == SaveStats(2, 3.0, 5.0)
    for bad in (
        ("", "local", 1, 1.0),
        ("j", "", 1, 1.0),
        ("j", "local", -1, 1.0),
        ("j", "local", 1, math.inf),
    ):
        assert not times.record_checkpoint(*bad)
    assert times.stats("j")["local"].count == 2


def test_verified_tier_checkpoints_build_the_jobs_save_model_before_any_interruption() -> None:
    """Issue #37 item 2: a job's own periodic saves (the tier's checkpoint events) give the deadline
    decision real p95s; rejected or deleted copies and malformed fields are not saves."""
    state = ClusterState()

    def checkpoint(rank: int, step: int, save_s: object, **extra: object) -> Event:
        data = {"job": "77", "rank": rank, "step": step, "level": "local", "ok": True, "save_s": save_s}
        return make_event(
            f"n{rank}", Kind.CHECKPOINT, severity="info", source="checkpoint", data={**data, **extra}
        )

    for event in (
        checkpoint(0, 100, 2.0),
        checkpoint(1, 100, 3.5),
        checkpoint(0, 200, 2.5),
        checkpoint(1, 200, 9.0, ok=False, reason="sha256 mismatch"),
        checkpoint(0, 300, 50.0, deleted=True),
        checkpoint(0, 400, "slow"),
        checkpoint(0, True, 1.0),
    ):
        state.apply_event(event)
    assert state.save_times.stats("77") == {"local": SaveStats(2, 2.5, 3.5)}
    assert state.save_times.p95("77") == {"local": 3.5}
