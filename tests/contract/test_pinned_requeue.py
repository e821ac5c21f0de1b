"""An impossible requeue is detected at once (issue #20, item 6), on a real Slurm 22.05.

A job submitted pinned to its node (``sbatch -w node-1``) and requeued by ftd with node-1 excluded
can never run again: Slurm leaves it ``PENDING (BadConstraints)`` forever, and before the fix ftd
called the restart a success. Now checkpoint_restart reads the job's required nodes first, refuses
to exclude a node the job is pinned to, says so in the action (escalated, ``exclude_refused``) and
the requeued job can run again once the node is back.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.checkpoint_restart import CheckpointRestart
from ftd.coordinator.actions.slurm import SlurmScheduler
from ftd.coordinator.model.state import ClusterState
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState
from tests.realparts import SlurmCluster

pytestmark = [pytest.mark.real]


async def _publish(topic: str, payload: bytes) -> None:
    return None


def test_a_requeue_that_excludes_the_node_a_job_is_pinned_to_is_refused_and_reported(
    slurm: SlurmCluster,
) -> None:
    job = slurm.sbatch(None, "--requeue", "-w", "node-1", wrap="sleep 300")
    slurm.wait_job_state(job, "RUNNING", 30)
    scheduler = SlurmScheduler(slurm_conf=str(slurm.conf_path))
    executor = CheckpointRestart(
        publish=_publish,
        state=ClusterState(),
        acks=AckBook(),
        scheduler=scheduler,
        save_deadline_s=5,
        stop_deadline_s=5,
    )
    request = ActionRequest(
        kind=ActionKind.CHECKPOINT_RESTART,
        target=job,
        reason="xid 79 on node-1",
        params={"node": "node-1", "exclude": ["node-1"]},
        rule="xid_catalog",
    )
    record = ActionRecord(id="act-pinned", request=request, state=ActionState.RUNNING)
    detail = asyncio.run(executor(record))

    info = slurm.job(job)
    assert "node-1" not in info.get("ExcNodeList", ""), info  # not made impossible
    assert detail.get("state") == "escalated", detail
    refused = detail["exclude_refused"]
    assert refused["nodes"] == ["node-1"], refused
    assert "pinned" in refused["why"] and "node-1" in refused["why"], refused
    assert detail["requeued"]["exclude"] == [], detail
    # The job is requeued (Restarts=1) and is not stuck on BadConstraints.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and slurm.job(job).get("Restarts") != "1":
        time.sleep(0.2)
    info = slurm.job(job)
    assert info.get("Restarts") == "1" and info.get("Reason") != "BadConstraints", info
