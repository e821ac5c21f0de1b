"""Xid 48 on a node running a job, on real Slurm: save -> ack -> stop -> GPU reset -> requeue.

Real Mosquitto, real Slurm (slurmctld + slurmd for node-1), ``ftd agent`` and ``ftd coordinator``
subprocesses (:mod:`tests.e2e.stack`), the e2e trainer (:mod:`tests.e2e.trainer_job`) as a
``--requeue`` batch job, and the built-in Xid rule (Xid 48 alone: checkpoint_restart of the job
excluding the node, then gpu_reset of the GPU). Only ``nvidia-smi`` is fake: a script first on the
agent's ``PATH`` that lists one GPU and, as its compute processes, the trainer's pid while that
process lives (the batch script records ``$$`` and ``exec``s the trainer, so the pid *is* the
trainer), and logs each reset. The agent's real refusal logic (:mod:`ftd.agent.gpu_reset`) decides.

Before plans, the reset reached the agent while the trainer held the GPU; it was refused and never
tried again. Here the order is asserted from the ledger (the actions' details, the agent's
``gpu_health`` events) and the trainer's own log.
"""

from __future__ import annotations

import json
import os
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

XID48 = (
    "[ 7110.203311] NVRM: Xid (PCI:0000:3b:00): 48, pid=31337, name=python, An uncorrectable double bit "
    "error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0."
)

FAKE_SMI = """#!{python}
# A fake nvidia-smi for the e2e test: one GPU; its compute processes are the live pids in HOLDERS.
import os, sys, time
HOLDERS, RESETS = {holders!r}, {resets!r}
args = sys.argv[1:]
if args and args[0].startswith("--query-gpu"):
    print("0, 00000000:3B:00.0, GPU-e2e-0000")
elif args and args[0].startswith("--query-compute-apps"):
    for name in sorted(os.listdir(HOLDERS)):
        pid = open(os.path.join(HOLDERS, name)).read().strip()
        if pid and os.path.exists("/proc/" + pid):
            print(pid + ", GPU-e2e-0000")
elif args[:1] == ["-r"]:
    with open(RESETS, "a") as f:
        f.write(repr(time.time()) + " " + " ".join(args) + "\\n")
    if os.path.exists(RESETS + ".fail"):
        print("Unable to reset GPU 00000000:3B:00.0: Unknown Error")
        sys.exit(15)
    print("GPU 00000000:3B:00.0 was successfully reset.")
else:
    sys.exit(2)
"""


@pytest.fixture
def gpu_stack(
    slurm: SlurmCluster, mosquitto: Mosquitto, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Stack, Path, Path]]:
    """The e2e stack with the fake nvidia-smi first on the daemons' PATH."""
    bin_dir, holders, resets = tmp_path / "bin", tmp_path / "gpu-holders", tmp_path / "resets.log"
    bin_dir.mkdir()
    holders.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable, holders=str(holders), resets=str(resets)))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    with make_stack(slurm, mosquitto, tmp_path) as stack:
        yield stack, holders, resets


def submit_gpu_trainer(stack: Stack, holders: Path) -> tuple[str, Path]:
    log = stack.workdir / "trainer.jsonl"
    script = f"""#!/bin/bash
export FTD_SOCKET={stack.socket}
export FTD_TEST_LOG={log}
export PYTHONPATH={REPO}
echo $$ > {holders}/trainer.pid
exec {sys.executable} {REPO}/tests/e2e/trainer_job.py
"""
    job = stack.slurm.sbatch(script, "--requeue", "--job-name=ftd-plan")
    return job, log


def actions(stack: Stack) -> dict[str, tuple[str, dict[str, Any], float]]:
    with sqlite3.connect(stack.ledger) as db:
        rows = db.execute("SELECT kind, state, detail, updated FROM actions").fetchall()
    return {kind: (state, json.loads(detail), updated) for kind, state, detail, updated in rows}


def plans(stack: Stack) -> list[dict[str, Any]]:
    with sqlite3.connect(stack.ledger) as db:
        return [json.loads(body) for (body,) in db.execute("SELECT body FROM plans")]


