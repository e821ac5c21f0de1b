"""An operator's installation on real parts, for the operator-day test (issue #20's "Done when").

What: :func:`operator_stack` (a context manager) starts

- Mosquitto with the shipped config, ACL and mutual-TLS listener, certificates from
  ``scripts/make-certs.sh`` (:mod:`tests.e2e.tls_broker`);
- a one-host Slurm whose nodes all run jobs (:mod:`tests.e2e.multinode_slurm`);
- one ``ftd agent`` per node and ``ftd coordinator``, from ``examples/config/*.toml`` with only the
  edits docs/operators.md documents (:mod:`tests.e2e.shipped_configs`), each checked with ``ftd
  check-config`` first, the API token given as systemd would (``$CREDENTIALS_DIRECTORY``);

and returns an :class:`OperatorStack`: what an operator does (``ftd`` commands with the installed
configs, ``systemctl restart``-style SIGTERM and start, a kernel-log line on a node, ``sbatch`` of
the README trainer loop) and what the test reads (the trainers' JSON lines, the ledger, the daemons'
logs). Why apart: the scenario reads as the operator's day; the machinery lives here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e import shipped_configs
from tests.e2e.daemons import REPO, Daemon
from tests.e2e.multinode_slurm import MultiNodeSlurm
from tests.e2e.tls_broker import TlsBroker, tls_broker
from tests.realparts import free_port

FTD = [sys.executable, "-m", "ftd.cli"]
TRAINER = REPO / "tests" / "e2e" / "readme_trainer.py"


def wait_for(predicate: Callable[[], bool], timeout: float, poll: float = 0.25) -> bool:
    """True as soon as ``predicate()`` holds; False after ``timeout`` seconds (no exception)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            if predicate():
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)


