"""The trainer client fails open but never silently: one stderr line, with a hint, per Client.

Issue #11: a trainer that could not reach the agent (EACCES on a root-only socket) said nothing, so
nobody knew the job was unprotected. EACCES itself needs another user: tests/security/
test_trainer_socket.py runs that case as an unprivileged user. Here: ENOENT and ECONNREFUSED.
"""

from __future__ import annotations

import socket
import tempfile
import time
from pathlib import Path

import pytest

from ftd.client import Client


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("ftd client:")]


def _run_client(path: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    client = Client(job="j1", socket_path=path, retry_interval=0.02)
    try:
        deadline = time.monotonic() + 10
        seen = ""
        while time.monotonic() < deadline:
            seen += capsys.readouterr().err
            if _lines(seen):
                time.sleep(0.3)  # a dozen more failed attempts: still one line
                return _lines(seen + capsys.readouterr().err)
            time.sleep(0.01)
    finally:
        client.close()
    return []


def test_absent_socket_says_once_that_the_job_is_unprotected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = _run_client(str(tmp_path / "absent.sock"), capsys)
    assert len(lines) == 1, lines
    assert "ENOENT" in lines[0] and "is ftd-agent running" in lines[0] and "NOT protected" in lines[0]


def test_nobody_listening_says_econnrefused(capsys: pytest.CaptureFixture[str]) -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        path = f"{d}/a.sock"
        dead = socket.socket(socket.AF_UNIX)
        dead.bind(path)  # bound, never listening: what a crashed agent leaves
        try:
            lines = _run_client(path, capsys)
        finally:
            dead.close()
    assert len(lines) == 1, lines
    assert "ECONNREFUSED" in lines[0] and "stopped or restarting" in lines[0]
