"""The in-allocation path choice (:func:`ftd.coordinator.actions.in_allocation.choose`), by property:
every bad slot gets a distinct eligible spare or the path is the scheduler requeue, a spare that is not
eligible is never chosen, good slots keep their node, and the generation is the one asked for. The
supervisor rule's decisions are here too."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.coordinator.actions.in_allocation import choose, next_generation
from ftd.events import SupervisorInfo, make_event
from ftd.rules import supervisor as supervisor_rule
from ftd.testing import evaluate_rule, view_with
from tests.properties import examples

NODES = [f"n{i}" for i in range(8)]


def eligible(info: SupervisorInfo, *, allow_unchecked: bool) -> bool:
    """The contract's eligible spare, written apart from the code under test (its node's health is
    the ``unfit`` map): role spare, idle, a passing preflight (or none, only when allowed)."""
    checked = info.preflight == "ok" or (allow_unchecked and info.preflight is None)
    return info.role == "spare" and info.state == "idle" and checked


spare_info = st.builds(
    SupervisorInfo,
    role=st.sampled_from(["spare", "out", "active"]),
    state=st.sampled_from(["idle", "running", "failed", "lost", "stopped"]),
    preflight=st.sampled_from(["ok", "failed", None]),
    generation=st.integers(0, 5),
)


@st.composite
def pictures(draw: st.DrawFn) -> tuple[list[str | None], dict[str, SupervisorInfo], dict[str, str], bool]:
    size = draw(st.integers(1, 4))
    nodes = draw(st.permutations(NODES))
    slots: list[str | None] = [draw(st.sampled_from([nodes[i], None])) for i in range(size)]
    supervisors = {
        n: SupervisorInfo(role="active", slot=i, state="running") for i, n in enumerate(slots) if n
    }
    for node in nodes[size:]:
        if draw(st.booleans()):
            supervisors[node] = draw(spare_info)
    unfit = {n: "bad" for n in draw(st.sets(st.sampled_from(NODES), max_size=4))}
    return slots, supervisors, unfit, draw(st.booleans())


@settings(max_examples=examples(400), deadline=None)
@given(pictures())
def test_every_bad_slot_gets_a_distinct_eligible_spare_or_the_job_is_requeued(
    picture: tuple[list[str | None], dict[str, SupervisorInfo], dict[str, str], bool],
) -> None:
    slots, supervisors, unfit, unchecked = picture
    choice = choose(slots, supervisors, unfit, generation=7, allow_unchecked=unchecked)
    bad = [i for i, n in enumerate(slots) if n is None or n in unfit]
    usable = {
        n
        for n, s in supervisors.items()
        if n not in unfit and n not in slots and eligible(s, allow_unchecked=unchecked)
    }
    if choice.path == "requeue":
        assert len(usable) < len(bad), choice.why  # requeued only when the spares do not suffice
        assert set(choice.out) == {slots[i] for i in bad} - {None}  # what the scheduler must exclude
        return
    assert choice.generation == 7 and len(choice.slots) == len(slots)
    assert len(set(choice.slots)) == len(slots)  # no node holds two slots
    assert not set(choice.slots) & set(unfit)  # never a bad node
    for index, node in enumerate(slots):
        if index in bad:
            assert choice.slots[index] in usable  # an eligible spare, never an ineligible one
        else:
            assert choice.slots[index] == node  # a good slot keeps its node
    assert choice.path == ("spare" if bad else "in_place")
    assert choice.spares_left == len(usable) - len(bad)
    assert not set(choice.out) & set(choice.slots)
    assert {n for n in slots if n is not None} - set(choice.slots) <= set(choice.out)


def test_no_supervisors_or_a_requeue_asked_go_to_the_scheduler() -> None:
    assert choose([], {}, {}, generation=1).path == "requeue"
    active = {"a": SupervisorInfo(role="active", slot=0, state="running")}
    asked = choose(["a"], active, {}, generation=1, requeue_asked="a job-wide fault")
    assert (asked.path, asked.why) == ("requeue", "a scheduler requeue was asked: a job-wide fault")


def test_the_next_generation_is_above_every_reported_one() -> None:
    infos = {"a": SupervisorInfo(generation=3), "b": SupervisorInfo(generation=1)}
    assert next_generation(infos) == 4 and next_generation(infos, at_least=6) == 6
    assert next_generation({}) == 0


def test_the_supervisor_rule() -> None:
    view = view_with(jobs={"51200": ["n0", "n1", "n2"]})
    lost = make_event(
        "n1", "supervisor", severity="error", data={"job": "51200", "state": "lost", "role": "active"}
    )
    [restart] = evaluate_rule(supervisor_rule, lost, view)
    assert (restart.kind, restart.target, restart.params["avoid"]) == ("checkpoint_restart", "51200", ["n1"])
    assert "exclude" not in restart.params  # swapped out, not drained or excluded from the scheduler
    spare = make_event(
        "s1",
        "supervisor",
        severity="error",
        data={"job": "51200", "state": "failed", "role": "spare", "reason": "preflight failed"},
    )
    [note] = evaluate_rule(supervisor_rule, spare, view)
    assert note.kind == "notify" and "(preflight failed) on s1 (a spare node)" in note.reason
    gone = make_event(
        "n9", "supervisor", severity="error", data={"job": "51200", "state": "lost", "role": "active"}
    )
    assert evaluate_rule(supervisor_rule, gone, view) == []  # the job does not train on n9
    running = make_event("n1", "supervisor", severity="error", data={"job": "51200", "state": "running"})
    assert evaluate_rule(supervisor_rule, running, view) == []
