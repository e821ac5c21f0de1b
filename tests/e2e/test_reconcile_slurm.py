"""ftd's drains match Slurm's: an operator's resume is honoured, a restarted coordinator remembers.

Real Slurm (slurmctld + slurmd), real Mosquitto, two ``ftd agent`` processes (node-1, node-2: Slurm
knows node-2 without a slurmd, it can still be drained and resumed) and a real ``ftd coordinator``
with a drain budget of one node (``max_drained_fraction = 0.5`` of the two nodes it knows) and a
reconciliation every second. Xid 79 ("fallen off the bus") lines are written to each agent's kernel
log file.

The two failures of the report (issue #10), reproduced before the fix:

- after an operator's ``scontrol update nodename=node-2 state=resume`` ftd still counted node-2 as
  drained, so the next real Xid 79 (node-1) was suppressed by the blast-radius budget and a GPU off
  the bus stayed in service;
- after a coordinator restart (``kill -9``, start) it forgot its drain of node-2 and drained node-1
  too, past its budget.

And a job ftd requeued that stays PENDING (excluded from node-1, the only node with a slurmd) past
``pending_alert_s`` (3 s here) raises one alert; meanwhile ``ftd status``, ``--problems`` and
``/v1/jobs`` keep it in view as "pending after requeue, excluding node-1" (issue #32 item 5: it
vanished from them once the restart's action finished) until it is cancelled. A node an operator
drains (``scontrol update state=drain reason=...``) is shown by ``ftd status`` as unavailable with
Slurm's reason and counted in the header (issue #32 item 6: it showed as online with no reason).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ftd.bench.slurm_cluster import free_port
from ftd.bus import topics
from ftd.bus.mqtt import MqttBus
from tests.e2e.daemons import REPO, Daemon
from tests.realparts import Mosquitto, SlurmCluster

pytestmark = [pytest.mark.real]

XID79 = "[ 5021.437112] NVRM: Xid (PCI:0000:3b:00): 79, pid=31337, name=python, GPU has fallen off the bus."


@dataclass
class Cluster:
    slurm: SlurmCluster
    broker: Mosquitto
    coordinator: Daemon
    agents: dict[str, Daemon]
    kmsg: dict[str, Path]
    sockets: dict[str, str]
    ledger: Path
    workdir: Path
    api: str

    def get(self, path: str) -> Any:
        """The coordinator API's JSON answer to ``path``."""
        with urllib.request.urlopen(self.api + path, timeout=5) as response:
            return json.load(response)

    def status(self, *args: str) -> str:
        """``ftd status`` (the real command) against the coordinator's API."""
        done = subprocess.run(
            [sys.executable, "-m", "ftd.cli", "status", "--url", self.api, *args],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def submit_trainer(self) -> str:
        """tests/e2e/trainer_job.py as a --requeue batch job on node-1, talking to node-1's agent."""
        log = self.workdir / f"trainer-{time.monotonic_ns()}.jsonl"
        script = f"""#!/bin/bash
export FTD_SOCKET={self.sockets["node-1"]}
export FTD_TEST_LOG={log}
export PYTHONPATH={REPO}
exec {sys.executable} {REPO}/tests/e2e/trainer_job.py
"""
        return self.slurm.sbatch(script, "--requeue", "--job-name=ftd-reconcile")

    def wait_registered(self, job: str, timeout: float = 20.0) -> None:
        """Until the job's presence (with a rank) is retained on the bus, where the coordinator reads it."""

        async def watch() -> None:
            bus = MqttBus(host="127.0.0.1", port=self.broker.port, client_id=f"rec-{job}", clean_session=True)
            await bus.subscribe(topics.node_job("node-1", job))
            await bus.start()
            try:
                async for message in bus.messages():
                    if message.payload and b'"rank"' in message.payload:
                        return
            finally:
                await bus.stop()

        asyncio.run(asyncio.wait_for(watch(), timeout))
        time.sleep(0.3)  # the coordinator is subscribed to the same retained topic

    def notes(self, problem: str) -> list[dict[str, Any]]:
        """The coordinator's own notes (node ftd-coordinator) with this ``data.problem``."""
        with sqlite3.connect(self.ledger) as db:
            rows = db.execute("SELECT body FROM events WHERE node = 'ftd-coordinator'").fetchall()
        bodies = [json.loads(body) for (body,) in rows]
        return [b for b in bodies if b.get("data", {}).get("problem") == problem]

    def xid79(self, node: str) -> None:
        with self.kmsg[node].open("a") as f:
            f.write(XID79 + "\n")

    def slurm_node(self, node: str) -> dict[str, str]:
        return self.slurm.node(node)

    def drained(self, node: str) -> bool:
        return "DRAIN" in self.slurm_node(node).get("State", "")

    def log_records(self, event: str) -> list[dict[str, Any]]:
        """The coordinator's JSON log lines with this event name (every run of it, in order)."""
        out = []
        for line in self.coordinator.log().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("event") == event:
                    out.append(record)
        return out

    def actions(self, kind: str, target: str) -> list[dict[str, Any]]:
        with sqlite3.connect(self.ledger) as db:
            rows = db.execute(
                "SELECT state, detail FROM actions WHERE kind = ? AND target = ? ORDER BY created",
                (kind, target),
            ).fetchall()
        return [{"state": state, **json.loads(detail)} for state, detail in rows]

    def scheduler_events(self, node: str) -> list[str]:
        with sqlite3.connect(self.ledger) as db:
            rows = db.execute(
                "SELECT body FROM events WHERE node = ? AND kind = 'agent_health' ORDER BY ts", (node,)
            ).fetchall()
        bodies = [json.loads(body) for (body,) in rows]
        return [b["data"]["problem"] for b in bodies if b.get("source") == "scheduler"]


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, cluster: Cluster) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            tail = cluster.coordinator.log()[-3000:]
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{tail}")
        time.sleep(0.1)


