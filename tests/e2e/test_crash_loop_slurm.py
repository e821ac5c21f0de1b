"""Restarts that happen (issue #20, item 4), on a real Slurm, real Mosquitto and a real trainer job.

An application fault (Xid 13) that comes back after ftd restarted the job in place is a new
occurrence of the job's problem, even inside the 60 s incident window: the job was restarted in
between. The crash-loop backoff (``app_fault_backoff_s``) delays the next restart, not the generic
600 s cooldown (left at its default here); reaching ``app_fault_restart_limit`` ends in a
notification naming the signature, and the job is left running, never drained.

Before the fix, the second Xid 13 (30 s after the first) was folded into the first incident (no
decision at all); once past the window, the cooldown suppressed the restart.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.daemons import REPO
from tests.e2e.stack import Stack, make_stack, trainer_records, wait_until
from tests.realparts import Mosquitto, SlurmCluster

pytestmark = [pytest.mark.real, pytest.mark.slow]

BACKOFF_S = 4.0
XID13 = (
    "[ {t:.6f}] NVRM: Xid (PCI:0000:3b:00): 13, pid={pid}, name=python, Graphics SM Warp Exception "
    "on (GPC 0, TPC 0, SM 0): Out Of Range Address"
)


@pytest.fixture
def crash_stack(slurm: SlurmCluster, mosquitto: Mosquitto, tmp_path: Path) -> Iterator[Stack]:
    # The generic cooldown stays at its default (600 s): only the crash-loop settings are shortened.
    policy = f"""
[coordinator.policy]
app_fault_restart_limit = 2
app_fault_backoff_s = {BACKOFF_S}
"""
    with make_stack(slurm, mosquitto, tmp_path, coordinator_extra=policy) as built:
        yield built


def actions(stack: Stack, kind: str) -> list[dict[str, Any]]:
    with sqlite3.connect(stack.ledger) as db:
        rows = db.execute(
            "SELECT state, request, detail FROM actions WHERE kind = ? ORDER BY created", (kind,)
        ).fetchall()
    return [{"state": s, "request": json.loads(r), "detail": json.loads(d) if d else {}} for s, r, d in rows]


def restarts(stack: Stack, job: str) -> int:
    return int(stack.slurm.job(job).get("Restarts", "0"))


def running_again(stack: Stack, job: str, log: Path, count: int) -> bool:
    """The job's run number ``count`` (Restarts) runs and its rank registered ("started" logged)."""
    started = [r for r in trainer_records(log) if r["what"] == "started"]
    info = stack.slurm.job(job)
    return (
        info.get("JobState") == "RUNNING" and int(info.get("Restarts", "0")) == count and len(started) > count
    )


def test_an_xid13_after_an_in_place_restart_is_restarted_again_then_reported_as_a_crash_loop(
    crash_stack: Stack,
) -> None:
    stack = crash_stack
    log = stack.workdir / "crash.jsonl"
    script = f"""#!/bin/bash
export FTD_SOCKET={stack.socket}
export FTD_TEST_LOG={log}
export FTD_TEST_MAX_S=600
export PYTHONPATH={REPO}
exec {sys.executable} {REPO}/tests/e2e/trainer_job.py
"""
    job = stack.slurm.sbatch(script, "--requeue", "-w", "node-1", "--job-name=ftd-crash-loop")
    stack.slurm.wait_job_state(job, "RUNNING", 30)
    stack.wait_registered(job, timeout=60)

    # 1. The first Xid 13: an in-place restart at once (restart 1 of 2, no backoff).
    first = time.time()
    stack.append_kernel_line(XID13.format(t=6110.2, pid=31337))
    wait_until(lambda: len(actions(stack, "checkpoint_restart")) == 1, 30, "the first restart decided")
    wait_until(lambda: running_again(stack, job, log, 1), 90, "the job to run again after restart 1")
    # The restart ends once ftd saw the new run train (its rank registered), not when scontrol returned.
    wait_until(lambda: actions(stack, "checkpoint_restart")[0]["state"] != "running", 30, "restart 1 to end")
    [one] = actions(stack, "checkpoint_restart")
    assert one["state"] == "succeeded", one
    assert one["request"]["params"]["attempt"] == 1 and one["request"]["params"]["delay_s"] == 0.0

    # 2. The same Xid again, 30 s after the first (inside the 60 s incident window, but the job was
    # restarted in between): a new occurrence, restart 2 of 2 after the crash-loop backoff; the
    # 600 s cooldown of restart 1 does not hold it back.
    wait_until(lambda: time.time() - first >= 30, 40, "30 s after the first Xid")
    assert time.time() - first < 50, "the second Xid must land inside the first one's 60 s window"
    stack.append_kernel_line(XID13.format(t=6140.2, pid=31338))
    wait_until(lambda: len(actions(stack, "checkpoint_restart")) == 2, 30, "a decision on the second Xid 13")
    two = actions(stack, "checkpoint_restart")[1]
    assert two["state"] != "suppressed", two
    assert two["request"]["params"]["attempt"] == 2, two
    assert two["request"]["params"]["delay_s"] == BACKOFF_S, two
    wait_until(lambda: actions(stack, "checkpoint_restart")[1]["state"] == "succeeded", 60, "restart 2 done")
    two = actions(stack, "checkpoint_restart")[1]
    assert two["detail"]["requeued"]["delayed_s"] == BACKOFF_S, two
    # The backoff really acted: the requeue came at least BACKOFF_S after the ranks had stopped.
    assert two["detail"]["requeued_at"] - two["detail"]["stopped_at"] >= BACKOFF_S - 0.5, two["detail"]
    wait_until(lambda: running_again(stack, job, log, 2), 90, "the job to run again after restart 2")

    # 3. Once more: the limit (2 restarts) is reached: a notification naming the signature, the job
    # is not restarted again, and nothing is drained.
    wait_until(lambda: time.time() - first >= 60 + 12, 60, "past the storm window")
    stack.append_kernel_line(XID13.format(t=6200.2, pid=31339))
    wait_until(
        lambda: any("crash loop" in a["request"]["reason"] for a in actions(stack, "notify")),
        30,
        "the crash-loop notification",
    )
    [loop] = [a for a in actions(stack, "notify") if "crash loop" in a["request"]["reason"]]
    reason = loop["request"]["reason"]
    assert f"crash loop: xid 13 on job {job}, 2 restarts in 3600 s" in reason, reason
    assert loop["state"] == "logged", loop  # no notify destination configured: the journal only
    time.sleep(3)
    assert len(actions(stack, "checkpoint_restart")) == 2
    assert restarts(stack, job) == 2
    assert stack.slurm.job(job).get("JobState") == "RUNNING"
    assert actions(stack, "drain_node") == []
    assert "DRAIN" not in stack.slurm.node("node-1").get("State", "")
