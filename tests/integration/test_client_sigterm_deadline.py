"""A real training process (the README's loop: ftd/bench/preemption_trainer.py, the client's defaults,
no agent) gets SIGTERM with a deadline (issue #37): a save its own measured saves say cannot land is
not started, and the process says why and which checkpoint the job resumes from; one that fits is
made. The deadline comes from ``$FTD_DEADLINE_FILE`` or the ``deadline`` file beside the agent's
socket, where the agent's cloud watcher writes an urgent notice's (under Slurm, scontrol's: see
ftd bench preemption's slow_save case)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def records(log: Path, what: str) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [r for r in map(json.loads, log.read_text().splitlines()) if r["what"] == what]


def wait(predicate: Any, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def run_to_sigterm(tmp_path: Path, left_s: float, named: bool = True) -> tuple[Path, str]:
    """``named``: the deadline file is ``$FTD_DEADLINE_FILE``; else it is ``deadline`` beside the agent's
    socket, where the agent writes a cloud notice's deadline."""
    log, deadline = tmp_path / "trainer.jsonl", tmp_path / "deadline"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "FTD_"))},
        "PYTHONPATH": str(REPO),
        "FTD_PREEMPT_LOG": str(log),
        "FTD_PREEMPT_CKPT": str(tmp_path / "ckpt"),
        "FTD_PREEMPT_SAVE_S": "1.5",
        "FTD_SOCKET": str(tmp_path / "no-agent.sock"),
        **({"FTD_DEADLINE_FILE": str(deadline)} if named else {}),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "ftd.bench.preemption_trainer"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        wait(lambda: records(log, "started"), 60, "the loop to start")
        proc.send_signal(signal.SIGUSR1)  # one save the rank measures (1.5 s)
        wait(lambda: records(log, "saved"), 30, "the SIGUSR1 save")
        time.sleep(0.3)
        deadline.write_text(f"{time.time() + left_s}\n")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    return log, err


@pytest.mark.parametrize("named", [True, False], ids=["FTD_DEADLINE_FILE", "beside-the-socket"])
def test_a_save_that_cannot_land_is_not_started_and_the_process_says_why(tmp_path: Path, named: bool) -> None:
    log, err = run_to_sigterm(tmp_path, left_s=2.0, named=named)  # 1.5 s p95 + 2 s margin > 2 s
    [first] = records(log, "saved")
    assert len(records(log, "save_started")) == 1, "only the SIGUSR1 save was started"
    [left] = records(log, "left_loop")
    assert left["step"] > first["step"]
    assert "not saving, stopping now" in err and "1.5 s (p95)" in err, err
    assert f"resumes from its last checkpoint, step {first['step']}" in err, err


def test_a_save_that_fits_is_made(tmp_path: Path) -> None:
    log, err = run_to_sigterm(tmp_path, left_s=30.0)
    saved = records(log, "saved")
    assert len(saved) == 2 and records(log, "left_loop")[0]["step"] == saved[1]["step"], (saved, err)
    assert "not saving" not in err
