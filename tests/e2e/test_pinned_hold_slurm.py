"""A job pinned to its node is held, not looped (issue #31, item 3), on real Slurm, Mosquitto, a real
trainer job and a real full filesystem (a small tmpfs filled with ``dd``).

The defect: a job submitted with ``sbatch -w node-1`` whose node has a condition that moves jobs
without draining the node (a full local filesystem: rule ``fs_fill``) was saved, stopped, requeued
back onto node-1 (its exclusion refused: the job is pinned), started there again, was met by the
still-critical mount (``fs_fill`` ``job_arrived``) and stopped again: four restarts in about a
minute, each with a save, while the log said the job "waits for node-1 to return to service".

Now (``coordinator.pinned_jobs = "hold"``, the default): one save and one stop, then the job is
requeued *held* (``scontrol requeuehold``: PENDING, ``Restarts=1``), a notification says so; the
coordinator is killed and restarted while the job is held and finds the hold in its ledger; once
the mount is no longer critical on node-1 it releases the job (``scontrol release``) and the job
trains there again -- no second restart.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.stack import Stack, make_stack, trainer_records, wait_until
from tests.realparts import REQUIRE_REAL, Mosquitto, SlurmCluster

pytestmark = [pytest.mark.real, pytest.mark.slow]

HELD = "job_requeued_in_held_state"


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs: a real local filesystem the test can fill and empty."""
    mount = tmp_path / "scratch"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:  # a real filesystem is the real part here (mounting needs root)
        why = f"cannot mount a tmpfs: {done.stderr.strip() or done.returncode}"
        if REQUIRE_REAL:
            pytest.fail(f"FTD_REQUIRE_REAL=1 and {why}", pytrace=False)
        pytest.skip(why)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def pinned_stack(
    slurm: SlurmCluster, mosquitto: Mosquitto, small_fs: Path, tmp_path: Path
) -> Iterator[Stack]:
    agent = f"""
[agent.fs]
interval_s = 0.5
[[agent.fs.mounts]]
path = "{small_fs}"
warn_pct = 85
critical_pct = 95
"""
    with make_stack(
        slurm, mosquitto, tmp_path, agent_extra=agent, coordinator_keys="reconcile_interval_s = 1"
    ) as built:
        yield built


def pinned_notices(stack: Stack) -> list[str]:
    return [a["request"]["reason"] for a in stack.actions("notify") if a["request"]["rule"] == "pinned_jobs"]


def fill(mount: Path) -> None:
    subprocess.run(["dd", "if=/dev/zero", f"of={mount / 'fill'}", "bs=64k"], check=False, capture_output=True)


def test_a_job_pinned_to_a_node_with_a_full_filesystem_is_held_once_then_released(
    pinned_stack: Stack, small_fs: Path
) -> None:
    stack = pinned_stack
    job, log = stack.submit_trainer("-w", "node-1", max_s=600)  # pinned to node-1
    stack.slurm.wait_job_state(job, "RUNNING", 30)
    stack.wait_registered(job, timeout=60)

    # The local filesystem fills up: fs_fill critical on node-1 (the node is not drained).
    fill(small_fs)
    wait_until(lambda: len(stack.actions("checkpoint_restart")) >= 1, 30, "the restart decided")
    wait_until(
        lambda: stack.actions("checkpoint_restart")[0]["state"] not in ("pending", "running"),
        60,
        "the first restart to finish",
    )
    # Long enough for the loop to show: the job started again within seconds and was stopped again.
    time.sleep(25)
    restarts = stack.actions("checkpoint_restart")
    info = stack.slurm.job(job)
    saves = [r for r in trainer_records(log) if r["what"] == "saved"]
    stops = [r for r in trainer_records(log) if r["what"] == "stopped"]
    assert len(restarts) == 1, [(r["state"], r["detail"].get("pinned")) for r in restarts]
    assert len(saves) == 1 and len(stops) == 1, trainer_records(log)
    assert info.get("JobState") == "PENDING" and info.get("Reason") == HELD, info
    assert info.get("Restarts") == "1", info
    assert "DRAIN" not in stack.slurm.node("node-1").get("State", "")  # the node never left service

    [held] = restarts
    pinned = held["detail"]["pinned"]
    assert pinned["action"] == "hold" and pinned["nodes"] == ["node-1"], pinned
    assert "return to service" not in pinned["why"], pinned  # the node never left it
    assert "stopped it and requeued it held" in pinned["why"] and "releases it when" in pinned["why"], pinned
    assert held["detail"]["requeued"] is None, held["detail"]  # not watched as "stuck pending"
    wait_until(
        lambda: any(a["request"]["rule"] == "pinned_jobs" for a in stack.actions("notify")),
        15,
        "the notification of the hold",
    )
    [told] = [a for a in stack.actions("notify") if a["request"]["rule"] == "pinned_jobs"]
    assert told["request"]["reason"] == pinned["why"], told

    # The coordinator dies while the job is held (SIGKILL); the restarted one finds the hold in its ledger.
    stack.coordinator.stop(signal.SIGKILL)
    mark = len(stack.coordinator.log())
    stack.coordinator.start()
    stack.coordinator.wait_log("pinned_holds_restored", 30, after=mark)
    time.sleep(3)  # rounds of the new coordinator with the filesystem still full: still held
    info = stack.slurm.job(job)
    assert info.get("JobState") == "PENDING" and info.get("Reason") == HELD, info

    # The filesystem is emptied: the condition clears, ftd releases the job and it trains there again.
    (small_fs / "fill").unlink()
    started = len([r for r in trainer_records(log) if r["what"] == "started"])
    wait_until(
        lambda: stack.slurm.job(job).get("JobState") == "RUNNING", 90, "the job released and running again"
    )
    wait_until(
        lambda: len([r for r in trainer_records(log) if r["what"] == "started"]) == started + 1,
        60,
        "the released job's rank to start",
    )
    info = stack.slurm.job(job)
    assert info.get("Restarts") == "1" and "node-1" in info.get("NodeList", ""), info
    [held] = stack.actions("checkpoint_restart")  # still the only restart
    released = held["detail"]["pinned"]["released"]
    assert released["by"] == "ftd" and "fs_fill" in released["why"], released
    # Told twice in all: the hold (not again by the restarted coordinator), then the release.
    wait_until(lambda: len(pinned_notices(stack)) == 2, 15, "the notification of the release")
    notices = pinned_notices(stack)
    assert notices[1].startswith(f"job {job} released: fs_fill cleared on node-1"), notices
    stack.slurm.run("scancel", job, check=False)