def test_xid48_saves_stops_then_resets_the_gpu_then_requeues(gpu_stack: tuple[Stack, Path, Path]) -> None:
    stack, holders, resets = gpu_stack
    job, log = submit_gpu_trainer(stack, holders)
    stack.slurm.wait_job_state(job, "RUNNING", 30)
    stack.wait_registered(job, timeout=60)
    wait_until(lambda: any(r["what"] == "started" for r in trainer_records(log)), 30, "the trainer")
    time.sleep(1.5)  # a few presence reports with steps (save_at_step is chosen from them)

    stack.append_kernel_line(XID48)

    def done() -> bool:
        got = actions(stack)
        kinds = ("gpu_reset", "checkpoint_restart")
        return all(k in got and got[k][0] not in ("pending", "running") for k in kinds)

    wait_until(done, 60, "the gpu_reset and checkpoint_restart actions to finish")
    got = actions(stack)
    reset_state, reset, _ = got["gpu_reset"]
    restart_state, restart, _ = got["checkpoint_restart"]
    assert reset_state == "succeeded", reset
    assert restart_state == "succeeded", restart

    # The trainer saved (acked) and stopped; only then did anything touch the GPU.
    records: list[dict[str, Any]] = trainer_records(log)
    saved = [r for r in records if r["what"] == "saved"]
    stopped = [r for r in records if r["what"] == "stopped"]
    assert len(saved) == 1 and len(stopped) == 1, records
    assert restart["saved"] == {"0": {"step": saved[0]["step"], "path": saved[0]["path"]}}
    attempts = reset["attempts"]
    assert attempts[-1]["ok"] is True and all(a["ok"] is False for a in attempts[:-1]), attempts
    assert all("refused" in a["reason"] for a in attempts[:-1])  # only the exiting trainer held it
    assert float(saved[0]["t"]) <= float(stopped[0]["t"]) <= restart["stopped_at"] <= attempts[0]["ts"]

    # Exactly one real reset, by the agent, logged by the fake nvidia-smi and reported as an event.
    reset_lines = resets.read_text().splitlines() if resets.exists() else []
    assert len(reset_lines) == 1 and reset_lines[0].split()[1:] == ["-r", "-i", "0000:3b:00.0"], reset_lines
    reset_at = float(reset_lines[0].split()[0])
    events: list[dict[str, Any]] = stack.ledger_events("gpu_health")
    health = [e for e in events if e["data"].get("result") == "reset_ok"]
    assert len(health) == 1 and health[0]["data"]["directive_id"] == reset["directive_id"]

    # Then the requeue: after the reset, with node-1 excluded (the job stays PENDING: no other slurmd).
    assert restart["phases_done"] == ["stop", "requeue", "restart", "resume"]  # not in place: not followed
    assert reset_at <= restart["requeued_at"]
    assert restart["requeued"]["exclude"] == ["node-1"]
    info = stack.slurm.job(job)
    assert info.get("JobState") == "PENDING" and int(info.get("Restarts", "0")) == 1, info
    assert "node-1" in info.get("ExcNodeList", ""), info
    assert "DRAIN" not in stack.slurm.node("node-1").get("State", "")  # a reset, not a drain

    # The plan as the ledger recorded it: the reset after the job's stop, the requeue after the reset.
    (plan,) = plans(stack)
    assert plan["state"] == "finished"
    steps = {s["kind"]: s for s in plan["steps"]}
    assert reset["plan"] == restart["plan"] == plan["id"]
    assert steps["gpu_reset"]["after"] == {"0": [[steps["checkpoint_restart"]["action"], 0]]}
    assert steps["checkpoint_restart"]["after"] == {"1": [[steps["gpu_reset"]["action"], 0]]}


def test_xid48_whose_reset_fails_is_escalated_reboot_refused_then_drained_for_rma(
    gpu_stack: tuple[Stack, Path, Path],
) -> None:
    """The reset itself fails (nvidia-smi -r exits non-zero): the coordinator asks Slurm for
    ``scontrol reboot ASAP nextstate=RESUME``; this test cluster has no RebootProgram, so slurmctld
    refuses, and the node is drained for RMA instead, with the reason saying why."""
    stack, holders, resets = gpu_stack
    Path(str(resets) + ".fail").touch()
    job, log = submit_gpu_trainer(stack, holders)
    stack.slurm.wait_job_state(job, "RUNNING", 30)
    stack.wait_registered(job, timeout=60)
    wait_until(lambda: any(r["what"] == "started" for r in trainer_records(log)), 30, "the trainer")

    stack.append_kernel_line(XID48)

    def done() -> bool:
        got = actions(stack)
        kinds = ("gpu_reset", "checkpoint_restart")
        return all(k in got and got[k][0] not in ("pending", "running") for k in kinds)

    wait_until(done, 60, "the gpu_reset and checkpoint_restart actions to finish")
    reset_state, reset, _ = actions(stack)["gpu_reset"]
    assert reset_state == "escalated", reset
    assert reset["escalation"] == "drain" and reset["refused"] is False, reset
    assert "scontrol" in reset["reboot_error"] and "nextstate=RESUME" in reset["reboot_error"], reset
    assert reset["agent_reason"].startswith("failed: nvidia-smi -r exit 15")
    node = stack.slurm.node("node-1")
    assert "DRAIN" in node.get("State", ""), node
    assert node.get("Reason", "").startswith("ftd: gpu 0000:3b:00.0 reset not done, reboot impossible: RMA")
    restart_state, restart, _ = actions(stack)["checkpoint_restart"]
    assert restart_state == "succeeded" and restart["requeued"]["exclude"] == ["node-1"], restart
    assert len(resets.read_text().splitlines()) == 1  # a failed reset is escalated, not tried again
