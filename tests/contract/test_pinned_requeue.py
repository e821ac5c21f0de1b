"""An impossible requeue is detected at once (issue #20, item 6), on a real Slurm 22.05.

A job submitted pinned to its node (``sbatch -w node-1``) and requeued by ftd with node-1 excluded
can never run again: Slurm leaves it ``PENDING (BadConstraints)`` forever, and before the fix ftd
called the restart a success. Now checkpoint_restart reads the job's required nodes first, refuses
to exclude a node the job is pinned to, says so in the action (escalated, ``exclude_refused``) and
the requeued job can run again once the node is back.

That requeue-and-wait holds for a node out of service (drained: the rule drains it, or an operator
did). A node that stays in service (issue #31, item 3: a condition that moves jobs without draining
the node) would take the job straight back: the job is held instead (``coordinator.pinned_jobs =
"hold"``), or not requeued (``"stop"``); the full loop, with its release, is
``tests/e2e/test_pinned_hold_slurm.py``.
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


def _executor(slurm: SlurmCluster, policy: str = "hold") -> CheckpointRestart:
    return CheckpointRestart(
        publish=_publish,
        state=ClusterState(),
        acks=AckBook(),
        scheduler=SlurmScheduler(slurm_conf=str(slurm.conf_path)),
        save_deadline_s=5,
        stop_deadline_s=5,
        pinned_policy=policy,
    )


def _record(job: str) -> ActionRecord:
    request = ActionRequest(
        kind=ActionKind.CHECKPOINT_RESTART,
        target=job,
        reason="xid 79 on node-1",
        params={"node": "node-1", "exclude": ["node-1"]},
        rule="xid_catalog",
    )
    return ActionRecord(id="act-pinned", request=request, state=ActionState.RUNNING)


def test_a_requeue_that_excludes_the_node_a_job_is_pinned_to_is_refused_and_reported(
    slurm: SlurmCluster,
) -> None:
    job = slurm.sbatch(None, "--requeue", "-w", "node-1", wrap="sleep 300")
    slurm.wait_job_state(job, "RUNNING", 30)
    # The node is out of service (the rule's drain, or an operator's): the job waits for it.
    slurm.run("scontrol", "update", "nodename=node-1", "state=drain", "reason=xid 79")
    detail = asyncio.run(_executor(slurm)(_record(job)))

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
    assert detail["pinned"]["action"] == "wait" and "out of service" in refused["why"], detail
    # Back in service, it runs again on its node.
    slurm.run("scontrol", "update", "nodename=node-1", "state=resume")
    slurm.wait_job_state(job, "RUNNING", 30)


def test_a_pinned_job_whose_node_stays_in_service_is_held_not_requeued_onto_it(slurm: SlurmCluster) -> None:
    job = slurm.sbatch(None, "--requeue", "-w", "node-1", wrap="sleep 300")
    slurm.wait_job_state(job, "RUNNING", 30)
    detail = asyncio.run(_executor(slurm, "hold")(_record(job)))
    pinned = detail["pinned"]
    assert pinned["action"] == "hold" and pinned["nodes"] == ["node-1"], pinned
    assert "stays in service" in pinned["why"] and "stays held until someone releases it" in pinned["why"]
    assert pinned["waits_for"] == {"node-1": []}, pinned  # no agent: nothing known to wait for
    assert detail["requeued"] is None and detail.get("state") == "escalated", detail  # for a human
    time.sleep(8)  # a plain requeue would have it running again by now (cred_expire=5)
    info = slurm.job(job)
    assert info.get("JobState") == "PENDING" and info.get("Reason") == "job_requeued_in_held_state", info
    assert info.get("Restarts") == "1" and "node-1" not in info.get("ExcNodeList", ""), info


def test_a_pinned_job_is_stopped_without_a_requeue_when_so_configured(slurm: SlurmCluster) -> None:
    job = slurm.sbatch(None, "--requeue", "-w", "node-1", wrap="sleep 300")
    slurm.wait_job_state(job, "RUNNING", 30)
    detail = asyncio.run(_executor(slurm, "stop")(_record(job)))
    pinned = detail["pinned"]
    assert pinned["action"] == "stop" and detail["requeued"] is None, detail
    assert detail.get("state") == "escalated", detail
    # No rank of this job registered with ftd, so nothing answered the stop: the sentence says so.
    assert "no rank of it answered" in pinned["why"] and "may still be running on node-1" in pinned["why"]
    time.sleep(3)
    info = slurm.job(job)
    assert info.get("Restarts") == "0" and info.get("JobState") == "RUNNING", info