def coordinator_config(mosquitto: Mosquitto, slurm: SlurmCluster, ledger: Path, api_port: int) -> str:
    return f"""
[bus]
host = "127.0.0.1"
port = {mosquitto.port}
keepalive_s = 2
reconnect_max_s = 1.0

[coordinator]
ledger_path = "{ledger}"
scheduler = "slurm"
reconcile_interval_s = 1.0
pending_alert_s = 3.0
save_deadline_s = 20
stop_deadline_s = 20

[coordinator.slurm]
slurm_conf = "{slurm.conf_path}"

[coordinator.policy]
max_drained_fraction = 0.5
min_drain_budget = 1

[coordinator.api]
port = {api_port}

[log]
level = "info"
json = true
"""


def agent_config(mosquitto: Mosquitto, node: str, kmsg: Path, state: Path, socket: str) -> str:
    return f"""
[bus]
host = "127.0.0.1"
port = {mosquitto.port}
keepalive_s = 2
reconnect_max_s = 1.0

[agent]
node = "{node}"
kmsg_path = "{kmsg}"
kmsg_from_start = true
state_dir = "{state}"
socket_path = "{socket}"

[log]
level = "info"
json = true
"""


@pytest.fixture
def cluster(slurm: SlurmCluster, mosquitto: Mosquitto, tmp_path: Path) -> Iterator[Cluster]:
    run_dir = Path(tempfile.mkdtemp(prefix="ftd-rec-", dir="/tmp"))  # short unix socket paths
    ledger = tmp_path / "ledger.sqlite"
    api_port = free_port()
    coordinator = Daemon("coordinator", coordinator_config(mosquitto, slurm, ledger, api_port), tmp_path)
    agents: dict[str, Daemon] = {}
    kmsg: dict[str, Path] = {}
    sockets: dict[str, str] = {}
    for node in ("node-1", "node-2"):
        kmsg[node] = tmp_path / f"kmsg-{node}"
        kmsg[node].touch()
        state, socket = tmp_path / f"state-{node}", f"{run_dir}/{node}.sock"
        sockets[node] = socket
        config = agent_config(mosquitto, node, kmsg[node], state, socket)
        agents[node] = Daemon(f"agent-{node}", config, tmp_path / node)
    api = f"http://127.0.0.1:{api_port}"
    built = Cluster(slurm, mosquitto, coordinator, agents, kmsg, sockets, ledger, tmp_path, api)
    coordinator.start()
    for agent in agents.values():
        agent.start()
    try:
        for agent in agents.values():
            agent.wait_log("bus_connected")
        wait_until(
            lambda: {r.get("node") for r in built.log_records("node_status")} >= {"node-1", "node-2"},
            20,
            "the coordinator to see both nodes online",
            built,
        )
        yield built
    finally:
        for daemon in (*agents.values(), coordinator):
            daemon.stop()
        for daemon in (coordinator, *agents.values()):
            print(f"----- {daemon.name} log (tail)\n{daemon.log()[-4000:]}")


