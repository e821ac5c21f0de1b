"""``ftd status`` against a live API, and ``ftd events export`` from a ledger file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftd.cli import main
from ftd.coordinator.ledger.sqlite import Ledger
from ftd.events import Kind, make_event
from tests.realparts import free_port
from tests.unit.live_api import live_api


def test_status_prints_nodes_jobs_and_actions(capsys: pytest.CaptureFixture[str]) -> None:
    with live_api() as url:
        assert main(["status", "--url", url]) == 0
        text = capsys.readouterr().out
        assert main(["status", "--url", url + "/", "--json"]) == 0
        data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "NODES (2: 1 online, 1 offline, 1 drained by ftd, 0 unavailable)" in text
    lines = text.splitlines()
    node2 = next(line for line in lines if line.startswith("node-2"))
    assert node2.split()[:3] == ["node-2", "offline", "ftd"] and "ftd: xid 79 gpu 0000:3b:00.0" in node2
    job = next(line for line in lines if line.startswith("42 "))
    # no checkpoint reported; client: ranks registered; no Prolog user; no rank supervisor (gen, spares)
    assert job.split() == ["42", "training", "node-1", "2", "7", "-", "yes", "-", "-", "-"]
    assert any("act-known" in line and "drain_node" in line and "succeeded" in line for line in lines)
    assert set(data) == {"health", "nodes", "jobs", "actions", "ha"}
    assert data["ha"] == {"role": "single", "ledger": "sqlite", "leader": None, "epoch": None}
    assert "single coordinator (sqlite ledger)" in text
    assert [n["name"] for n in data["nodes"]] == ["node-1", "node-2"]


def test_status_url_from_config_and_unreachable_api(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()  # nothing listens there
    config = tmp_path / "c.toml"
    config.write_text(f'[coordinator.api]\nhost = "0.0.0.0"\nport = {port}\n')
    assert main(["status", "--config", str(config), "--timeout", "2"]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach the coordinator API at http://127.0.0.1:{port}" in err


def test_events_export_writes_json_lines_oldest_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger_path = tmp_path / "ledger.sqlite"
    ledger = Ledger(ledger_path)
    for i, ts in enumerate((30.0, 10.0, 20.0)):
        ledger.record_event(make_event("node-1", Kind.XID, data={"code": 79 + i}, ts=ts, id=f"e{i}"))
    ledger.close()
    config = tmp_path / "c.toml"
    config.write_text(f'[coordinator]\nledger_path = "{ledger_path}"\n')
    out = tmp_path / "events.jsonl"
    assert main(["events", "export", "--config", str(config), "--out", str(out)]) == 0
    assert "exported 3 events" in capsys.readouterr().err
    events = [json.loads(line) for line in out.read_text().splitlines()]
    assert [e["id"] for e in events] == ["e1", "e2", "e0"]
    assert events[0]["kind"] == "xid" and events[0]["data"] == {"code": 80}

    assert main(["events", "export", "--config", str(config)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3


def test_events_export_never_creates_a_ledger(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.toml"
    missing = tmp_path / "nope" / "ledger.sqlite"
    config.write_text(f'[coordinator]\nledger_path = "{missing}"\n')
    assert main(["events", "export", "--config", str(config)]) == 1
    assert "no ledger at" in capsys.readouterr().err
    assert not missing.parent.exists()
