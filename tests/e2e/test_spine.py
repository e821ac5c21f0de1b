"""The spine, end to end, with real parts only.

Real Mosquitto and a real Slurm (munged + slurmctld + slurmd) started by the test; ``ftd agent`` and
``ftd coordinator`` as subprocesses with config files; a ``--requeue`` Slurm batch job whose script
runs a training loop with the ftd client. A real-format Xid line appended to the node's kernel-log
source must end with the trainer saving, acking and stopping, the node drained in Slurm with ftd's
reason, and the job requeued with the node excluded.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ftd.bus import topics
from ftd.bus.mqtt import MqttBus
from tests.e2e.daemons import REPO, Daemon
from tests.realparts import Mosquitto, SlurmCluster

pytestmark = [pytest.mark.real, pytest.mark.slow]

XID79 = "[ 5021.437112] NVRM: Xid (PCI:0000:3b:00): 79, pid=31337, name=python, GPU has fallen off the bus."
XID43 = "[ 5021.437112] NVRM: Xid (PCI:0000:3b:00): 43, pid=31337, name=python, Ch 00000008"


@dataclass
class Stack:
    slurm: SlurmCluster
    broker: Mosquitto
    agent: Daemon
    coordinator: Daemon
    kmsg: Path
    socket: str
    ledger: Path
    workdir: Path

    def append_kernel_line(self, line: str) -> None:
        with self.kmsg.open("a") as f:
            f.write(line + "\n")

    def submit_trainer(self) -> tuple[str, Path]:
        log = self.workdir / f"trainer-{time.monotonic_ns()}.jsonl"
        script = f"""#!/bin/bash
export FTD_SOCKET={self.socket}
export FTD_TEST_LOG={log}
export PYTHONPATH={REPO}
exec {sys.executable} {REPO}/tests/e2e/trainer_job.py
"""
        job = self.slurm.sbatch(script, "--requeue", "-w", "node-1", "--job-name=ftd-e2e")
        return job, log

    def wait_registered(self, job: str, timeout: float = 20.0) -> None:
        """Wait until the coordinator can know the job: its presence is retained on the bus."""

        async def watch() -> None:
            bus = MqttBus(
                host="127.0.0.1", port=self.broker.port, client_id=f"e2e-watch-{job}", clean_session=True
            )
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

    def ledger_events(self, kind: str) -> list[dict[str, object]]:
        with sqlite3.connect(self.ledger) as db:
            return [
                json.loads(body) for (body,) in db.execute("SELECT body FROM events WHERE kind = ?", (kind,))
            ]


def trainer_records(log: Path) -> list[dict[str, object]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def wait_until(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def stack(slurm: SlurmCluster, mosquitto: Mosquitto, tmp_path: Path) -> Iterator[Stack]:
    run_dir = Path(tempfile.mkdtemp(prefix="ftd-e2e-", dir="/tmp"))  # unix socket paths must be short
    kmsg = tmp_path / "kmsg"
    kmsg.touch()
    socket_path = str(run_dir / "agent.sock")
    ledger = tmp_path / "ledger.sqlite"
    bus = f"""
[bus]
host = "127.0.0.1"
port = {mosquitto.port}
keepalive_s = 2
reconnect_max_s = 1.0
"""
    agent = Daemon(
        "agent-node-1",
        f"""{bus}
[agent]
node = "node-1"
kmsg_path = "{kmsg}"
state_dir = "{tmp_path / "agent-state"}"
socket_path = "{socket_path}"

[log]
level = "info"
json = true
""",
        tmp_path,
    )
    coordinator = Daemon(
        "coordinator",
        f"""{bus}
[coordinator]
ledger_path = "{ledger}"
save_deadline_s = 20
stop_deadline_s = 20
scheduler = "slurm"

[coordinator.slurm]
slurm_conf = "{slurm.conf_path}"

[log]
level = "info"
json = true
""",
        tmp_path,
    )
    coordinator.start()
    agent.start()
    try:
        coordinator.wait_log("node status")  # it has seen node-1's retained "online"
        agent.wait_log("bus connected")
        yield Stack(slurm, mosquitto, agent, coordinator, kmsg, socket_path, ledger, tmp_path)
    finally:
        agent.stop()
        coordinator.stop()
        for daemon in (agent, coordinator):
            print(f"----- {daemon.name} log (tail)\n{daemon.log()[-4000:]}")


def test_xid79_saves_stops_drains_and_requeues_without_the_node(stack: Stack) -> None:
    job, log = stack.submit_trainer()
    stack.slurm.wait_job_state(job, "RUNNING", 30)
    stack.wait_registered(job)

    stack.append_kernel_line(XID79)

    wait_until(lambda: any(r["what"] == "stopped" for r in trainer_records(log)), 30, "the trainer to stop")
    records = trainer_records(log)
    saved = [r for r in records if r["what"] == "saved"]
    stopped = [r for r in records if r["what"] == "stopped"]
    assert len(saved) == 1 and Path(str(saved[0]["path"])).read_text() == str(saved[0]["step"])
    assert stopped[0]["step"] >= saved[0]["step"]  # type: ignore[operator]
    assert [r["what"] for r in records].index("saved") < [r["what"] for r in records].index("stopped")

    # The node is drained with ftd's reason, visible to operators in `sinfo -R`.
    wait_until(lambda: "DRAIN" in stack.slurm.node("node-1").get("State", ""), 20, "node-1 drained")
    reasons = stack.slurm.run("sinfo", "-R", "-h", "-o", "%N|%E").stdout
    assert "node-1|ftd: xid 79 gpu 0000:3b:00.0" in reasons

    # The job is requeued, excluded from the bad node, and therefore pending (node-1 is the only
    # node with a slurmd, and it is drained anyway).
    def requeued() -> bool:
        info = stack.slurm.job(job)
        return info.get("JobState") == "PENDING" and int(info.get("Restarts", "0")) >= 1

    wait_until(requeued, 30, "the job to be requeued")
    info = stack.slurm.job(job)
    assert "node-1" in info.get("ExcNodeList", "")

    # The ledger shows the decision trail: the event once, both actions succeeded.
    assert [e["data"]["code"] for e in stack.ledger_events("xid")] == [79]  # type: ignore[index]

    def action_states() -> dict[str, str]:
        with sqlite3.connect(stack.ledger) as db:
            return dict(db.execute("SELECT kind, state FROM actions"))

    # The ledger is written right after the scheduler call returns: wait for it, do not race it.
    expected = {"drain_node": "succeeded", "checkpoint_restart": "succeeded"}
    wait_until(lambda: action_states() == expected, 10, f"ledger states {expected}")


def test_non_fatal_xid43_is_recorded_but_drains_nothing(stack: Stack) -> None:
    job, log = stack.submit_trainer()
    stack.slurm.wait_job_state(job, "RUNNING", 30)
    stack.wait_registered(job)

    stack.append_kernel_line(XID43)

    # Positive control: the event made it all the way into the coordinator's ledger...
    wait_until(lambda: bool(stack.ledger_events("xid")), 15, "the Xid 43 event in the ledger")
    assert stack.ledger_events("xid")[0]["data"]["code"] == 43  # type: ignore[index]
    time.sleep(1.0)  # ...and nothing followed from it.
    assert "DRAIN" not in stack.slurm.node("node-1").get("State", "")
    assert stack.slurm.job(job).get("JobState") == "RUNNING"
    assert not any(r["what"] in ("saved", "stopped") for r in trainer_records(log))
    with sqlite3.connect(stack.ledger) as db:
        assert db.execute("SELECT COUNT(*) FROM actions").fetchone()[0] == 0
