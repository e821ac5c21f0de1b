"""A real DDP trainer (examples/train_ddp.py, 2 ranks, gloo on CPU) under Slurm, driven by ftd.

Real Mosquitto, real Slurm, ``ftd agent`` and ``ftd coordinator`` subprocesses (the stack of
test_spine.py); the example runs as a ``--requeue`` batch job with ``torchrun --nproc-per-node=2``
inside. (node-1 has ``CPUs=1`` in the test cluster: that is Slurm's bookkeeping only — with
``TaskPlugin=task/none`` nothing pins the two ranks to one CPU.)

- Xid 13 (RESTART_APP) in the node's kernel log: every rank saves at the same step, acks and exits;
  the coordinator requeues the job without excluding the node; the same job id runs again
  (Restarts=1), resumes from that step and its per-step losses equal those of an uninterrupted run
  of the same script (started alongside, without an agent: the client fails open).
- Xid 79 (fatal): same save/ack/stop, then node-1 is drained and the requeued job stays PENDING with
  node-1 excluded (it is the only node with a slurmd).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.daemons import REPO
from tests.e2e.test_spine import Stack, stack, wait_until

pytest.importorskip("torch", reason="the DDP example needs torch (pip install 'ftd-daemon[torch]')")

pytestmark = [pytest.mark.real, pytest.mark.slow]
__all__ = ["stack"]  # the fixture, imported for pytest

XID13 = (
    "[ 6110.203311] NVRM: Xid (PCI:0000:3b:00): 13, pid=31337, name=python, Graphics SM Warp Exception "
    "on (GPC 0, TPC 0, SM 0): Out Of Range Address"
)
XID79 = "[ 6120.437112] NVRM: Xid (PCI:0000:3b:00): 79, pid=31337, name=python, GPU has fallen off the bus."
STEPS = 300
STEP_SLEEP = 0.03


def train_argv(ckpt: Path, metrics: Path, steps: int, max_seconds: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(REPO / "examples" / "train_ddp.py"),
        f"--steps={steps}",
        f"--ckpt-dir={ckpt}",
        f"--metrics={metrics}",
        f"--step-sleep={STEP_SLEEP}",
        f"--max-seconds={max_seconds}",
    ]


def submit(stack: Stack, name: str, steps: int, max_seconds: float = 90) -> tuple[str, Path, Path]:
    ckpt, metrics = stack.workdir / f"{name}-ckpt", stack.workdir / f"{name}.jsonl"
    script = "#!/bin/bash\n" + "\n".join(
        [
            f"export FTD_SOCKET={stack.socket}",
            f"export PYTHONPATH={REPO}",
            "export OMP_NUM_THREADS=1",
            "exec " + " ".join(train_argv(ckpt, metrics, steps, max_seconds)),
        ]
    )
    job = stack.slurm.sbatch(script + "\n", "--requeue", f"--job-name=ftd-{name}")
    return job, ckpt, metrics


def records(metrics: Path) -> list[dict[str, Any]]:
    if not metrics.exists():
        return []
    out = []
    for line in metrics.read_text().splitlines():
        with contextlib.suppress(ValueError):  # a line being written right now
            out.append(json.loads(line))
    return out


def events(metrics: Path, what: str) -> list[dict[str, Any]]:
    return [r for r in records(metrics) if r.get("what") == what]


def finished(metrics: Path) -> list[dict[str, Any]]:
    return [e for e in events(metrics, "exit") if e["outcome"] == "done"]


def last_step(metrics: Path) -> int:
    return max((r["step"] for r in records(metrics) if "loss" in r), default=0)


def action_detail(stack: Stack, kind: str) -> tuple[str, dict[str, Any]]:
    with sqlite3.connect(stack.ledger) as db:
        row = db.execute("SELECT state, detail FROM actions WHERE kind = ?", (kind,)).fetchone()
    return (row[0], json.loads(row[1]) if row[1] else {}) if row else ("", {})


def test_xid13_restarts_in_place_and_the_loss_trajectory_is_unchanged(stack: Stack) -> None:
    # The uninterrupted reference, alongside (no agent at that socket: the client fails open).
    ref_ckpt, ref_metrics = stack.workdir / "ref-ckpt", stack.workdir / "ref.jsonl"
    ref_run_dir = tempfile.mkdtemp(prefix="ftd-ref-", dir="/tmp")
    reference = subprocess.Popen(
        train_argv(ref_ckpt, ref_metrics, STEPS, 120),
        env={**os.environ, "FTD_SOCKET": f"{ref_run_dir}/absent.sock", "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        job, _ckpt, metrics = submit(stack, "restart", STEPS)
        stack.slurm.wait_job_state(job, "RUNNING", 30)
        stack.wait_registered(job, timeout=60)
        wait_until(lambda: last_step(metrics) >= 40, 60, "40 training steps")

        stack.append_kernel_line(XID13)

        # Every rank saves at the same step (the one the directive was agreed on), then stops.
        wait_until(lambda: len(events(metrics, "stopped")) == 2, 30, "both ranks to stop")
        saved = [e for e in events(metrics, "saved") if e["requested"]]
        assert sorted(e["rank"] for e in saved) == [0, 1], saved
        save_step = saved[0]["step"]
        assert all(e["step"] == save_step for e in saved), saved
        stops = events(metrics, "stopped")
        assert all(e["step"] >= save_step and e["reason"] == "directive" for e in stops), stops

        # Requeued in place: same job id, Restarts=1, back on node-1 (nothing excluded or drained).
        def restarted() -> bool:
            info = stack.slurm.job(job)
            return int(info.get("Restarts", "0")) == 1 and info.get("JobState") in ("RUNNING", "COMPLETED")

        wait_until(restarted, 40, "the job to run again")
        wait_until(lambda: len(finished(metrics)) == 2, 60, "the resumed run to finish")
        info = stack.slurm.job(job)
        assert info.get("Restarts") == "1" and info.get("ExcNodeList", "") in ("", "(null)"), info
        assert "DRAIN" not in stack.slurm.node("node-1").get("State", "")
        resumed = events(metrics, "resumed")
        assert sorted(e["rank"] for e in resumed) == [0, 1]
        assert {e["step"] for e in resumed} == {save_step}
        assert {e["job"] for e in events(metrics, "started")} == {job}

        state, detail = action_detail(stack, "checkpoint_restart")
        assert state == "succeeded", detail
        assert detail["save_step"] == save_step and detail["requeued"]["exclude"] == []

        # The loss trajectory equals the uninterrupted run's, step for step (every logged loss,
        # including the steps run twice: after the save and before the stop, then after the resume).
        assert reference.wait(90) == 0
        ref = {r["step"]: r["loss"] for r in records(ref_metrics) if "loss" in r}
        assert sorted(ref) == list(range(1, STEPS + 1))
        losses = [r for r in records(metrics) if "loss" in r]
        assert {r["step"] for r in losses} == set(range(1, STEPS + 1))
        mismatched = [
            (r["step"], r["loss"], ref[r["step"]]) for r in losses if abs(r["loss"] - ref[r["step"]]) > 1e-6
        ]
        assert not mismatched, mismatched[:5]
        replayed = [r["step"] for r in losses if r["step"] > save_step]
        assert len(replayed) > STEPS - save_step  # some steps really were trained twice
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.wait()


def test_xid79_saves_every_rank_then_drains_and_leaves_the_job_pending(stack: Stack) -> None:
    job, _ckpt, metrics = submit(stack, "drain", 100_000, max_seconds=60)
    stack.slurm.wait_job_state(job, "RUNNING", 30)
    stack.wait_registered(job, timeout=60)
    wait_until(lambda: last_step(metrics) >= 20, 60, "20 training steps")

    stack.append_kernel_line(XID79)

    wait_until(lambda: len(events(metrics, "stopped")) == 2, 30, "both ranks to stop")
    saved = [e for e in events(metrics, "saved") if e["requested"]]
    assert sorted(e["rank"] for e in saved) == [0, 1] and len({e["step"] for e in saved}) == 1, saved
    wait_until(lambda: "DRAIN" in stack.slurm.node("node-1").get("State", ""), 20, "node-1 drained")

    def requeued() -> bool:
        info = stack.slurm.job(job)
        return info.get("JobState") == "PENDING" and int(info.get("Restarts", "0")) >= 1

    wait_until(requeued, 30, "the job to be requeued")
    wait_until(lambda: action_detail(stack, "checkpoint_restart")[0] == "succeeded", 10, "the ledger")
    # Only once the requeue returned: it holds the job (PENDING), sets the exclusion, then releases.
    assert "node-1" in stack.slurm.job(job).get("ExcNodeList", "")
    _, detail = action_detail(stack, "checkpoint_restart")
    assert detail["save_step"] == saved[0]["step"] and detail["requeued"]["exclude"] == ["node-1"]
