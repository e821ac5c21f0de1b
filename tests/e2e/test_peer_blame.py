"""Peer naming end to end (issue #33): two real gloo ranks on two ftd nodes, real agents and a real
coordinator on a real Mosquitto. Rank 1 (node-b) dies; rank 0 (node-a) prints gloo's "Connection
closed by peer [ADDRESS]"; node-a's agent turns the line into an event carrying ``peer_address``; the
coordinator resolves the address through the addresses node-b's agent announced, and its decision
names node-b -- the dead rank's node, not the reporter.

Both "nodes" are this host, so the ranks are told apart by interface: rank 0's gloo device is on a
non-loopback interface, rank 1's on loopback, and each agent announces its rank's address
(``agent.addresses``)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import socket
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftd.bench.slurm_cluster import free_port
from ftd.bus import topics
from ftd.bus.mqtt import MqttBus
from tests.e2e.daemons import REPO, Daemon
from tests.e2e.stack import wait_until
from tests.realparts import Mosquitto

pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.timeout(240)]

JOB = "peer-1"


def outward_interface() -> tuple[str, str]:
    """The first interface with a non-loopback IPv4 address: (name, address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            with contextlib.suppress(OSError):
                packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
                address = socket.inet_ntoa(packed[20:24])
                if not address.startswith("127."):
                    return name, address
    raise AssertionError("this test needs a network interface with a non-loopback IPv4 address")


def agent(node: str, port: int, address: str, run_dir: Path, tmp: Path) -> Daemon:
    (tmp / f"kmsg-{node}").touch()
    return Daemon(
        f"agent-{node}",
        f"""
[bus]
host = "127.0.0.1"
port = {port}
keepalive_s = 2
reconnect_max_s = 1.0

[agent]
node = "{node}"
kmsg_path = "{tmp / f"kmsg-{node}"}"
state_dir = "{tmp / f"state-{node}"}"
socket_path = "{run_dir / f"{node}.sock"}"
addresses = ["{address}"]

[agent.logs]
paths = ["{tmp / f"{node}-rank*.log"}"]
rescan_s = 0.2

[log]
level = "info"
json = true
""",
        tmp,
    )


def wait_presence(port: int, node: str, timeout: float = 30.0) -> None:
    """Until ``node``'s retained presence of the job names a rank (the coordinator reads the same)."""

    async def watch() -> None:
        bus = MqttBus(host="127.0.0.1", port=port, client_id=f"e2e-peer-{node}", clean_session=True)
        await bus.subscribe(topics.node_job(node, JOB))
        await bus.start()
        try:
            async for message in bus.messages():
                if message.payload and b'"rank"' in message.payload:
                    return
        finally:
            await bus.stop()

    asyncio.run(asyncio.wait_for(watch(), timeout))


def ledger_rows(ledger: Path, query: str) -> list[Any]:
    if not ledger.exists():
        return []
    with contextlib.closing(sqlite3.connect(ledger)) as db:
        try:
            return db.execute(query).fetchall()
        except sqlite3.OperationalError:  # not created yet
            return []


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_dead_ranks_node_is_blamed_not_the_reporter(
    mosquitto: Mosquitto, tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    iface, outward = outward_interface()
    run_dir = Path(tempfile.mkdtemp(prefix="ftd-peer-", dir="/tmp"))  # unix socket paths must be short
    ledger = tmp_path / "ledger.sqlite"
    coordinator = Daemon(
        "coordinator",
        f"""
[bus]
host = "127.0.0.1"
port = {mosquitto.port}
keepalive_s = 2
reconnect_max_s = 1.0

[coordinator]
ledger_path = "{ledger}"
scheduler = "none"

[log]
level = "info"
json = true
""",
        tmp_path,
    )
    # rank 0 on node-a talks from the outward interface; rank 1 on node-b from loopback
    daemons = [
        coordinator,
        agent("node-a", mosquitto.port, outward, run_dir, tmp_path),
        agent("node-b", mosquitto.port, "127.0.0.1", run_dir, tmp_path),
    ]
    try:
        for daemon in daemons:
            daemon.start()
        coordinator.wait_log('"node-b"', timeout=30)
        coordinator.wait_log('"node-a"', timeout=30)
        master = free_port()
        for rank, (node, ifname) in enumerate((("node-a", iface), ("node-b", "lo"))):
            env = {
                **os.environ,
                "PYTHONPATH": str(REPO),
                "RANK": str(rank),
                "MASTER_PORT": str(master),
                "GLOO_SOCKET_IFNAME": ifname,
                "FTD_JOB": JOB,
                "FTD_SOCKET": str(run_dir / f"{node}.sock"),
                "OUT_DIR": str(tmp_path),
            }
            log = (tmp_path / f"{node}-rank{rank}.log").open("ab")
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(REPO / "tests/e2e/peer_rank.py")], env=env, stdout=log, stderr=log
                )
            )
        wait_until(lambda: (tmp_path / "rank1.step").exists(), 120, "both ranks all-reducing")
        wait_presence(mosquitto.port, "node-a")
        wait_presence(mosquitto.port, "node-b")
        time.sleep(1.0)  # the coordinator reads the same retained presences
        (tmp_path / "die").touch()
        procs[1].wait(60)
        wait_until(lambda: (tmp_path / "rank0.failed").exists(), 120, "rank 0's all-reduce failing")
        rank0_log = (tmp_path / "node-a-rank0.log").read_text(errors="replace")
        assert "Connection closed by peer [127.0.0.1]" in rank0_log, rank0_log[-3000:]

        def blamed_events() -> list[dict[str, Any]]:
            rows = ledger_rows(ledger, "SELECT body FROM events WHERE kind = 'log_pattern'")
            events = [json.loads(body) for (body,) in rows]
            return [e for e in events if e["data"].get("pattern") == "peer_connection_lost"]

        wait_until(blamed_events, 60, "the peer_connection_lost event in the ledger")
        (event,) = blamed_events()[:1]
        assert event["node"] == "node-a" and event["data"]["peer_address"] == "127.0.0.1"

        def nccl_decisions() -> list[dict[str, Any]]:
            rows = ledger_rows(ledger, "SELECT request FROM actions")
            requests = [json.loads(r) for (r,) in rows]
            return [r for r in requests if r.get("rule") == "nccl_ib"]

        wait_until(nccl_decisions, 60, "the nccl_ib decision")
        decision = nccl_decisions()[0]
        assert decision["params"]["peer_node"] == "node-b", decision
        assert "the line names node-b" in decision["reason"], decision
        assert decision["params"].get("exclude", []) == []  # no hardware evidence: restart in place
    finally:
        for daemon in reversed(daemons):
            daemon.stop()
            if daemon.proc is not None and daemon.proc.returncode not in (0, -15, None):
                print(f"----- {daemon.name} log (tail)\n{daemon.log()[-3000:]}")
