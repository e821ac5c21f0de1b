"""`ftd rules test`: replay recorded events through rules and gate, simulated clock, nothing executed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftd.cli import main
from ftd.coordinator.ledger import Ledger
from ftd.events import make_event


def write_events(path: Path) -> None:
    ledger = Ledger(path.parent / "ledger.sqlite")
    for i, node in enumerate(["node-1", "node-2", "node-3"]):
        ledger.record_event(
            make_event(node, "xid", severity="critical", data={"code": 79}, ts=1000 + i, id=f"e{i}")
        )
    ledger.record_event(
        make_event("node-1", "rank_heartbeat_lost", data={"job": "j1", "rank": 0}, ts=2000, id="e9")
    )
    with path.open("w") as out:
        ledger.export_events(out)
        out.write("not json\n")
    ledger.close()


def test_replay_prints_verdicts_and_a_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = tmp_path / "events.jsonl"
    write_events(events)
    config = tmp_path / "ftd.toml"
    config.write_text("[coordinator.policy]\nmax_drained_fraction = 0.0\nmin_drain_budget = 1\n")
    assert (
        main(
            [
                "rules",
                "test",
                "--events",
                str(events),
                "--config",
                str(config),
                "--json",
                "--no-entry-points",
                "--job",
                "j1=node-1,node-4",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["events"] == 4 and len(doc["bad_lines"]) == 1
    drains = [a for a in doc["actions"] if a["kind"] == "drain_node"]
    assert [(a["target"], a["verdict"]) for a in drains] == [
        ("node-1", "allowed"),
        ("node-2", "suppressed"),
        ("node-3", "suppressed"),
    ]
    assert drains[1]["policy"].startswith("blast radius") and drains[1]["event_id"] == "e1"
    kinds = {(a["rule"], a["kind"], a["target"]) for a in doc["actions"]}
    assert ("hang", "collect_diagnostics", "node-1") in kinds
    summary = {(row["rule"], row["kind"]): row for row in doc["summary"]}
    assert summary[("xid_catalog", "drain_node")]["suppressed"] == 2

    assert main(["rules", "test", "--events", str(events), "--no-entry-points"]) == 0
    text = capsys.readouterr().out
    assert "SUPPRESSED (blast radius" in text and "xid_catalog  drain_node" in text


def test_bad_config_or_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "test", "--events", str(tmp_path / "none.jsonl"), "--no-entry-points"]) == 2
    config = tmp_path / "bad.toml"
    config.write_text('[coordinator]\nrules_file = "' + str(tmp_path / "missing.toml") + '"\n')
    (tmp_path / "e.jsonl").write_text("")
    assert main(["rules", "test", "--events", str(tmp_path / "e.jsonl"), "--config", str(config)]) == 2
    assert "cannot read rules file" in capsys.readouterr().err
