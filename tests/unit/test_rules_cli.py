"""`ftd rules test`: replay recorded events through rules and gate, simulated clock, nothing executed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import msgspec
import pytest

from ftd.cli import main
from ftd.coordinator.ledger.sqlite import Ledger
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


def test_replay_takes_the_crash_loop_limits_from_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rules read ``policy.app_fault_*`` in ``ftd_startup``; a replay calls it as the coordinator
    does, so ``--config`` decides (it used to replay with the defaults whatever the file said)."""
    from ftd.rules import _incidents

    saved = dataclasses.replace(_incidents.APP_POLICY)
    events = tmp_path / "events.jsonl"
    with events.open("w") as out:
        for i in range(2):  # two incidents of the same application fault, 15 minutes apart
            data = {"code": 13, "pci": "0000:1b:00.0", "uuid": "GPU-aaaa"}
            event = make_event("node-1", "xid", severity="error", data=data, ts=1000 + 900 * i, id=f"x{i}")
            out.write(msgspec.json.encode(event).decode() + "\n")
    config = tmp_path / "ftd.toml"
    config.write_text("[coordinator.policy]\napp_fault_restart_limit = 1\n")

    def replay(*extra: str) -> list[tuple[str, str]]:
        args = ["rules", "test", "--events", str(events), "--json", "--no-entry-points", "--job", "j1=node-1"]
        assert main([*args, *extra]) == 0
        doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        return [(a["kind"], a["event_id"]) for a in doc["actions"] if a["rule"] == "xid_catalog"]

    try:
        assert replay() == [("checkpoint_restart", "x0"), ("checkpoint_restart", "x1")]
        assert replay("--config", str(config)) == [("checkpoint_restart", "x0"), ("notify", "x1")]
    finally:
        _incidents.APP_POLICY.__dict__.update(saved.__dict__)
