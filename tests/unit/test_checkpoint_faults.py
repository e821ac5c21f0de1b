"""The checkpoint bench's fault cases without a job: injectors on real files, the scan, the verdict.

On real checkpoint trees (files and manifests written with :mod:`ftd.client.manifest`), each corruption
makes exactly the broken step stop verifying and leaves the older one verified; deleting a local
directory leaves the partner and shared copies. :func:`judge` (properties): a resume is never right
when it hangs, when the ranks disagree, or when its step is not verified or newer than the newest
verified; steps lost are the last step trained minus the step resumed from.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.bench.checkpoint_faults import (
    CORRUPTIONS,
    InjectError,
    inject,
    judge,
    newest_verified,
    scan,
    verified_steps,
)
from ftd.client import manifest
from tests.properties import examples

WORLD = 2


def save(root: Path, step: int, rank: int, level: str, payload: bytes) -> Path:
    """One rank's checkpoint at one level, laid out as the tier does: a step directory, a shard
    directory per rank, the manifest written last."""
    directory = root / f"step-{step:09d}"
    shard = directory / f"rank-{rank:05d}"
    shard.mkdir(parents=True, exist_ok=True)
    (shard / "model.pt").write_bytes(payload)
    (shard / "extra.pt").write_bytes(payload[:7])
    entries = tuple(
        manifest.file_entry(str(directory), f"rank-{rank:05d}/{n}") for n in ("model.pt", "extra.pt")
    )
    made = manifest.Manifest("job-1", step, rank, WORLD, 0, level, 1.0, 0.01, entries)
    return Path(manifest.write(str(directory), made))


def tree(tmp_path: Path) -> dict[str, Path]:
    """Steps 10 and 20 on two nodes (local), each with its partner's replica, and step 10 shared."""
    roots = {n: tmp_path / n for n in ("node-1", "node-2", "shared")}
    for step in (10, 20):
        for rank, node in enumerate(("node-1", "node-2")):
            other = "node-2" if node == "node-1" else "node-1"
            data = os.urandom(4096) + bytes([step, rank])
            save(roots[node], step, rank, "local", data)
            save(roots[other] / "partner", step, rank, "partner", data)
            if step == 10:
                save(roots["shared"], step, rank, "shared", data)
    return roots


def test_a_whole_tree_verifies_at_every_level(tmp_path: Path) -> None:
    roots = tree(tmp_path)
    copies = scan(roots.values())
    everywhere = frozenset({"local", "partner", "shared"})
    fast = frozenset({"local", "partner"})
    assert verified_steps(copies) == {10: {0: everywhere, 1: everywhere}, 20: {0: fast, 1: fast}}
    assert newest_verified(copies) == 20


@pytest.mark.parametrize("case", CORRUPTIONS)
def test_each_corruption_breaks_the_newest_local_copy_only(tmp_path: Path, case: str) -> None:
    roots = tree(tmp_path)
    done = inject(case, roots["node-2"], rank=1, seed=3)
    assert done["step"] == 20 and done["rank"] == 1 and done["level"] == "local"
    copies = scan(roots.values())
    assert not copies.get((20, "local")) or not copies[(20, "local")].complete
    if case != "missing_manifest":  # a manifest still there says why it fails
        assert any("node-2" in p for p in copies[(20, "local")].problems)
    # the partner copy of step 20 and every copy of step 10 are untouched: rank 1 loads step 20 from
    # its partner's replica
    everywhere = frozenset({"local", "partner", "shared"})
    steps = verified_steps(copies)
    assert steps[10] == {0: everywhere, 1: everywhere}
    assert steps[20] == {0: frozenset({"local", "partner"}), 1: frozenset({"partner"})}


def test_a_flipped_byte_keeps_the_size_and_only_the_hash_sees_it(tmp_path: Path) -> None:
    roots = tree(tmp_path)
    done = inject("flip_byte", roots["node-1"], rank=0, seed=1)
    assert Path(done["path"]).stat().st_size in (4098, 7)
    sizes_only = scan(roots.values(), hashes=False)
    assert sizes_only[(20, "local")].complete  # sizes alone do not see it
    assert not scan(roots.values())[(20, "local")].complete


def test_a_truncation_cuts_the_file_short(tmp_path: Path) -> None:
    roots = tree(tmp_path)
    done = inject("truncate", roots["node-1"], rank=0, seed=2)
    assert done["size"] < done["was"] == Path(done["path"]).stat().st_size + (done["was"] - done["size"])
    assert Path(done["path"]).stat().st_size == done["size"]


