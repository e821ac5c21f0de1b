"""`ftd inject`'s own errors: bad ``--data`` and no agent on the socket are clear sentences.

The drill's real path (the event handed to the node's agent over its socket, published by the agent
itself through its spool and session, on the shipped broker) is tested end to end in
``tests/e2e/test_drill_inject.py``; who may inject in ``tests/security/test_inject_rights.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ftd.cli import main


def agent_config(tmp_path: Path) -> str:
    path = tmp_path / "agent.toml"
    path.write_text(f'[agent]\nnode = "node-7"\nsocket_path = "{tmp_path / "absent.sock"}"\n')
    return str(path)


def test_bad_data_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = agent_config(tmp_path)
    assert main(["inject", "xid", "--config", config, "--data", "[1]"]) == 2
    assert "--data must be a JSON object" in capsys.readouterr().err
    assert main(["inject", "xid", "--config", config, "--data", "{oops"]) == 2
    assert "--data is not JSON" in capsys.readouterr().err


def test_no_agent_on_the_socket_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FTD_SOCKET", raising=False)
    config = agent_config(tmp_path)
    assert main(["inject", "ecc", "--config", config, "--timeout", "0.5"]) == 2
    err = capsys.readouterr().err
    assert f"no agent answers at {tmp_path / 'absent.sock'}" in err and "ftd-agent running" in err
    other = tmp_path / "other.sock"
    assert main(["inject", "ecc", "--config", config, "--socket", str(other)]) == 2
    assert f"no agent answers at {other}" in capsys.readouterr().err
