"""The checkpoint tier (issue #34) with real torch.distributed: 2 gloo ranks on CPU, a DDP model, real
files (each rank's ``local_dir`` stands for its node's disk). Saves block little, the partner replica
and the shared flush appear with verifying manifests, every level is reported, ``load_resume`` loads
the very tensors saved, and a rank whose local copy is gone resumes from its partner's copy, sent back
over the tier's gloo group (no shared filesystem involved). FSDP2 is in
test_checkpoint_tier_fsdp.py (a file of its own: the suite runs a file per process at a time)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ftd.client import manifest as mf

pytest.importorskip("torch", reason="pip install 'ftd-daemon[torch]'")

RANK = Path(__file__).with_name("ckpt_rank.py")
FSDP_RANK = Path(__file__).with_name("ckpt_fsdp_rank.py")
ROOT = Path(__file__).resolve().parents[2]


def _run(phase: str, tmp: Path, world: int = 2, script: Path = RANK) -> list[dict[str, Any]]:
    store = tmp / f"store-{phase}"
    store.unlink(missing_ok=True)  # a FileStore left by an earlier run of this phase would be joined
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FTD_RESUME_STEP", None)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                phase,
                str(r),
                str(world),
                str(store),
                str(tmp),
                str(tmp / f"{phase}{r}.json"),
            ],
            env=env,
        )
        for r in range(world)
    ]
    for p in procs:
        assert p.wait(timeout=600) == 0, f"{phase} rank exited {p.returncode}"
    return [json.loads((tmp / f"{phase}{r}.json").read_text()) for r in range(world)]


def _manifest(path: Path, level: str, rank: int, step: int, world: int = 2) -> None:
    m, why = mf.verify(str(path))
    assert m is not None and why == "", why
    assert (m.level, m.rank, m.step, m.world_size) == (level, rank, step, world)


def test_save_replicate_flush_and_resume_from_the_partner(tmp_path: Path) -> None:
    saved = _run("save", tmp_path)
    for out in saved:
        rank = out["rank"]
        assert out["partner_broken"] is None
        assert [h["step"] for h in out["history"]] == [2, 4]
        assert all("error" not in h for h in out["history"]), out["history"]
        # Off the training thread (proved deterministically in tests/unit/test_checkpoint_tier_unit.py);
        # here the blocked time is only recorded: timings are the bench's business.
        assert all(isinstance(h["blocked_s"], float) for h in out["history"])
        for step in (2, 4):
            _manifest(
                tmp_path / f"node{rank}/local/step-{step:09d}/rank-{rank:05d}.manifest.json",
                "local",
                rank,
                step,
            )
            peer = 1 - rank  # on one host the partner is the next rank; rank `peer` holds our copy
            _manifest(
                tmp_path / f"node{peer}/local/partner/step-{step:09d}/rank-{rank:05d}.manifest.json",
                "partner",
                rank,
                step,
            )
        _manifest(tmp_path / f"shared/step-{4:09d}/rank-{rank:05d}.manifest.json", "shared", rank, 4)
        assert not (tmp_path / f"shared/step-{2:09d}").exists(), "every 2nd save only is flushed"
        levels = sorted((r["step"], r["level"]) for r in out["reports"])
        assert levels == [(2, "local"), (2, "partner"), (4, "local"), (4, "partner"), (4, "shared")]

    # Node 1 lost its disk's checkpoints (a swapped-in spare): it resumes from rank 0's partner copy.
    shutil.rmtree(tmp_path / "node1/local/step-000000004")
    shutil.rmtree(tmp_path / "node1/local/step-000000002")
    resumed = _run("resume", tmp_path)
    for out, before in zip(resumed, saved, strict=True):
        assert out["step"] == 4 and out["extra_step"] == 4
        assert out["loaded"] == before["saved"]["4"], "load_resume did not load the tensors saved"
    assert resumed[0]["level"] == "local"
    assert resumed[1]["level"] == "partner"
    _manifest(tmp_path / "node1/local/step-000000004/rank-00001.manifest.json", "local", 1, 4)


def test_due_plans_the_same_saves_on_every_rank_from_the_agreed_landing_lags(tmp_path: Path) -> None:
    """``tier.due`` over real gloo: the landing lags are gathered once per save and the largest kept,
    so every rank holds the same lags, plans with the same one and saves the very same steps (the
    partner exchange pairs the ranks' saves: one rank saving another step would hang both)."""
    out = _run("due", tmp_path)
    assert all(o["partner_broken"] is None for o in out), out
    assert out[0]["saves"] == out[1]["saves"] and out[0]["lags"] == out[1]["lags"], out
    saves, lags, plans = out[0]["saves"], out[0]["lags"], out[0]["plans"]
    assert saves[0] == 8 and len(lags) == len(saves), out[0]
    assert all(isinstance(lag, int) and lag >= 0 for lag in lags)
    # each gap is the plan fixed at the save that opened it: every - (slowest recent landing) - 1
    for i, (a, b) in enumerate(itertools.pairwise(saves)):
        assert plans[i] == max(lags[max(0, i - 8) : i], default=0)
        assert b - a == max(1, 8 - plans[i] - 1), (i, saves, lags, plans)
    for o in out:  # every save landed at the partner and says after how many steps
        assert o["landed"] == lags, o


def test_a_corrupt_local_copy_is_not_loaded(tmp_path: Path) -> None:
    saved = _run("save", tmp_path)
    state = tmp_path / "node0/local/step-000000004/rank-00000/state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    resumed = _run("resume", tmp_path)
    assert resumed[0]["step"] == 4 and resumed[0]["level"] == "partner"
    assert resumed[0]["loaded"] == saved[0]["saved"]["4"]


@pytest.mark.slow
def test_a_partner_choice_changed_mid_run_applies_at_the_next_save(tmp_path: Path) -> None:
    world = 3
    saved = _run("move", tmp_path, world=world)
    for out in saved:
        rank = out["rank"]
        assert out["partner_broken"] is None
        by_step = {h["step"]: h for h in out["history"]}
        # Rank 0 alone got version 2; every rank applied it at the save of step 4 (agreed), none before.
        assert [(by_step[s]["partners_version"], by_step[s]["send_to"]) for s in (2, 4)] == [
            (1, (rank + 1) % world),
            (2, (rank - 1) % world),
        ]
        for step, holder in ((2, (rank + 1) % world), (4, (rank - 1) % world)):
            _manifest(
                tmp_path / f"node{holder}/local/partner/step-{step:09d}/rank-{rank:05d}.manifest.json",
                "partner",
                rank,
                step,
                world,
            )
            others = set(range(world)) - {holder}
            for other in others:  # the replica is on the agreed partner only
                assert not (tmp_path / f"node{other}/local/partner/step-{step:09d}/rank-{rank:05d}").exists()
    # Node 1 lost its disk: its step 4 comes back from its new partner, node 0.
    shutil.rmtree(tmp_path / "node1/local/step-000000004")
    shutil.rmtree(tmp_path / "node1/local/step-000000002")
    resumed = _run("resume", tmp_path, world=world)
    assert [(out["step"], out["level"]) for out in resumed] == [(4, "local"), (4, "partner"), (4, "local")]
    assert resumed[1]["loaded"] == saved[1]["saved"]["4"]
