"""Coordinator killed (SIGKILL) in the middle of a checkpoint_restart, then restarted (docs/architecture.md
§11.1: "Coordinator killed mid-action: no action lost or done twice").

Real Mosquitto and Slurm, ``ftd agent`` and ``ftd coordinator`` as subprocesses (the spine test's
stack), and a trainer whose checkpoint takes seconds. The coordinator dies after the ``save``
directive went out and before the trainer acked; the ack is published while no coordinator runs.
The restarted coordinator must resume the action from the ledger, see the ack it missed (its MQTT
session is persistent, so the broker kept the QoS 1 ack for it), stop the trainer and requeue the
job once; the node is drained once; the event is evaluated once.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.daemons import REPO
from tests.e2e.test_spine import XID79, Stack, stack, trainer_records, wait_until

__all__ = ["stack"]  # the fixture, imported from the spine test

pytestmark = [pytest.mark.real, pytest.mark.slow]

SAVE_DELAY_S = 3.0


def submit_slow_trainer(stack: Stack) -> tuple[str, Path]:
    log = stack.workdir / f"trainer-slow-{time.monotonic_ns()}.jsonl"
    script = f"""#!/bin/bash
export FTD_SOCKET={stack.socket}
export FTD_TEST_LOG={log}
export FTD_TEST_SAVE_DELAY_S={SAVE_DELAY_S}
export PYTHONPATH={REPO}
exec {sys.executable} {REPO}/tests/e2e/trainer_job.py
"""
    job = stack.slurm.sbatch(script, "--requeue", "--job-name=ftd-crash")
    return job, log


def actions(stack: Stack) -> list[dict[str, Any]]:
    with sqlite3.connect(stack.ledger) as db:
        return [
            {"id": i, "kind": k, "state": s, "detail": json.loads(d)}
            for i, k, s, d in db.execute("SELECT id, kind, state, detail FROM actions ORDER BY created")
        ]


def test_coordinator_killed_mid_checkpoint_restart_resumes_and_finishes_once(stack: Stack) -> None:
    job, log = submit_slow_trainer(stack)
    stack.slurm.wait_job_state(job, "RUNNING", 30)
    stack.wait_registered(job)

    stack.append_kernel_line(XID79)
    whats = lambda: [r["what"] for r in trainer_records(log)]  # noqa: E731
    wait_until(lambda: "save_requested" in whats(), 30, "the save directive to reach the trainer")

    # Mid-action: the save is out, the ack is not. Kill the coordinator without a chance to clean up.
    assert "saved" not in whats()
    stack.coordinator.stop(signal.SIGKILL)
    before = {a["kind"]: a for a in actions(stack)}
    assert before["checkpoint_restart"]["state"] == "running", before

    # The trainer acks while no coordinator is there to hear it.
    wait_until(lambda: "saved" in whats(), SAVE_DELAY_S + 10, "the trainer to save and ack")
    time.sleep(0.5)
    assert stack.slurm.job(job).get("JobState") == "RUNNING"  # nobody requeued it yet

    stack.coordinator.start()
    wait_until(lambda: "stopped" in whats(), 30, "the resumed action to stop the trainer")

    def requeued() -> bool:
        info = stack.slurm.job(job)
        return info.get("JobState") == "PENDING" and int(info.get("Restarts", "0")) >= 1

    wait_until(requeued, 30, "the job to be requeued")

    def restart_done() -> bool:
        return any(a["kind"] == "checkpoint_restart" and a["state"] != "running" for a in actions(stack))

    wait_until(restart_done, 15, "the checkpoint_restart to be recorded as finished")
    time.sleep(1.0)  # anything done twice would show up now

    final = actions(stack)
    assert sorted(a["kind"] for a in final) == ["checkpoint_restart", "drain_node"], final  # nothing doubled
    by_kind = {a["kind"]: a for a in final}
    restart = by_kind["checkpoint_restart"]
    assert restart["id"] == before["checkpoint_restart"]["id"]  # the same action, resumed
    assert restart["state"] == "succeeded", restart
    assert restart["detail"]["resumed"] == 1
    saved_steps = [r["step"] for r in trainer_records(log) if r["what"] == "saved"]
    assert len(saved_steps) == 1  # the trainer saved once: the re-sent save directive was not re-delivered
    assert restart["detail"]["saved"]["0"]["step"] == saved_steps[0]  # the ack sent during the outage
    assert by_kind["drain_node"]["state"] == "succeeded"

    info = stack.slurm.job(job)
    assert int(info["Restarts"]) == 1 and "node-1" in info.get("ExcNodeList", "")
    node = stack.slurm.node("node-1")
    assert "DRAIN" in node.get("State", "") and node.get("Reason", "").startswith("ftd: xid 79")
    assert [e["data"]["code"] for e in stack.ledger_events("xid")] == [79]  # type: ignore[index]

    log_text = stack.coordinator.log()
    # Both resumed: the drain is planned after the job's save and stop, so it was still waiting at the
    # kill (draining first would evict the job's ranks mid-save on Kubernetes).
    resuming = [json.loads(line) for line in log_text.splitlines() if '"action_resuming"' in line]
    assert sorted(r["kind"] for r in resuming) == ["checkpoint_restart", "drain_node"]
    decided = [json.loads(line) for line in log_text.splitlines() if '"action_decided"' in line]
    assert sorted(d["kind"] for d in decided) == ["checkpoint_restart", "drain_node"]  # decided once each