def test_operator_resume_is_honoured_by_the_budget(cluster: Cluster) -> None:
    cluster.xid79("node-2")
    wait_until(lambda: cluster.drained("node-2"), 20, "node-2 drained by ftd", cluster)
    assert cluster.slurm_node("node-2")["Reason"].startswith("ftd:")

    # The operator returns node-2 to service. (slurmctld answers "Invalid node state specified" for a
    # node it never heard from, yet undrains it: the state is what counts.)
    cluster.slurm.run("scontrol", "update", "nodename=node-2", "state=resume", check=False)
    wait_until(lambda: not cluster.drained("node-2"), 10, "node-2 resumed by the operator", cluster)
    with contextlib.suppress(AssertionError):  # a few reconciliation rounds (1 s each), at most
        wait_until(lambda: bool(cluster.log_records("drain_released")), 5, "drain_released", cluster)

    cluster.xid79("node-1")  # the next real fault: must be drained, not held back by the budget
    decided = "a drain_node decision on node-1"
    wait_until(lambda: bool(cluster.actions("drain_node", "node-1")), 20, decided, cluster)
    wait_until(
        lambda: cluster.actions("drain_node", "node-1")[0]["state"] not in ("pending", "running"),
        20,
        "the drain of node-1 to finish",
        cluster,
    )
    [drain] = cluster.actions("drain_node", "node-1")
    assert drain["state"] == "succeeded", drain
    assert cluster.drained("node-1")
    assert [a["state"] for a in cluster.actions("drain_node", "node-2")] == ["succeeded"]
    [released] = cluster.log_records("drain_released")
    assert released["node"] == "node-2" and released["reason"].startswith("ftd: xid 79")
    assert cluster.scheduler_events("node-2") == ["ftd_drain_released"]


def test_restart_remembers_its_drains(cluster: Cluster) -> None:
    cluster.xid79("node-2")
    wait_until(lambda: cluster.drained("node-2"), 20, "node-2 drained by ftd", cluster)
    wait_until(
        lambda: any(a["state"] == "succeeded" for a in cluster.actions("drain_node", "node-2")),
        10,
        "the drain recorded as succeeded",
        cluster,
    )

    seen_online = len(cluster.log_records("node_status"))
    assert cluster.coordinator.stop(signal.SIGKILL) == -signal.SIGKILL
    cluster.coordinator.start()
    wait_until(
        lambda: len(cluster.log_records("node_status")) >= seen_online + 2,
        20,
        "the restarted coordinator to see both nodes again",
        cluster,
    )

    cluster.xid79("node-1")  # budget 1 of 2 nodes, node-2 still drained: node-1 must stay in service
    decided = "a drain_node decision on node-1"
    wait_until(lambda: bool(cluster.actions("drain_node", "node-1")), 20, decided, cluster)
    time.sleep(1.5)  # a reconciliation round later (and any drain that was allowed has run)
    [held] = cluster.actions("drain_node", "node-1")
    assert held["state"] == "suppressed" and "blast radius" in held["policy"], held
    assert not cluster.drained("node-1")
    assert cluster.drained("node-2")
    [restored] = cluster.log_records("drains_restored")
    assert restored["ftd"] == ["node-2"]


