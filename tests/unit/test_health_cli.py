"""``ftd health`` against a stand-in agent socket and a stand-in ``scontrol`` that records its calls:
drain only when a condition is active and the node is not already out, resume (``--resume``) only a
node this command drained, NHC-style output, one deadline (the real Slurm: tests/e2e/test_slurm_hooks.py)."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftd.cli import main


class Agent:
    """Answers every connection's first line with ``conditions``; ``silent`` answers nothing."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.conditions: list[dict[str, Any]] = []
        self.silent = False
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(path)
        self.sock.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                if self.silent:
                    conn.recv(1)  # until the client gives up
                    continue
                reply = {"v": 1, "op": "conditions", "node": "node-7", "conditions": self.conditions}
                conn.sendall(json.dumps(reply).encode() + b"\n")


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    a = Agent(str(tmp_path / "a.sock"))
    yield a
    a.sock.close()


def scontrol(tmp_path: Path, state: str, reason: str = "none") -> tuple[str, Path]:
    calls = tmp_path / "calls"
    script = tmp_path / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        'if [ "$1" = show ]; then '
        f'echo "NodeName=$4 State={state} Reason={reason} [root@2026-11-24T10:00:00] Comment=x"; fi\n'
    )
    script.chmod(0o755)
    return str(script), calls


XID = {"key": "xid:0000:3b:00.0", "kind": "xid", "reason": "xid 79 on 0000:3b:00.0", "since": 1.0}


def test_healthy_prints_nothing_and_touches_nothing(agent: Agent, tmp_path: Path, capsys: Any) -> None:
    tool, calls = scontrol(tmp_path, "IDLE")
    assert main(["health", "--slurm", "--socket", agent.path, "--scontrol", tool]) == 0
    assert capsys.readouterr().out == ""
    assert calls.read_text().splitlines() == ["show node -o node-7"]  # the agent's node name


def test_a_condition_drains_with_ftds_reason_unless_already_out(
    agent: Agent, tmp_path: Path, capsys: Any
) -> None:
    agent.conditions = [XID, {**XID, "key": "fs_fill:/scratch", "reason": "fs /scratch 97% full (bytes)"}]
    tool, calls = scontrol(tmp_path, "MIXED")
    assert main(["health", "--slurm", "--socket", agent.path, "--scontrol", tool]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "ERROR:  ftd:  Health check failed:  xid 79 on 0000:3b:00.0",
        "ERROR:  ftd:  Health check failed:  fs /scratch 97% full (bytes)",
    ]
    assert calls.read_text().splitlines()[-1] == (
        "update nodename=node-7 state=drain "
        "reason=ftd: health: xid 79 on 0000:3b:00.0; fs /scratch 97% full (bytes)"
    )
    calls.unlink()
    tool, calls = scontrol(tmp_path, "IDLE+DRAIN", "operator maintenance")
    assert main(["health", "--slurm", "--socket", agent.path, "--scontrol", tool]) == 1
    assert calls.read_text().splitlines() == ["show node -o node-7"]  # already out: left as is


def test_resume_gives_back_only_what_health_drained(agent: Agent, tmp_path: Path, capsys: Any) -> None:
    tool, calls = scontrol(tmp_path, "IDLE+DRAIN", "ftd: health: xid 79 on 0000:3b:00.0")
    assert main(["health", "--slurm", "--resume", "--socket", agent.path, "--scontrol", tool]) == 0
    assert calls.read_text().splitlines()[-1] == "update nodename=node-7 state=resume"
    calls.unlink()
    tool, calls = scontrol(tmp_path, "IDLE+DRAIN", "ftd: xid 79 gpu 0000:3b:00.0")  # the coordinator's
    assert main(["health", "--slurm", "--resume", "--socket", agent.path, "--scontrol", tool]) == 0
    assert calls.read_text().splitlines() == ["show node -o node-7"]
    calls.unlink()
    assert main(["health", "--slurm", "--socket", agent.path, "--scontrol", tool]) == 0  # no --resume
    assert calls.read_text().splitlines() == ["show node -o node-7"]


def test_a_silent_agent_costs_the_deadline_only(agent: Agent, tmp_path: Path, capsys: Any) -> None:
    agent.silent = True
    tool, calls = scontrol(tmp_path, "IDLE")
    args = ["health", "--slurm", "--socket", agent.path, "--scontrol", tool, "--timeout", "0.4", "--json"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["healthy"] is None and result["error"].endswith("timed out")
    assert not calls.exists()  # conditions unknown: Slurm is not touched
    assert os.path.exists(agent.path)


def test_config_names_the_agent_socket(agent: Agent, tmp_path: Path, capsys: Any) -> None:
    """``--config`` like ftd inject and the other commands: the agent config's socket_path."""
    agent.conditions = [XID]
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nnode = "node-7"\nsocket_path = "{agent.path}"\n')
    assert main(["health", "--config", str(config)]) == 1
    assert capsys.readouterr().out == "ERROR:  ftd:  Health check failed:  xid 79 on 0000:3b:00.0\n"
    config.write_text("[agent]\nsocket_path = 7\n")
    assert main(["health", "--config", str(config)]) == 2
    assert "agent.socket_path" in capsys.readouterr().err
