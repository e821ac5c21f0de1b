"""Issue #20, item 2: a node that restarts its agent is not a dead node.

Real Slurm, the broker as shipped (deploy/mosquitto config and ACL), ``ftd agent`` and ``ftd
coordinator`` subprocesses (:mod:`tests.e2e.shipped_stack`) and the README's training loop as a
``--requeue`` batch job registered through the real client.

- A ``systemctl restart``-style restart of the agent (SIGTERM, then started again) while the job
  trains: the agent says it stopped cleanly (retained status ``stopped``, not its Last Will), the
  coordinator waits ``coordinator.offline_grace.clean_stop_s`` for it, the agent is back well
  within it, and nothing is done: no ``node_offline``, no ``node_death``, the job never stops and
  the node is not excluded. (Before the fix: node_offline -> node_death -> stop + requeue with the
  node excluded, at once.)
- A real death (SIGKILL of the agent, the node silent past ``last_will_s``) still acts.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.daemons import REPO
from tests.e2e.shipped_stack import ShippedStack, make_shipped_stack, records, wait_until
from tests.realparts import SlurmCluster, free_port

pytestmark = [pytest.mark.real, pytest.mark.slow]

GRACE = "\n[coordinator.offline_grace]\nlast_will_s = 4\nclean_stop_s = 60\n"


@pytest.fixture
def stack(slurm: SlurmCluster, tmp_path: Path):  # type: ignore[no-untyped-def]
    with make_shipped_stack(slurm, tmp_path, coordinator_extra=GRACE) as built:
        yield built


def start_job(stack: ShippedStack) -> tuple[str, Path]:
    log, ckpt = stack.workdir / "readme.jsonl", stack.workdir / "ckpt"
    job = stack.sbatch_python(
        "restart",
        REPO / "tests" / "e2e" / "readme_loop.py",
        {"FTD_TEST_LOG": str(log), "FTD_TEST_CKPT": str(ckpt), "FTD_TEST_MAX_S": "300"},
    )
    stack.slurm.wait_job_state(job, "RUNNING", 60)
    wait_until(lambda: stack.agent_log_records("local_api_rank_registered"), 60, "the rank to register")
    wait_until(lambda: len(records(log, "training", run=0)) >= 3, 60, "the job to train")
    return job, log


def test_a_clean_agent_restart_is_not_a_node_death(stack: ShippedStack) -> None:
    job, log = start_job(stack)
    try:
        assert stack.agent.stop(signal.SIGTERM) == 0  # systemctl restart: stop ...
        wait_until(
            lambda: stack.coordinator_records("node_status")[-1].get("state") != "online", 30, "the stop"
        )
        assert stack.coordinator_records("node_status")[-1]["state"] == "stopped"
        stack.agent.start()  # ... and start
        wait_until(
            lambda: stack.coordinator_records("node_status")[-1].get("state") == "online", 60, "the return"
        )
        wait_until(
            lambda: len(stack.agent_log_records("local_api_rank_registered")) >= 2, 60, "re-registration"
        )
        trained = len(records(log, "training", run=0))
        wait_until(lambda: len(records(log, "training", run=0)) >= trained + 10, 60, "training on")
        time.sleep(6)  # past last_will_s: nothing is pending that could still fire

        assert [r for r in stack.coordinator_records("action_decided") if r.get("rule") == "node_death"] == []
        assert stack.ledger_events("node_offline") == []
        assert records(log, "left_loop") == [] and records(log, "started", run=1) == []
        assert stack.coordinator_records("offline_grace_cancelled"), "the grace's end is logged"
        info = stack.slurm.job(job)
        assert info.get("JobState") == "RUNNING" and info.get("Restarts") == "0", info
        assert info.get("ExcNodeList", "") in ("", "(null)"), info
    finally:
        stack.slurm.run("scancel", job, check=False)


def test_a_dead_agent_past_the_grace_is_still_a_node_death(stack: ShippedStack) -> None:
    job, _ = start_job(stack)
    try:
        stack.agent.stop(signal.SIGKILL)  # no clean stop: the broker sends the Last Will
        wait_until(
            lambda: stack.coordinator_records("node_status")[-1].get("state") == "offline", 60, "the will"
        )
        wait_until(lambda: stack.ledger_events("node_offline"), 60, "node_offline after the grace")
        offline = stack.ledger_events("node_offline")
        assert len(offline) == 1 and offline[0]["data"]["jobs"] == [job], offline
        assert offline[0]["data"]["grace_s"] == 4 and offline[0]["data"]["why"] == "last_will", offline
        wait_until(
            lambda: [r for r in stack.coordinator_records("action_decided") if r.get("rule") == "node_death"],
            30,
            "node_death to act",
        )
    finally:
        stack.slurm.run("scancel", job, check=False)


def test_a_pending_offline_survives_a_coordinator_restart(stack: ShippedStack) -> None:
    """Decided: a coordinator restarted during the grace re-reads the retained status and grants a
    full grace from then (it cannot tell how long the node has been gone): a node back within it
    costs nothing; a node still gone is acted on, once. (Before: a restarted coordinator ignored a
    retained ``offline`` altogether, so a node that died meanwhile was never acted on.)"""
    job, _ = start_job(stack)
    try:
        stack.agent.stop(signal.SIGKILL)  # the Last Will: grace 4 s
        wait_until(lambda: stack.coordinator_records("offline_grace_started"), 60, "the grace to start")
        stack.coordinator.stop(signal.SIGTERM)  # ... and the coordinator restarts within it
        stack.coordinator.start()
        wait_until(
            lambda: len(stack.coordinator_records("offline_grace_started")) >= 2, 60, "the grace again"
        )
        again = stack.coordinator_records("offline_grace_started")[-1]
        assert again["after_restart"] is True and again["why"] == "last_will", again
        wait_until(lambda: stack.ledger_events("node_offline"), 60, "node_offline after the restarted grace")
        time.sleep(3)
        offline = stack.ledger_events("node_offline")
        assert len(offline) == 1 and offline[0]["data"]["jobs"] == [job], offline
    finally:
        stack.slurm.run("scancel", job, check=False)


def test_a_save_asked_while_the_agent_restarts_reaches_the_ranks_once_it_is_back(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """A directive sent while the node's agent is restarting is not lost: the agent's session is
    persistent (QoS 1, a stable client id), the broker queues the job's save for it, and the ranks,
    registered again, save, ack and restart from that step. The save is asked through the API (an
    operator's restart of the job) while the agent is stopped."""
    token = tmp_path / "api.token"
    token.write_text("drill-token\n")
    port = free_port()
    api = f'\n[coordinator.api]\nport = {port}\ntoken_file = "{token}"\n'
    with make_shipped_stack(slurm, tmp_path, coordinator_extra=GRACE + api) as stack:
        job, log = start_job(stack)
        try:
            assert stack.agent.stop(signal.SIGTERM) == 0
            stopped = lambda: stack.coordinator_records("node_status")[-1].get("state") == "stopped"  # noqa: E731
            wait_until(stopped, 30, "the stop")
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/jobs/{job}/restart",
                data=json.dumps({"by": "ops", "reason": "restart while the agent restarts"}).encode(),
                headers={"Authorization": "Bearer drill-token", "Content-Type": "application/json"},
                method="POST",
            )
            with urllib.request.urlopen(request, timeout=30) as answer:
                assert answer.status == 202, answer.read()
            time.sleep(2)  # the save is out on the bus, the agent still away
            assert records(log, "saved") == []
            stack.agent.start()
            wait_until(lambda: records(log, "saved", run=0), 90, "the first run to save")
            wait_until(lambda: records(log, "started", run=1), 90, "the restarted run")
            [saved] = records(log, "saved", run=0)
            [started] = records(log, "started", run=1)
            assert started["start"] == saved["step"] + 1, (saved, started)
            assert stack.coordinator_records("save_incomplete_stopping_anyway") == []
            assert stack.ledger_events("node_offline") == []
            info = stack.slurm.job(job)
            assert info.get("Restarts") == "1" and info.get("ExcNodeList", "") in ("", "(null)"), info
        finally:
            stack.slurm.run("scancel", job, check=False)
