"""ftd.client.retention: the newest N complete checkpoints stay, the newest verified one always
stays, a save possibly still being written is not deleted; and the tier's use of it on real
directories (an incomplete or corrupt newer checkpoint never costs the last good one)."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.client import manifest as mf
from ftd.client.retention import plan
from tests.properties import examples


def test_keeps_the_newest_complete_ones() -> None:
    assert plan([(1, True), (2, True), (3, True), (4, True)], keep=2) == [1, 2]


def test_never_deletes_the_newest_complete_even_behind_newer_incomplete_ones() -> None:
    # Steps 3 and 4 are half-written (a crash mid-save): 2 is what a restart resumes from.
    assert plan([(1, True), (2, True), (3, False), (4, False)], keep=1) == [1]


def test_old_incomplete_saves_go() -> None:
    assert plan([(1, False), (2, True), (3, True)], keep=2) == [1]


def test_nothing_complete_deletes_nothing() -> None:
    assert plan([(5, False), (6, False)], keep=1) == []


@settings(max_examples=examples(300))
@given(st.lists(st.tuples(st.integers(0, 50), st.booleans()), max_size=30), st.integers(-2, 6))
def test_plan_properties(checkpoints: list[tuple[int, bool]], keep: int) -> None:
    delete = plan(checkpoints, keep)
    complete = {s for s, ok in checkpoints if ok}
    steps = {s for s, _ in checkpoints}
    assert set(delete) <= steps and delete == sorted(set(delete))
    if complete:
        newest = max(complete)
        assert newest not in delete
        kept_complete = complete - set(delete)
        assert len(kept_complete) == min(len(complete), max(1, keep))
        assert all(s not in delete for s in steps - complete if s > newest)
    else:
        assert delete == []


def _save(root: Path, step: int, rank: int, payload: bytes, *, manifest: bool = True) -> None:
    d = root / f"step-{step:09d}"
    (d / f"rank-{rank:05d}").mkdir(parents=True)
    (d / f"rank-{rank:05d}/state.pt").write_bytes(payload)
    if manifest:
        entry = mf.file_entry(str(d), f"rank-{rank:05d}/state.pt")
        mf.write(str(d), mf.Manifest("j", step, rank, 2, 0, "local", 0.0, None, (entry,)))


def test_the_tier_retains_on_real_directories(tmp_path: Path) -> None:
    import pytest

    pytest.importorskip("torch")
    from ftd.client.checkpoint import _retain

    for step in (1, 2, 3):
        _save(tmp_path, step, 0, b"x" * step)
    _save(tmp_path, 3, 1, b"other rank")  # another rank's files in the same step directory
    _save(tmp_path, 4, 0, b"half", manifest=False)  # being written
    (tmp_path / "step-000000003/rank-00000/state.pt").write_bytes(b"zzz")  # same size, still counted
    os.truncate(tmp_path / "step-000000002/rank-00000/state.pt", 0)  # step 2 is incomplete now
    assert _retain(str(tmp_path), 0, keep=1, pinned=set()) == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000003", "step-000000004"]
    assert (tmp_path / "step-000000003/rank-00001/state.pt").exists(), "another rank's files were deleted"
