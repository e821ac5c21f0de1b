"""The shipped security setup end to end: ``ftd agent`` and ``ftd coordinator`` daemons on the
deploy/mosquitto broker over mutual TLS (certificates from scripts/make-certs.sh, the ACL, the TLS
listener), a real Slurm as the placement authority, and a trainer in a Slurm batch job.

An Xid 13 on node-1 saves, stops and requeues the job as it does on the plain test stack (the save
directive travels on node-1's own ``directives/jobs`` topic); meanwhile node-2's certificate,
subscribed to everything it might try, reads none of node-1's traffic, and its claim on the job is
refused and recorded as a ``security`` event.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ftd.bus import topics
from ftd.events import JobPresence, RankInfo, encode
from tests.e2e.daemons import REPO, Daemon
from tests.realparts import SlurmCluster
from tests.security.bus import Inbox
from tests.security.test_mtls import Pki, TlsBroker, bus_as, pki, tls, tls_broker

pytestmark = [pytest.mark.real, pytest.mark.slow]
__all__ = ["pki", "tls", "tls_broker"]  # fixtures, imported for pytest

XID13 = (
    "[ 6110.203311] NVRM: Xid (PCI:0000:3b:00): 13, pid=31337, name=python, Graphics SM Warp Exception "
    "on (GPC 0, TPC 0, SM 0): Out Of Range Address"
)


def bus_section(tls: TlsBroker, pki: Pki, name: str) -> str:
    return f"""[bus]
host = "127.0.0.1"
port = {tls.tls_port}
tls = true
ca_file = "{pki.dir / "ca.crt"}"
cert_file = "{pki.dir / f"{name}.crt"}"
key_file = "{pki.dir / f"{name}.key"}"
keepalive_s = 2
reconnect_max_s = 1.0

[log]
level = "info"
json = true
"""


def records(log: Path) -> list[dict[str, object]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


async def until(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await asyncio.to_thread(predicate):
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.1)


async def test_xid_restart_over_mutual_tls_with_placement_and_no_foreign_reads(
    tls: TlsBroker, pki: Pki, slurm: SlurmCluster, tmp_path: Path
) -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="ftd-prod-", dir="/tmp"))  # short unix socket path
    kmsg, ledger, socket_path = tmp_path / "kmsg", tmp_path / "ledger.sqlite", run_dir / "agent.sock"
    kmsg.touch()
    coordinator = Daemon(
        "coordinator",
        bus_section(tls, pki, "coordinator")
        + f"""
[coordinator]
ledger_path = "{ledger}"
save_deadline_s = 20
stop_deadline_s = 20
scheduler = "slurm"

[coordinator.slurm]
slurm_conf = "{slurm.conf_path}"

[coordinator.api]
enabled = false
""",
        tmp_path,
    )
    agent = Daemon(
        "agent-node-1",
        bus_section(tls, pki, "node-1")
        + f"""
[agent]
node = "node-1"
kmsg_path = "{kmsg}"
kmsg_from_start = true
state_dir = "{tmp_path / "agent-state"}"
socket_path = "{socket_path}"

[agent.nvml]
enabled = false
""",
        tmp_path,
    )
    observer = await Inbox(bus_as(tls, pki, "observer")).start("ftd/v1/nodes/node-1/jobs/+")
    node2 = await Inbox(bus_as(tls, pki, "node-2")).start(
        "ftd/v1/nodes/node-1/#", "ftd/v1/nodes/+/directives/jobs", "ftd/v1/jobs/#"
    )
    coordinator.start()
    agent.start()
    try:
        await asyncio.to_thread(coordinator.wait_log, "node_status", 30)
        await asyncio.to_thread(agent.wait_log, "bus_connected", 30)
        log = tmp_path / "trainer.jsonl"
        script = f"""#!/bin/bash
export FTD_SOCKET={socket_path}
export FTD_TEST_LOG={log}
export PYTHONPATH={REPO}
exec {sys.executable} {REPO}/tests/e2e/trainer_job.py
"""
        job = slurm.sbatch(script, "--requeue", "-w", "node-1", "--job-name=ftd-mtls")
        await asyncio.to_thread(slurm.wait_job_state, job, "RUNNING", 30)

        def registered() -> bool:
            mine = topics.node_job("node-1", job)
            return any(m.topic == mine and b'"rank"' in m.payload for m in observer.got)

        await observer.wait(registered, 30, "the trainer's presence from node-1's agent")
        # node-2's certificate claims the job (it runs on node-1): refused, recorded.
        claim = JobPresence(job=job, node="node-2", ranks=[RankInfo(rank=0)], ts=time.time())
        await node2.bus.publish(topics.node_job("node-2", job), encode(claim), retain=True)

        with kmsg.open("a") as f:
            f.write(XID13 + "\n")
        await until(lambda: any(r["what"] == "stopped" for r in records(log)), 60, "the trainer to stop")
        whats = [r["what"] for r in records(log)]
        assert whats.index("saved") < whats.index("stopped")
        await until(lambda: slurm.job(job).get("Restarts") == "1", 30, "the job requeued")

        def actions() -> dict[str, tuple[str, dict[str, object]]]:
            with sqlite3.connect(ledger) as db:
                rows = db.execute("SELECT kind, state, detail FROM actions").fetchall()
            return {kind: (state, json.loads(detail)) for kind, state, detail in rows}

        await until(lambda: actions().get("checkpoint_restart", ("",))[0] == "succeeded", 20, "the action")
        _, detail = actions()["checkpoint_restart"]
        assert detail["nodes"] == ["node-1"] and detail["saved"].keys() == {"0"}  # type: ignore[attr-defined]

        with sqlite3.connect(ledger) as db:
            rows = db.execute("SELECT body FROM events WHERE kind = 'security'").fetchall()
        security = [json.loads(body) for (body,) in rows]
        assert [(e["node"], e["data"]["by_message"]) for e in security] == [("node-2", {"presence": 1})]
        # node-2 read nothing of node-1's: no directive, no presence, no receipt.
        assert [m.topic for m in node2.got] == []
        assert "directive_relayed" in agent.log()  # node-1's agent got it on its own topic
        await node2.bus.publish(topics.node_job("node-2", job), b"", retain=True)
    finally:
        agent.stop()
        coordinator.stop()
        await observer.close()
        await node2.close()
        shutil.rmtree(run_dir, ignore_errors=True)
        for daemon in (agent, coordinator):
            print(f"----- {daemon.name} log (tail)\n{daemon.log()[-3000:]}")
