"""The e2e stack, shared by the e2e tests: real Mosquitto and a real Slurm (from the ``mosquitto`` and
``slurm`` fixtures), ``ftd agent`` (node-1) and ``ftd coordinator`` as subprocesses with TOML configs.

:func:`make_stack` builds one (a context manager; ``agent_extra`` / ``coordinator_extra`` are TOML
appended to the daemons' config files, e.g. ``[agent.heartbeat]`` or ``[coordinator.api]`` tables;
the coordinator's save/stop deadlines are parameters). The ``stack`` fixture is the default one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ftd.bus import topics
from ftd.bus.mqtt import MqttBus
from tests.e2e.daemons import REPO, Daemon
from tests.realparts import Mosquitto, SlurmCluster

XID79 = "[ 5021.437112] NVRM: Xid (PCI:0000:3b:00): 79, pid=31337, name=python, GPU has fallen off the bus."


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

    def submit_trainer(self, *sbatch_args: str, max_s: float | None = None) -> tuple[str, Path]:
        """Submit ``trainer_job.py`` (``--requeue``, plus ``sbatch_args`` such as ``-w node-1``);
        ``max_s``: how long it trains at most (its ``FTD_TEST_MAX_S``). Returns the job and its log."""
        log = self.workdir / f"trainer-{time.monotonic_ns()}.jsonl"
        limit = f"export FTD_TEST_MAX_S={max_s}\n" if max_s is not None else ""
        script = f"""#!/bin/bash
export FTD_SOCKET={self.socket}
export FTD_TEST_LOG={log}
{limit}export PYTHONPATH={REPO}
exec {sys.executable} {REPO}/tests/e2e/trainer_job.py
"""
        job = self.slurm.sbatch(script, "--requeue", "--job-name=ftd-e2e", *sbatch_args)
        return job, log

    def actions(self, kind: str) -> list[dict[str, Any]]:
        """The ledger's actions of ``kind``, oldest first: state, request and detail as JSON."""
        with sqlite3.connect(self.ledger) as db:
            rows = db.execute(
                "SELECT state, request, detail FROM actions WHERE kind = ? ORDER BY created", (kind,)
            ).fetchall()
        return [
            {"state": s, "request": json.loads(r), "detail": json.loads(d) if d else {}} for s, r, d in rows
        ]

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


@contextlib.contextmanager
def make_stack(
    slurm: SlurmCluster,
    mosquitto: Mosquitto,
    tmp_path: Path,
    *,
    save_deadline_s: float = 20,
    stop_deadline_s: float = 20,
    agent_extra: str = "",
    coordinator_extra: str = "",
    coordinator_keys: str = "",
) -> Iterator[Stack]:
    """Start the agent and the coordinator; stop them (and print their logs' tails) on exit.
    ``*_extra``: more tables at the end of each config; ``coordinator_keys``: more keys of [coordinator]."""
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
# The file starts empty: read it from the start, or lines written right after the agent starts could
# land before the watcher opens it (a first start otherwise begins at the end: only new records).
kmsg_from_start = true
state_dir = "{tmp_path / "agent-state"}"
socket_path = "{socket_path}"

[log]
level = "info"
json = true
{agent_extra}
""",
        tmp_path,
    )
    coordinator = Daemon(
        "coordinator",
        f"""{bus}
[coordinator]
ledger_path = "{ledger}"
save_deadline_s = {save_deadline_s}
stop_deadline_s = {stop_deadline_s}
scheduler = "slurm"
{coordinator_keys}

[coordinator.slurm]
slurm_conf = "{slurm.conf_path}"

[log]
level = "info"
json = true
{coordinator_extra}
""",
        tmp_path,
    )
    coordinator.start()
    agent.start()
    try:
        coordinator.wait_log("node_status")  # it has seen node-1's retained "online"
        agent.wait_log("bus_connected")
        yield Stack(slurm, mosquitto, agent, coordinator, kmsg, socket_path, ledger, tmp_path)
    finally:
        agent.stop()
        coordinator.stop()
        for daemon in (agent, coordinator):
            print(f"----- {daemon.name} log (tail)\n{daemon.log()[-4000:]}")


@pytest.fixture
def stack(slurm: SlurmCluster, mosquitto: Mosquitto, tmp_path: Path) -> Iterator[Stack]:
    with make_stack(slurm, mosquitto, tmp_path) as built:
        yield built
