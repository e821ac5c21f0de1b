"""Agent-side collect_diagnostics with a real sleeping Python process and real py-spy (needs ptrace)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftd.agent.diagnostics import _tool, collect_diagnostics
from ftd.events import NODE_RANK, Directive, RankInfo
from tests.realparts import REQUIRE_REAL

SCRIPT = "import time\ndef train_step_marker():\n    time.sleep(300)\ntrain_step_marker()\n"


def _directive(**params: object) -> Directive:
    return Directive(
        id="act-1-diag-node-1",
        ts=time.time(),
        action="collect_diagnostics",
        job="job1",
        node="node-1",
        deadline_s=30,
        action_id="act-1",
        params=dict(params),
    )


@pytest.fixture
def sleeper() -> object:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT])
    time.sleep(0.3)  # let the interpreter reach the sleep
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.real
async def test_py_spy_dumps_a_real_rank(sleeper: subprocess.Popen[bytes], tmp_path: Path) -> None:
    if _tool("py-spy", None) is None:
        msg = "py-spy not installed (ftd[daemon])"
        if REQUIRE_REAL:
            pytest.fail(msg)
        pytest.skip(msg)
    if os.geteuid() != 0:
        pytest.skip("py-spy needs ptrace rights (root here)")
    ranks = [RankInfo(rank=0, pid=sleeper.pid), RankInfo(rank=1, pid=None)]
    result = await collect_diagnostics(
        _directive(ranks=[0]), ranks, tmp_path / "diagnostics", nvidia_smi="/nonexistent/nvidia-smi"
    )
    target = tmp_path / "diagnostics" / "act-1"
    assert result.path == str(target)
    dump = (target / f"rank-0-pid-{sleeper.pid}.txt").read_text()
    assert "train_step_marker" in dump and "sleep" in dump
    assert result.ok and result.errors == {}
    assert result.summary == "py-spy 1/1 ranks; nvidia-smi absent"
    assert json.loads((target / "manifest.json").read_text())["ok"] is True
    ack = result.to_ack(_directive(), "node-1")
    assert (
        ack.rank == NODE_RANK
        and ack.ok
        and ack.path == str(target)
        and ack.directive_id == "act-1-diag-node-1"
    )
    assert ack.files == result.files and f"rank-0-pid-{sleeper.pid}.txt" in ack.files
    assert ack.reason == result.summary

    # A repeated directive answers from the manifest without dumping again.
    again = await collect_diagnostics(_directive(), [RankInfo(rank=0, pid=1)], tmp_path / "diagnostics")
    assert again == result


def _dead_pid() -> int:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    return dead.pid


async def test_failures_are_reported_not_raised(tmp_path: Path) -> None:
    dead_pid = _dead_pid()
    fake_spy = tmp_path / "py-spy"
    fake_spy.write_text("#!/bin/sh\necho 'Error: Failed to find process' >&2\nexit 1\n")
    fake_spy.chmod(0o755)
    slow_smi = tmp_path / "nvidia-smi"
    slow_smi.write_text("#!/bin/sh\nexec sleep 30\n")
    slow_smi.chmod(0o755)
    t0 = time.monotonic()
    result = await collect_diagnostics(
        _directive(),
        [RankInfo(rank=0, pid=dead_pid), RankInfo(rank=1)],
        tmp_path,
        py_spy=str(fake_spy),
        nvidia_smi=str(slow_smi),
        timeout_s=0.5,
    )
    assert time.monotonic() - t0 < 5
    assert not result.ok
    assert result.errors["rank 0"] == "Error: Failed to find process"
    assert result.errors["rank 1"] == "no pid registered"
    assert "timed out" in result.errors["nvidia-smi"]
    assert result.summary.startswith("py-spy 0/2 ranks; nvidia-smi failed")