def test_requeued_job_stuck_pending_raises_one_alert(cluster: Cluster) -> None:
    job = cluster.submit_trainer()
    cluster.slurm.wait_job_state(job, "RUNNING", 30)
    cluster.wait_registered(job)

    cluster.xid79("node-1")  # save, stop, drain node-1, requeue without node-1: nowhere to run

    def requeued() -> bool:
        info = cluster.slurm.job(job)
        return info.get("JobState") == "PENDING" and int(info.get("Restarts", "0")) >= 1

    wait_until(requeued, 40, "the job requeued (and pending)", cluster)
    requeued_at = time.time()
    wait_until(lambda: bool(cluster.notes("job_pending")), 15, "the job_pending alert", cluster)
    alerted_after = time.time() - requeued_at
    [note] = cluster.notes("job_pending")
    assert note["data"]["job"] == job and note["source"] == "scheduler" and note["severity"] == "error"
    assert note["data"]["pending_s"] >= 3.0 and "node-1" in note["data"]["excluded"]
    assert alerted_after < 10  # 3 s after the requeue, at the next 1 s round
    [logged] = cluster.log_records("job_pending_too_long")
    assert logged["job"] == job
    time.sleep(2.5)  # more rounds: still one alert
    assert len(cluster.notes("job_pending")) == 1
    assert cluster.slurm.job(job).get("JobState") == "PENDING"


def test_a_job_ftd_moved_stays_in_view_while_it_is_pending(cluster: Cluster) -> None:
    job = cluster.submit_trainer()
    cluster.slurm.wait_job_state(job, "RUNNING", 30)
    cluster.wait_registered(job)

    cluster.xid79("node-1")  # save, stop, drain node-1, requeue without node-1: nowhere to run
    finished = "the checkpoint_restart to finish"
    wait_until(
        lambda: [a["state"] for a in cluster.actions("checkpoint_restart", job)] == ["succeeded"],
        40,
        finished,
        cluster,
    )
    assert cluster.slurm.job(job).get("JobState") == "PENDING"

    def shown() -> dict[str, Any]:
        [out] = [j for j in cluster.get("/v1/jobs") if j["id"] == job]  # never missing: the defect
        return out

    def pending_elsewhere() -> bool:  # no rank left anywhere, and the scheduler asked about it
        job_out = shown()
        return job_out["nodes"] == [] and (job_out["moved"] or {}).get("scheduler_state") == "PENDING"

    wait_until(pending_elsewhere, 10, "no rank left and a reconciliation round", cluster)
    actions = cluster.get("/v1/actions?limit=200")
    [action] = [a for a in actions if a["kind"] == "checkpoint_restart" and a["target"] == job]
    assert action["state"] == "succeeded"  # the action is over: only the moved record shows the job
    shown_job = shown()
    assert shown_job["state"] == "pending after requeue" and shown_job["ranks"] == [], shown_job
    moved = shown_job["moved"]
    assert moved["excluding"] == ["node-1"] and moved["action"] == action["id"], moved
    assert moved["scheduler_state"] == "PENDING" and moved["since"] > 0, moved
    assert f"pending after requeue, excluding node-1 (action {action['id']}" in moved["why"], moved
    line = next(x for x in cluster.status().splitlines() if x.startswith(f"{job} "))
    assert "pending after requeue, excluding node-1" in line, line
    assert any(x.startswith(f"{job} ") for x in cluster.status("--problems").splitlines())

    cluster.slurm.run("scancel", job)  # finished with: no longer shown
    wait_until(
        lambda: job not in {j["id"] for j in cluster.get("/v1/jobs")}, 10, "the cancelled job gone", cluster
    )


def test_a_node_an_operator_drained_is_shown_unavailable_with_its_reason(cluster: Cluster) -> None:
    cluster.slurm.run("scontrol", "update", "nodename=node-2", "state=drain", "reason=fan replaced")
    wait_until(
        lambda: cluster.get("/v1/nodes?problems=true") != [], 10, "the coordinator to see the drain", cluster
    )
    text = cluster.status()
    assert "NODES (2: 2 online, 0 offline, 0 drained by ftd, 1 unavailable)" in text, text
    line = next(x for x in text.splitlines() if x.startswith("node-2 "))
    assert line.split()[:3] == ["node-2", "unavailable", "other"], line
    assert "fan replaced" in line, line
    problems = cluster.status("--problems")
    assert any(x.startswith("node-2 ") for x in problems.splitlines()), problems
    assert not any(x.startswith("node-1 ") for x in problems.splitlines()), problems
