"""One node's real daemons without a scheduler, shared by the e2e tests that need no Slurm: real
Mosquitto (the ``mosquitto`` fixture), ``ftd agent`` (node-1, reading its kernel log from a file the
test appends to) and ``ftd coordinator`` (``scheduler = "none"``) as subprocesses with TOML configs.

:func:`one_node` builds it (a context manager; ``agent_extra`` / ``coordinator_extra`` are TOML
appended to the daemons' configs, ``coordinator_keys`` more keys of ``[coordinator]``;
``api_port`` turns the coordinator's HTTP API on; ``agent_env`` is added to the agent's environment).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.e2e.daemons import REPO, Daemon
from tests.e2e.shipped_stack import _log_records
from tests.realparts import Mosquitto

__all__ = ["Node", "one_node"]


@dataclass
class Node:
    agent: Daemon
    coordinator: Daemon
    kmsg: Path
    socket: str
    ledger: Path
    workdir: Path
    api: str | None = None  # the coordinator's API base URL, when it serves one

    def kernel_line(self, line: str) -> None:
        with self.kmsg.open("a") as f:
            f.write(line + "\n")

    def ledger_events(self, kind: str) -> list[dict[str, Any]]:
        with sqlite3.connect(self.ledger) as db:
            rows = db.execute("SELECT body FROM events WHERE kind = ?", (kind,)).fetchall()
        return [json.loads(body) for (body,) in rows]

    def actions(self) -> list[dict[str, Any]]:
        """Every action in the ledger, oldest first: kind, state, request and detail."""
        with sqlite3.connect(self.ledger) as db:
            rows = db.execute("SELECT kind, state, request, detail FROM actions ORDER BY created").fetchall()
        return [
            {"kind": k, "state": s, "request": json.loads(r), "detail": json.loads(d) if d else {}}
            for k, s, r, d in rows
        ]

    def decisions(self) -> list[dict[str, Any]]:
        return _log_records(self.coordinator.log(), "action_decided")

    def agent_records(self, event: str) -> list[dict[str, Any]]:
        return _log_records(self.agent.log(), event)


@contextlib.contextmanager
def one_node(
    mosquitto: Mosquitto,
    tmp_path: Path,
    *,
    agent_extra: str = "",
    coordinator_extra: str = "",
    coordinator_keys: str = "",
    api_port: int | None = None,
    agent_env: dict[str, str] | None = None,
) -> Iterator[Node]:
    """Start the agent and the coordinator; stop them (and print their logs' tails) on exit."""
    run_dir = Path(tempfile.mkdtemp(prefix="ftd-node-", dir="/tmp"))  # unix socket paths must be short
    kmsg = tmp_path / "kmsg"
    kmsg.touch()
    socket_path = str(run_dir / "agent.sock")
    ledger = tmp_path / "ledger.sqlite"
    bus = f'[bus]\nhost = "127.0.0.1"\nport = {mosquitto.port}\nkeepalive_s = 2\nreconnect_max_s = 1.0\n'
    logs = '[log]\nlevel = "info"\njson = true\n'
    api = (
        f'[coordinator.api]\nenabled = true\nhost = "127.0.0.1"\nport = {api_port}\n'
        if api_port is not None
        else "[coordinator.api]\nenabled = false\n"
    )
    agent = Daemon(
        "agent-node-1",
        f"""{bus}
[agent]
node = "node-1"
kmsg_path = "{kmsg}"
kmsg_from_start = true
state_dir = "{tmp_path / "agent-state"}"
socket_path = "{socket_path}"

{logs}
{agent_extra}""",
        tmp_path,
        env=agent_env,
        cwd=REPO,
    )
    coordinator = Daemon(
        "coordinator",
        f'{bus}\n[coordinator]\nledger_path = "{ledger}"\nscheduler = "none"\n{coordinator_keys}\n\n'
        f"{api}\n{logs}\n{coordinator_extra}",
        tmp_path,
        cwd=REPO,
    )
    coordinator.start()
    agent.start()
    try:
        coordinator.wait_log("node_status", timeout=30)
        agent.wait_log("agent_started", timeout=30)
        url = f"http://127.0.0.1:{api_port}" if api_port is not None else None
        yield Node(agent, coordinator, kmsg, socket_path, ledger, tmp_path, url)
    finally:
        agent.stop()
        coordinator.stop()
        for daemon in (agent, coordinator):
            print(f"----- {daemon.name} log (tail)\n{daemon.log()[-4000:]}")
