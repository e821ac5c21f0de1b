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
"""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.daemons import Daemon
from tests.realparts import Mosquitto, SlurmCluster

pytestmark = [pytest.mark.real]

XID79 = "[ 5021.437112] NVRM: Xid (PCI:0000:3b:00): 79, pid=31337, name=python, GPU has fallen off the bus."


@dataclass
class Cluster:
    slurm: SlurmCluster
    coordinator: Daemon
    agents: dict[str, Daemon]
    kmsg: dict[str, Path]
    ledger: Path

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


def coordinator_config(mosquitto: Mosquitto, slurm: SlurmCluster, ledger: Path) -> str:
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

[coordinator.slurm]
slurm_conf = "{slurm.conf_path}"

[coordinator.policy]
max_drained_fraction = 0.5
min_drain_budget = 1

[coordinator.api]
enabled = false

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
    coordinator = Daemon("coordinator", coordinator_config(mosquitto, slurm, ledger), tmp_path)
    agents: dict[str, Daemon] = {}
    kmsg: dict[str, Path] = {}
    for node in ("node-1", "node-2"):
        kmsg[node] = tmp_path / f"kmsg-{node}"
        kmsg[node].touch()
        state, socket = tmp_path / f"state-{node}", f"{run_dir}/{node}.sock"
        config = agent_config(mosquitto, node, kmsg[node], state, socket)
        agents[node] = Daemon(f"agent-{node}", config, tmp_path / node)
    built = Cluster(slurm, coordinator, agents, kmsg, ledger)
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
