"""The checkpoint tier (issue #34) with FSDP2 (``fully_shard``), real torch.distributed: 2 gloo ranks on
CPU, each rank's sharded model and optimizer state saved through the tier, and loaded back exactly, also
from the partner copy. A file of its own, beside test_checkpoint_tier.py whose helpers it uses: the
suite runs a whole file per process at a time, and this test takes minutes."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_checkpoint_tier import FSDP_RANK, _manifest, _run

pytest.importorskip("torch", reason="pip install 'ftd-daemon[torch]'")


def _fsdp_resume(tmp: Path, saved: list[dict[str, Any]], levels: list[str]) -> None:
    resumed = _run("resume", tmp, script=FSDP_RANK)
    for out, before, level in zip(resumed, saved, levels, strict=True):
        assert (out["step"], out["extra_step"], out["level"]) == (4, 4, level)
        # The restart's own weights differed: equality below is the load's doing, not the seed's.
        assert out["fresh"]["model"] != before["saved"]["4"]["model"]
        assert out["loaded"] == before["saved"]["4"], "the sharded state read back is not the one saved"


@pytest.mark.slow
def test_fsdp_sharded_state_saved_and_resumed_from_local_and_partner(tmp_path: Path) -> None:
    saved = _run("save", tmp_path, script=FSDP_RANK)
    for out in saved:
        rank = out["rank"]
        assert out["partner_broken"] is None
        assert all("error" not in h and "local" not in h for h in out["history"]), out["history"]
        # Each rank saved its own shard: the two ranks' model digests differ (not a full copy each).
        assert out["saved"]["4"]["model"] != saved[1 - rank]["saved"]["4"]["model"]
        assert any("exp_avg" in k for k in out["saved"]["4"]["optim"]), "the optimizer state was saved"
        for step in (2, 4):
            _manifest(
                tmp_path / f"node{rank}/local/step-{step:09d}/rank-{rank:05d}.manifest.json",
                "local",
                rank,
                step,
            )
            _manifest(
                tmp_path / f"node{1 - rank}/local/partner/step-{step:09d}/rank-{rank:05d}.manifest.json",
                "partner",
                rank,
                step,
            )
    _fsdp_resume(tmp_path, saved, ["local", "local"])
    # Node 1's disk is gone (a swapped-in spare): its shard comes back from rank 0's partner copy.
    shutil.rmtree(tmp_path / "node1/local/step-000000004")
    shutil.rmtree(tmp_path / "node1/local/step-000000002")
    _fsdp_resume(tmp_path, saved, ["local", "partner"])