@dataclass
class OperatorStack:
    slurm: MultiNodeSlurm
    tls: TlsBroker
    agents: dict[str, Daemon]
    coordinator: Daemon
    kmsg: dict[str, Path]
    run_dir: Path  # <run_dir>/<node>/agent.sock: every node's agent.socket_path
    workdir: Path  # trainers' JSON lines and checkpoints
    ledger: Path
    coordinator_args: dict[str, Any] = field(default_factory=dict)

    # -- what the operator does ----------------------------------------------------------------

    def config(self, daemon: Daemon) -> Path:
        return daemon.workdir / f"{daemon.name}.toml"

    def ftd(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """An ``ftd`` command as typed on the host (its output kept for the test to read)."""
        return subprocess.run(
            [*FTD, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=self.slurm.env
        )

    def restart_coordinator(self, *, dry_run: bool) -> None:
        """Edit ``coordinator.policy.dry_run`` in the installed config and restart the service."""
        self.coordinator.stop()
        self.coordinator.config_text = shipped_configs.coordinator_config(
            **{**self.coordinator_args, "dry_run": dry_run}
        )
        mark = len(self.coordinator.log())
        self.coordinator.start()
        wait_log_after(self.coordinator, "api_listening", mark, 60)
        wait_log_after(self.coordinator, "bus_connected", mark, 60)

    def restart_agents(self, nodes: list[str]) -> None:
        """``systemctl restart ftd-agent`` on these nodes at once (SIGTERM, then start again)."""
        marks = {node: len(self.agents[node].log()) for node in nodes}
        for node in nodes:
            self.agents[node].stop()
        for node in nodes:
            self.agents[node].start()
        for node in nodes:
            wait_log_after(self.agents[node], "bus_connected", marks[node], 60)

    def kernel(self, node: str, line: str) -> None:
        with self.kmsg[node].open("a") as f:
            f.write(line + "\n")

    def submit(self, name: str, nodes: int, *extra: str, env: dict[str, str] | None = None) -> str:
        """``sbatch --requeue`` of the README trainer loop, one rank per node (``srun``)."""
        exports = {
            "FTD_DAY_DIR": str(self.workdir),
            "FTD_DAY_PORT_BASE": str(free_port()),
            "PYTHONPATH": str(REPO),
            "OMP_NUM_THREADS": "1",
            **(env or {}),
        }
        lines = ["#!/bin/bash", *(f"export {k}={v}" for k, v in exports.items())]
        # Every node's agent listens at the same agent.socket_path (here: one directory per node).
        socket = f"{self.run_dir}/$SLURMD_NODENAME/agent.sock"
        lines.append(
            f"srun --ntasks-per-node=1 bash -c 'export FTD_SOCKET={socket}; exec {sys.executable} {TRAINER}'"
        )
        return self.slurm.sbatch(
            "\n".join(lines) + "\n",
            "--requeue",
            f"--nodes={nodes}",
            "--ntasks-per-node=1",
            f"--job-name={name}",
            *extra,
        )

    # -- what the test reads -------------------------------------------------------------------

    def records(self, job: str, what: str | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for path in sorted(self.workdir.glob(f"{job}-rank*.jsonl")):
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if what is None or record["what"] == what:
                        out.append(record)
        return out

    def last_step(self, job: str, run: int | None = None) -> int:
        return max(
            (r["step"] for r in self.records(job, "step") if run is None or r["run"] == run), default=0
        )

    def job(self, job: str) -> dict[str, str]:
        return self.slurm.job(job)

    def actions(self) -> list[dict[str, Any]]:
        with sqlite3.connect(self.ledger) as db:
            rows = db.execute(
                "SELECT kind, target, state, request, detail, created FROM actions ORDER BY created"
            )
            return [
                {
                    "kind": kind,
                    "target": target,
                    "state": state,
                    "request": json.loads(request),
                    "detail": json.loads(detail) if detail else {},
                    "created": created,
                }
                for kind, target, state, request, detail, created in rows
            ]

    def events(self, kind: str) -> list[dict[str, Any]]:
        with sqlite3.connect(self.ledger) as db:
            rows = db.execute("SELECT body FROM events WHERE kind = ? ORDER BY ts", (kind,))
            return [json.loads(body) for (body,) in rows]


def wait_log_after(daemon: Daemon, needle: str, mark: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while needle not in daemon.log()[mark:]:
        if daemon.proc is not None and daemon.proc.poll() is not None:
            raise RuntimeError(f"{daemon.name} exited {daemon.proc.returncode}:\n{daemon.log()[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{daemon.name}: {needle!r} not logged after {timeout}s:\n{daemon.log()[-3000:]}"
            )
        time.sleep(0.1)


@contextlib.contextmanager
def operator_stack(
    tmp_path: Path,
    *,
    nodes: int,
    cpus: dict[str, int],
    weights: dict[str, int],
    heartbeat_timeout_s: float,
    save_deadline_s: float,
    stop_deadline_s: float,
) -> Iterator[OperatorStack]:
    names = [f"node-{i}" for i in range(1, nodes + 1)]
    run_dir = Path(tempfile.mkdtemp(prefix="ftd-day-", dir="/tmp"))  # unix socket paths must be short
    daemons: list[Daemon] = []
    try:
        with tls_broker(tmp_path / "pki", [*names, "coordinator"]) as tls:
            slurm = MultiNodeSlurm(tmp_path / "slurm", nodes=nodes, cpus=cpus, weights=weights).start()
            try:
                creds = tmp_path / "credentials"  # systemd's LoadCredential= directory
                creds.mkdir()
                (creds / "api-token").write_text("operator-day-token\n")
                cert, key = tls.cert("coordinator")
                coordinator_args: dict[str, Any] = {
                    "port": tls.tls_port,
                    "ca": tls.ca,
                    "cert": cert,
                    "key": key,
                    "ledger": tmp_path / "ledger.sqlite",
                    "slurm_conf": slurm.conf_path,
                    "api_port": free_port(),
                    "save_deadline_s": save_deadline_s,
                    "stop_deadline_s": stop_deadline_s,
                }
                coordinator = Daemon(
                    "coordinator",
                    shipped_configs.coordinator_config(**coordinator_args),
                    tmp_path / "etc",
                    env={"CREDENTIALS_DIRECTORY": str(creds), "SLURM_CONF": str(slurm.conf_path)},
                )
                agents: dict[str, Daemon] = {}
                kmsg: dict[str, Path] = {}
                for name in names:
                    kmsg[name] = tmp_path / f"kmsg-{name}"
                    kmsg[name].touch()
                    (run_dir / name).mkdir()
                    cert, key = tls.cert(name)
                    agents[name] = Daemon(
                        f"agent-{name}",
                        shipped_configs.agent_config(
                            node=name,
                            port=tls.tls_port,
                            ca=tls.ca,
                            cert=cert,
                            key=key,
                            kmsg=kmsg[name],
                            state_dir=tmp_path / f"state-{name}",
                            socket_path=run_dir / name / "agent.sock",
                            socket_group="root",
                            heartbeat_timeout_s=heartbeat_timeout_s,
                        ),
                        tmp_path / "etc",
                    )
                workdir = tmp_path / "jobs"
                workdir.mkdir()
                stack = OperatorStack(
                    slurm, tls, agents, coordinator, kmsg, run_dir, workdir,
                    coordinator_args["ledger"], coordinator_args,
                )  # fmt: skip
                # `ftd check-config` on every installed file, as operators.md says, before starting.
                for daemon in (coordinator, *agents.values()):
                    daemon.workdir.mkdir(parents=True, exist_ok=True)
                    stack.config(daemon).write_text(daemon.config_text)
                    checked = subprocess.run(
                        [*FTD, "check-config", str(stack.config(daemon))],
                        cwd=REPO, capture_output=True, text=True, timeout=60,
                        env={**os.environ, **(daemon.env or {})},
                    )  # fmt: skip
                    assert checked.returncode == 0, (
                        f"check-config {daemon.name}: {checked.stdout}{checked.stderr}"
                    )
                daemons.append(coordinator)
                coordinator.start()
                coordinator.wait_log("api_listening", 60)
                coordinator.wait_log("bus_connected", 60)
                for agent in agents.values():
                    daemons.append(agent)
                    agent.start()
                for agent in agents.values():
                    agent.wait_log("bus_connected", 60)
                try:
                    yield stack
                finally:
                    for daemon in daemons:
                        daemon.stop()
                    for daemon in daemons:
                        print(f"----- {daemon.name} log (tail)\n{daemon.log()[-6000:]}")
            finally:
                slurm.stop()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
