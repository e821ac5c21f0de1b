"""An e2e stack on the broker as shipped: deploy/mosquitto's config and ACL (passwords, per-node
logins, ``use_username_as_clientid``), ``ftd agent`` for node-1 and ``ftd coordinator`` logged in as
``node-1`` and ``coordinator``, and the real Slurm of the ``slurm`` fixture.

Used by the trainer-facing tests of issue #20 (run-bound directives, heartbeat start-up grace, bad
input on the trainer socket). Nothing here logs in to the broker besides the two daemons (with the
shipped ACL a third client under one of their names would take over its session): tests watch the
daemons' logs, the ledger and the trainers' own records instead.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftd.bench.preemption import read_records
from tests.contract.test_mosquitto_acl import (
    DEPLOY,
    _chown_for_broker,
    _mosquitto_dir,
    deploy_conf_lines,
    make_passwd,
)
from tests.e2e.daemons import REPO, Daemon
from tests.realparts import Mosquitto, SlurmCluster

USERS = {"coordinator": "pw-coordinator", "node-1": "pw-node-1"}


@contextlib.contextmanager
def shipped_broker() -> Iterator[tuple[Mosquitto, Path]]:
    """deploy/mosquitto.conf and acl as shipped, the :data:`USERS` in its password file (each one's
    password also in ``<workdir>/<user>.pw``)."""
    workdir = _mosquitto_dir()
    try:
        make_passwd(workdir, USERS)
        shutil.copy(DEPLOY / "acl", workdir / "acl")
        _chown_for_broker(workdir / "acl")
        for user, password in USERS.items():
            (workdir / f"{user}.pw").write_text(password + "\n")
        conf = deploy_conf_lines(workdir)
        assert "use_username_as_clientid true" in conf and "allow_anonymous false" in conf
        (workdir / "broker").mkdir()
        _chown_for_broker(workdir / "broker")
        broker = Mosquitto(workdir / "broker", extra_conf=conf).start()
        try:
            yield broker, workdir
        finally:
            broker.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def bus_section(broker: Mosquitto, secrets: Path, user: str) -> str:
    return f"""
[bus]
host = "127.0.0.1"
port = {broker.port}
username = "{user}"
password_file = "{secrets / f"{user}.pw"}"
keepalive_s = 2
reconnect_max_s = 1.0
"""


def agent_daemon(
    broker: Mosquitto, secrets: Path, tmp_path: Path, *, extra: str = "", bus_extra: str = ""
) -> tuple[Daemon, Path, str]:
    """``ftd agent`` for node-1 (not started): the daemon, its kernel-log file, its socket path.
    ``extra``: tables appended to its config; ``bus_extra``: lines added to its ``[bus]`` table."""
    run_dir = Path(tempfile.mkdtemp(prefix="ftd-e2e-", dir="/tmp"))  # unix socket paths must be short
    kmsg = tmp_path / "kmsg"
    kmsg.touch()
    socket_path = str(run_dir / "agent.sock")
    agent = Daemon(
        "agent-node-1",
        f"""{bus_section(broker, secrets, "node-1")}{bus_extra}
[agent]
node = "node-1"
kmsg_path = "{kmsg}"
kmsg_from_start = true
state_dir = "{tmp_path / "agent-state"}"
socket_path = "{socket_path}"

[log]
level = "info"
json = true
{extra}
""",
        tmp_path,
    )
    return agent, kmsg, socket_path


@dataclass
class ShippedStack:
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

    def ledger_events(self, kind: str) -> list[dict[str, object]]:
        with sqlite3.connect(self.ledger) as db:
            return [
                json.loads(body) for (body,) in db.execute("SELECT body FROM events WHERE kind = ?", (kind,))
            ]

    def coordinator_records(self, event: str) -> list[dict[str, Any]]:
        """The coordinator's JSON log lines of ``event``, oldest first."""
        return _log_records(self.coordinator.log(), event)

    def agent_log_records(self, event: str) -> list[dict[str, object]]:
        out = []
        for line in self.agent.log().splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if isinstance(rec, dict) and rec.get("event") == event:
                    out.append(rec)
        return out

    def sbatch_python(self, name: str, script: Path, env: dict[str, str]) -> str:
        """Run ``python script`` as a ``--requeue`` batch job on node-1 with ``env`` exported."""
        exports = "\n".join(f"export {k}={v}" for k, v in env.items())
        body = f"""#!/bin/bash
export FTD_SOCKET={self.socket}
export PYTHONPATH={REPO}
export OMP_NUM_THREADS=1
{exports}
exec {sys.executable} {script}
"""
        return self.slurm.sbatch(body, "--requeue", "-w", "node-1", f"--job-name=ftd-{name}")


@contextlib.contextmanager
def make_shipped_stack(
    slurm: SlurmCluster,
    tmp_path: Path,
    *,
    save_deadline_s: float = 120,
    stop_deadline_s: float = 60,
    agent_extra: str = "",
    coordinator_extra: str = "",
) -> Iterator[ShippedStack]:
    """Broker as shipped, agent and coordinator started (deadlines as examples/config ships them);
    everything stopped on exit, the daemons' log tails printed."""
    with shipped_broker() as (broker, secrets):
        agent, kmsg, socket_path = agent_daemon(broker, secrets, tmp_path, extra=agent_extra)
        ledger = tmp_path / "ledger.sqlite"
        coordinator = Daemon(
            "coordinator",
            f"""{bus_section(broker, secrets, "coordinator")}
[coordinator]
ledger_path = "{ledger}"
save_deadline_s = {save_deadline_s}
stop_deadline_s = {stop_deadline_s}
scheduler = "slurm"

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
            coordinator.wait_log("node_status", timeout=30)
            agent.wait_log("bus_connected", timeout=30)
            yield ShippedStack(slurm, broker, agent, coordinator, kmsg, socket_path, ledger, tmp_path)
        finally:
            agent.stop()
            coordinator.stop()
            for daemon in (agent, coordinator):
                print(f"----- {daemon.name} log (tail)\n{daemon.log()[-6000:]}")


def wait_until(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def _log_records(text: str, event: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if isinstance(rec, dict) and rec.get("event") == event:
                out.append(rec)
    return out


#: What a README-loop job (tests/e2e/readme_loop.py) wrote of ``what``, of one run or all: the same
#: JSON lines as the preemption bench's trainer.
records = read_records
