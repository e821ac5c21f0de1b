"""A job without the client is moved by Slurm's signal convention (issue #12), on the real Slurm of
:mod:`tests.e2e.test_slurm_hooks` (its Prolog/Epilog make the job known), real Mosquitto, ``ftd agent``
and ``ftd coordinator`` processes.

An Xid 79 on node-1 while a ``--requeue`` batch job that never registers with ftd runs there: the
coordinator's checkpoint_restart finds no rank and falls back to ``scancel --signal=USR1 --batch``,
waits up to the grace period (``coordinator.slurm.clientless.grace_s``, 6 s here), then requeues
the job with node-1 excluded (node-1 is also drained).

- A job whose script traps SIGUSR1 writes its checkpoint and requeues itself (``scontrol requeue``):
  the action succeeds, the detail says it requeued itself, Restarts is 1 (ftd's requeue of the now
  pending job only adds the exclusion).
- A job that ignores SIGUSR1 is still running after the grace period: the action is escalated
  (``signal_ignored``) and ftd's requeue moves it anyway (Restarts 1, node-1 excluded).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.stack import XID79, wait_until
from tests.e2e.test_slurm_hooks import Hooked, hooked, hooked_cluster, hooked_stack, job_of
from tests.realparts import Mosquitto

pytestmark = [pytest.mark.real, pytest.mark.slow]
__all__ = ["hooked", "hooked_cluster"]  # fixtures, imported for pytest

GRACE_S = 6
CLIENTLESS = f"""
[coordinator.slurm.clientless]
grace_s = {GRACE_S}
poll_s = 0.2
"""


def actions(port: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/actions?limit=50", timeout=10) as resp:
        result: list[dict[str, Any]] = json.load(resp)
    return result


def restart_action(port: int, job: str) -> dict[str, Any] | None:
    done = [
        a
        for a in actions(port)
        if a["kind"] == "checkpoint_restart"
        and a["target"] == job
        and a["state"] in ("succeeded", "escalated", "failed")
    ]
    return done[0] if done else None


def run_xid79_on(
    hooked: Hooked, mosquitto: Mosquitto, tmp_path: Path, script: str
) -> tuple[str, dict[str, Any]]:
    with hooked_stack(hooked, mosquitto, tmp_path, coordinator_extra=CLIENTLESS, stop_deadline_s=5) as (
        stack,
        port,
    ):
        hooked.configure(stack.socket)
        job = hooked.slurm.sbatch(script, "--requeue", "--job-name=no-client")
        # the job starting, its Prolog and the agent: seconds, over 30 s at load 14 (helpers at work)
        wait_until(lambda: job_of(port, job) is not None, 90, f"job {job} known to the coordinator")
        assert job_of(port, job)["ranks"] == []  # type: ignore[index]
        wait_until(lambda: (tmp_path / "started").exists(), 30, "the job's script running")
        stack.append_kernel_line(XID79)
        wait_until(lambda: restart_action(port, job) is not None, 60, "checkpoint_restart finished")
        action = restart_action(port, job)
        assert action is not None
        return job, action


def test_a_job_trapping_usr1_checkpoints_and_requeues_itself(
    hooked: Hooked, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    script = f"""#!/bin/bash
save_and_requeue() {{
    echo "restart ${{SLURM_RESTART_COUNT:-0}}" > {tmp_path}/ckpt
    scontrol requeue $SLURM_JOB_ID
    exit 0
}}
trap save_and_requeue USR1
touch {tmp_path}/started
while true; do sleep 0.2; done
"""
    job, action = run_xid79_on(hooked, mosquitto, tmp_path, script)
    assert (tmp_path / "ckpt").read_text().strip() == "restart 0"
    assert action["state"] == "succeeded", action
    detail = action["detail"]
    assert detail["ranks"] == []
    assert detail["clientless"]["signal"] == "USR1" and detail["clientless"]["mode"] == "batch"
    assert detail["clientless"]["requeued_itself"] is True
    assert detail["clientless"]["waited_s"] < GRACE_S
    assert detail["requeued"]["exclude"] == ["node-1"]
    info = hooked.slurm.wait_job_state(job, "PENDING", 30)  # requeued (through COMPLETING)
    assert info["Restarts"] == "1", info
    assert "node-1" in info["ExcNodeList"]
    assert "DRAIN" in hooked.slurm.node("node-1")["State"]


def test_a_job_ignoring_usr1_is_requeued_after_the_grace_period_and_escalated(
    hooked: Hooked, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    script = f"""#!/bin/bash
trap '' USR1
touch {tmp_path}/started
while true; do sleep 0.2; done
"""
    job, action = run_xid79_on(hooked, mosquitto, tmp_path, script)
    assert action["state"] == "escalated", action
    detail = action["detail"]
    assert detail["clientless"]["signal_ignored"] is True
    assert detail["clientless"]["job_state"] == "RUNNING"
    assert detail["requeued"]["exclude"] == ["node-1"]
    info = hooked.slurm.wait_job_state(job, "PENDING", 30)  # requeued (through COMPLETING)
    assert info["Restarts"] == "1", info
    assert "node-1" in info["ExcNodeList"]
