"""The coordinator's checkpoint catalogue (issue #34): verified copies per job, step and level; the
resume choice; what the API shows."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.coordinator.api.views import checkpoints_of
from ftd.coordinator.model.checkpoints import STEPS_KEPT, CheckpointCatalogue
from ftd.coordinator.model.state import ClusterState
from ftd.events import Kind, Severity, make_event
from tests.properties import examples


def report(
    node: str, step: int, shard: int, level: str = "local", *, ok: bool = True, world: int = 2, **extra: Any
):  # type: ignore[no-untyped-def]
    data = {
        "job": "j",
        "rank": shard,
        "shard_rank": shard,
        "step": step,
        "level": level,
        "ok": ok,
        "world_size": world,
        "root": f"/{level}",
        "reason": "" if ok else "corrupt",
        **extra,
    }
    return make_event(
        node, Kind.CHECKPOINT, severity=Severity.INFO, source="agent", data=data, ts=1000.0 + step
    )


def test_a_step_counts_only_when_every_rank_verified_and_a_rejection_takes_a_copy_back() -> None:
    book = CheckpointCatalogue()
    book.note(report("n0", 10, 0))
    assert book.newest_verified("j", "local") is None and book.choose("j") is None  # rank 1 missing
    book.note(report("n1", 10, 1, save_s=2.5))
    assert book.newest_verified("j", "local") == (10, 1010.0) and book.save_seconds("j") == 2.5
    book.note(report("n1", 10, 1, ok=False))  # the same copy found corrupt later
    assert book.newest_verified("j", "local") is None


def test_hostile_or_foreign_events_change_nothing() -> None:
    book = CheckpointCatalogue()
    for data in (
        {"job": 5},
        {"job": "j", "step": -1, "level": "local"},
        {"job": "j", "step": 1, "level": "tape"},
        {"job": "j", "step": True, "level": "local", "rank": 0, "ok": True},
    ):
        book.note(make_event("n0", Kind.CHECKPOINT, severity=Severity.INFO, source="agent", data=data))
    book.note(make_event("n0", Kind.XID, source="agent", data={"job": "j", "step": 1, "level": "local"}))
    assert book.jobs() == []


def test_memory_is_bounded_per_job() -> None:
    book = CheckpointCatalogue()
    for step in range(STEPS_KEPT + 50):
        book.note(report("n0", step, 0, world=1))
    assert book.newest_verified("j", "local") == (STEPS_KEPT + 49, 1000.0 + STEPS_KEPT + 49)
    assert len(book._jobs["j"]) == STEPS_KEPT


@settings(max_examples=examples(200), deadline=None)
@given(
    copies=st.lists(
        st.tuples(
            st.integers(0, 6),
            st.integers(0, 2),
            st.sampled_from(["local", "partner", "shared"]),
            st.sampled_from(["n0", "n1", "n2"]),
            st.booleans(),
        ),
        max_size=40,
    ),
    lost=st.sets(st.sampled_from(["n0", "n1", "n2"])),
)
def test_the_choice_is_never_a_step_some_shard_cannot_be_read_from(
    copies: list[tuple[int, int, str, str, bool]], lost: set[str]
) -> None:
    book = CheckpointCatalogue()
    whole: dict[tuple[int, int, str, str], bool] = {}
    for step, shard, level, node, ok in copies:
        book.note(report(node, step, shard, level, ok=ok, world=3))
        whole[(step, shard, level, node)] = ok
    choice = book.choose("j", lost)

    def readable(step: int, shard: int) -> bool:
        return any(
            ok and (lvl == "shared" or n not in lost)
            for (s, r, lvl, n), ok in whole.items()
            if s == step and r == shard
        )

    good = [s for s in range(7) if all(readable(s, r) for r in range(3))]
    assert (choice.step if choice else None) == (max(good) if good else None)


def test_the_api_shows_each_level_s_newest_verified_step_and_quarantines() -> None:
    state = ClusterState()
    for step in (10, 20):
        for shard in (0, 1):
            state.apply_event(report(f"n{shard}", step, shard))
    state.apply_event(report("n0", 10, 0, "shared"))
    state.apply_event(report("n1", 10, 1, "shared"))
    state.checkpoints.quarantine("j", 20, "resume crashed")
    assert checkpoints_of(state, "j") == {
        "local": {"step": 10, "verified_at": 1010.0},
        "shared": {"step": 10, "verified_at": 1010.0},
    }
    assert state.checkpoints.quarantined("j") == {"20": "resume crashed"}


def test_a_deleted_copy_is_no_longer_a_resume_point_and_no_rejection() -> None:
    book = CheckpointCatalogue()
    for step in (10, 20):
        for shard in (0, 1):
            book.note(report(f"n{shard}", step, shard))
            book.note(report("s", step, shard, "shared"))
    book.quarantine("j", 20, "generation failed")
    assert (book.choose("j").step, book.choose("j").level) == (10, "local")  # type: ignore[union-attr]
    book.note(report("n1", 10, 1, ok=False, deleted=True))  # retention deleted n1's local copy
    choice = book.choose("j")
    assert choice is not None and (choice.step, choice.level) == (10, "shared")  # the shared copy is left
    book.note(report("s", 10, 1, "shared", ok=False, deleted=True))
    assert book.choose("j") is None  # shard 1 of step 10 is nowhere now
    assert book.quarantined("j") == {"20": "generation failed"}  # deletions quarantine nothing
    # a deletion of a copy never known, or of another node's copy, changes nothing
    book.note(report("n9", 10, 0, ok=False, deleted=True))
    book.note(report("n0", 99, 0, ok=False, deleted=True))
    assert book.newest_verified("j", "local") is None and 99 not in book._jobs["j"]
    for shard in (0, 1):  # every copy of step 10 deleted: the step is forgotten
        book.note(report(f"n{shard}", 10, shard, ok=False, deleted=True))
        book.note(report("s", 10, shard, "shared", ok=False, deleted=True))
    assert 10 not in book._jobs["j"]
