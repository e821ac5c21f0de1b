"""ftd's in-place restart is followed until the job trains again (issue #20, Deliver 1), real Slurm.

Real Mosquitto, real Slurm (slurmctld + slurmd for node-1), ``ftd agent`` and ``ftd coordinator``
subprocesses (:mod:`tests.e2e.stack`) and the e2e trainer (:mod:`tests.e2e.trainer_job`) as a
``--requeue`` batch job. An Xid 13 (an application fault) makes ftd save, stop and requeue the job in
place (same job id, same node).

The report: the action said *succeeded* as soon as ``scontrol requeue`` returned, whatever became of
the job. Here the batch script's second run (``SLURM_RESTART_COUNT`` 1) exits 1 at once, before its
rank registers: the restart must be *escalated*, with a sentence saying what was seen, and notified.
A restart whose new run registers records ``resumed_at`` (and the step the new run reported).
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.daemons import REPO
from tests.e2e.stack import Stack, make_stack, trainer_records, wait_until
from tests.realparts import Mosquitto, SlurmCluster

pytestmark = [pytest.mark.real, pytest.mark.slow]

XID13 = (
    "[ 6110.200000] NVRM: Xid (PCI:0000:3b:00): 13, pid=31337, name=python, Graphics SM Warp Exception "
    "on (GPC 0, TPC 0, SM 0): Out Of Range Address"
)


@pytest.fixture
def restart_stack(slurm: SlurmCluster, mosquitto: Mosquitto, tmp_path: Path) -> Iterator[Stack]:
    with make_stack(slurm, mosquitto, tmp_path) as built:
        yield built


def actions(stack: Stack, kind: str) -> list[dict[str, Any]]:
    with sqlite3.connect(stack.ledger) as db:
        rows = db.execute(
            "SELECT state, request, detail FROM actions WHERE kind = ? ORDER BY created", (kind,)
        ).fetchall()
    return [{"state": s, "request": json.loads(r), "detail": json.loads(d) if d else {}} for s, r, d in rows]


def submit(stack: Stack, *, second_run_fails: bool) -> tuple[str, Path]:
    log = stack.workdir / "trainer.jsonl"
    broken = (
        'if [ "${SLURM_RESTART_COUNT:-0}" -ge 1 ]; then echo "second run: broken environment" >&2; exit 1; fi'
        if second_run_fails
        else ""
    )
    script = f"""#!/bin/bash
{broken}
export FTD_SOCKET={stack.socket}
export FTD_TEST_LOG={log}
export FTD_TEST_MAX_S=600
export PYTHONPATH={REPO}
exec {sys.executable} {REPO}/tests/e2e/trainer_job.py
"""
    job = stack.slurm.sbatch(script, "--requeue", "-w", "node-1", "--job-name=ftd-followed")
    stack.slurm.wait_job_state(job, "RUNNING", 30)
    stack.wait_registered(job, timeout=60)
    return job, log


def finished(stack: Stack) -> bool:
    got = actions(stack, "checkpoint_restart")
    return len(got) == 1 and got[0]["state"] not in ("pending", "running")


def test_a_restart_whose_new_run_fails_before_registering_is_escalated_and_notified(
    restart_stack: Stack,
) -> None:
    stack = restart_stack
    job, log = submit(stack, second_run_fails=True)
    stack.append_kernel_line(XID13)
    wait_until(lambda: finished(stack), 120, "the in-place restart to end")
    [restart] = actions(stack, "checkpoint_restart")
    detail = restart["detail"]
    assert restart["state"] == "escalated", restart
    assert detail["requeued"]["exclude"] == [] and "requeued_at" in detail, detail
    assert detail["phases_done"] == ["stop", "requeue", "restart", "resume"], detail
    assert "resumed_at" not in detail, detail
    sentence = detail["not_resumed"]
    assert sentence.startswith(f"job {job} did not train again after ftd restarted it in place:"), sentence
    assert "FAILED" in sentence and "no rank registered" in sentence, sentence
    assert stack.slurm.job(job).get("JobState") == "FAILED"
    wait_until(
        lambda: any(a["request"]["reason"] == sentence for a in actions(stack, "notify")),
        20,
        "the notification of the restart that did not resume",
    )
    [note] = [a for a in actions(stack, "notify") if a["request"]["reason"] == sentence]
    assert note["state"] == "logged" and note["request"]["target"] == job, note  # no destination set
    assert len([r for r in trainer_records(log) if r["what"] == "started"]) == 1


def test_a_restart_whose_new_run_registers_records_when_it_resumed(restart_stack: Stack) -> None:
    stack = restart_stack
    job, log = submit(stack, second_run_fails=False)
    stack.append_kernel_line(XID13)
    wait_until(lambda: finished(stack), 120, "the in-place restart to end")
    [restart] = actions(stack, "checkpoint_restart")
    detail = restart["detail"]
    assert restart["state"] == "succeeded", restart
    assert detail["phases_done"] == ["stop", "requeue", "restart", "resume"], detail
    assert detail["resumed_at"] >= detail["requeued_at"], detail
    assert "not_resumed" not in detail and "waiting" not in detail, detail
    assert [r["what"] for r in trainer_records(log)].count("started") == 2
    info = stack.slurm.job(job)
    assert info.get("JobState") == "RUNNING" and info.get("Restarts") == "1", info