def test_deleting_a_local_directory_leaves_the_partner_and_shared_copies(tmp_path: Path) -> None:
    roots = tree(tmp_path)
    inject("local_deleted", roots["node-2"])
    assert not roots["node-2"].exists()
    steps = verified_steps(scan(roots.values()))
    # node-2's local copies (rank 1) and its replicas of rank 0 are gone; node-1 still holds rank 0's
    # local copies and rank 1's partner replicas: every step still loads, rank 1 from its partner
    assert steps == {
        10: {0: frozenset({"local", "shared"}), 1: frozenset({"partner", "shared"})},
        20: {0: frozenset({"local"}), 1: frozenset({"partner"})},
    }
    # and with node-1 lost too, only the shared step 10 is left
    inject("local_deleted", roots["node-1"])
    assert verified_steps(scan(roots.values())) == {10: {0: frozenset({"shared"}), 1: frozenset({"shared"})}}


def test_a_scan_can_keep_one_generation(tmp_path: Path) -> None:
    roots = tree(tmp_path)  # generation 0
    assert verified_steps(scan(roots.values(), generation=1)) == {}
    assert set(verified_steps(scan(roots.values(), generation=0))) == {10, 20}


def test_nothing_to_break_is_said(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(InjectError):
        inject("flip_byte", tmp_path / "empty")
    with pytest.raises(InjectError):
        inject("local_deleted", tmp_path / "absent")
    with pytest.raises(ValueError, match="unknown"):
        inject("kill_mid_save", tmp_path)


def test_a_hostile_manifest_counts_for_nothing(tmp_path: Path) -> None:
    roots = tree(tmp_path)
    (roots["node-1"] / "step-000000030").mkdir()
    (roots["node-1"] / "step-000000030" / "rank-00000.manifest.json").write_text('{"format": 1}')
    copies = scan(roots.values())
    assert copies[(-1, "unreadable")].problems
    assert newest_verified(copies) == 20


# --- the verdict --------------------------------------------------------------------------------

levels_st = st.frozensets(st.sampled_from(("local", "partner", "shared")), min_size=1)
verified_st = st.dictionaries(
    st.integers(1, 60), st.fixed_dictionaries({r: levels_st for r in range(4)}), max_size=5
)
resume_st = st.tuples(
    st.integers(0, 60), st.one_of(st.none(), st.sampled_from(("local", "partner", "shared")))
)


@settings(max_examples=examples(200), deadline=None)
@given(
    verified=verified_st,
    resumed=st.dictionaries(st.integers(0, 3), resume_st, max_size=4),
    last=st.integers(0, 80),
    hang=st.booleans(),
)
def test_judge_is_right_only_for_one_verified_step_never_newer(
    verified: dict[int, dict[int, frozenset[str]]],
    resumed: dict[int, tuple[int, str | None]],
    last: int,
    hang: bool,
) -> None:
    out = judge("flip_byte", verified=verified, resumed=resumed, world_size=4, last_step=last, hang=hang)
    if out.right:
        assert not hang and set(resumed) == {0, 1, 2, 3}
        assert len({s for s, _ in resumed.values()}) == 1
        step = out.resumed_step
        assert step is not None
        if step:
            assert step in verified and step <= max(verified)
            for rank, (_, level) in resumed.items():
                assert level is None or level in verified[step][rank]
        else:
            assert not verified
        assert out.steps_lost == max(0, last - step)
    else:
        assert out.why
    if hang:
        assert not out.right and out.hang


def test_judge_examples() -> None:
    everywhere = {"local", "partner", "shared"}
    verified = {10: {0: everywhere, 1: everywhere}, 20: {0: {"partner"}, 1: {"partner"}}}
    same = {0: (20, "partner"), 1: (20, "partner")}
    ok = judge(
        "kill_mid_save", verified=verified, resumed=same, world_size=2, last_step=27, interval_steps=10
    )
    assert ok.right and ok.from_newest and ok.fast_level and ok.within_interval and ok.steps_lost == 7
    # the newer, broken local copy: wrong
    bad = judge(
        "flip_byte",
        verified=verified,
        resumed={0: (20, "local"), 1: (20, "local")},
        world_size=2,
        last_step=27,
    )
    assert not bad.right and "was not verified for ranks [0, 1]" in bad.why
    # an older verified one: right, but not the newest, and a shared read
    old = judge(
        "truncate",
        verified=verified,
        resumed={0: (10, "shared"), 1: (10, "shared")},
        world_size=2,
        last_step=27,
        interval_steps=10,
    )
    assert old.right and not old.from_newest and old.fast_level is False and old.within_interval is False
    # ranks at different steps: wrong
    split = judge(
        "truncate", verified=verified, resumed={0: (10, None), 1: (20, None)}, world_size=2, last_step=27
    )
    assert not split.right and not split.consistent
    # a step newer than anything verified
    newer = judge(
        "missing_manifest",
        verified=verified,
        resumed={0: (30, None), 1: (30, None)},
        world_size=2,
        last_step=31,
    )
    assert not newer.right and not newer.not_newer
