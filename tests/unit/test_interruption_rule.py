"""The interruption rule (issue #37): one checkpoint_restart per concerned job carrying the deadline,
one action per notice (same ref), and a bogus deadline refused with no job touched."""

from __future__ import annotations

import math

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.events import Event, Interruption, Kind, make_event
from ftd.plugin import ActionKind
from ftd.rules import interruption
from ftd.testing import evaluate_rule, view_with
from tests.properties import examples

T = 1_800_000_000.0


def notice(
    node: str = "n1", *, deadline: float = T + 120, job: str = "", ref: str = "r1", ts: float = T
) -> Event:
    data = msgspec.structs.asdict(
        Interruption(
            source="operator", deadline=deadline, notice_at=ts, job=job, ref=ref, detail="kernel update"
        )
    )
    return make_event(node, Kind.INTERRUPTION, data=data, ts=ts)


def test_every_job_on_the_node_is_saved_and_stopped_with_the_deadline() -> None:
    view = view_with(jobs={"7": ["n1", "n2"], "8": ["n1"], "9": ["n3"]})
    actions = evaluate_rule(interruption, notice(), view)
    restarts = [a for a in actions if a.kind == ActionKind.CHECKPOINT_RESTART]
    assert sorted(a.target for a in restarts) == ["7", "8"]
    for a in restarts:
        assert (
            a.params["deadline"] == T + 120 and a.params["exclude"] == [] and a.params["source"] == "operator"
        )
    assert [a.kind for a in actions].count(ActionKind.NOTIFY) == 1
    assert "kernel update" in actions[-1].reason and "120s" in actions[-1].reason


def test_a_job_interruption_concerns_that_job_only() -> None:
    view = view_with(jobs={"7": ["n1"], "8": ["n1"]})
    actions = evaluate_rule(interruption, notice(job="8"), view)
    assert [(a.kind, a.target) for a in actions] == [
        (ActionKind.CHECKPOINT_RESTART, "8"),
        (ActionKind.NOTIFY, "n1"),
    ]


def test_the_same_notice_seen_twice_is_one_action() -> None:
    view = view_with(jobs={"7": ["n1"]})
    actions = evaluate_rule(interruption, [notice(ts=T), notice(ts=T + 5), notice(ts=T + 6, ref="r2")], view)
    assert [a.target for a in actions if a.kind == ActionKind.CHECKPOINT_RESTART] == [
        "7",
        "7",
    ]  # r1 once, r2 once


@settings(max_examples=examples(100))
@given(
    deadline=st.one_of(
        st.sampled_from([math.nan, math.inf, -math.inf]),
        st.floats(max_value=T, allow_nan=False),
        st.floats(min_value=T + 31 * 86400, allow_infinity=False),
    )
)
def test_a_bogus_deadline_touches_no_job_and_says_why(deadline: float) -> None:
    view = view_with(jobs={"7": ["n1"]})
    actions = evaluate_rule(interruption, notice(deadline=deadline), view)
    assert [a.kind for a in actions] == [ActionKind.NOTIFY]
    assert "refused" in actions[0].reason and actions[0].params["refused"]


def test_a_node_without_jobs_asks_nothing() -> None:
    assert evaluate_rule(interruption, notice(), view_with(nodes=["n1"])) == []
