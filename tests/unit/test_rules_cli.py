"""`ftd rules test`: replay recorded events through rules and gate, simulated clock, nothing executed."""

from __future__ import annotations

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
    assert ("hang", "diagnose_hang", "j1") in kinds
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
    """Rules are handed ``policy.app_fault_*`` (``settings``) as the coordinator hands them, so
    ``--config`` decides (it used to replay with the defaults whatever the file said)."""
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

    assert replay() == [("checkpoint_restart", "x0"), ("checkpoint_restart", "x1")]
    assert replay("--config", str(config)) == [("checkpoint_restart", "x0"), ("notify", "x1")]
    assert replay() == [("checkpoint_restart", "x0"), ("checkpoint_restart", "x1")]  # nothing left over


# --- the cluster the budgets count (issue #21 item 5) -------------------------------------------------

FALLEN_OFF = "NVRM: Xid (PCI:0000:{bus}:00): 79, pid=0, GPU has fallen off the bus.\n"


def _two_drains(path: Path) -> None:
    """Xid 79 on node-1 and, ten minutes later, on node-2: two drains a big cluster allows."""
    with path.open("w") as out:
        for i, node in enumerate(["node-1", "node-2"]):
            event = make_event(
                node, "xid", severity="critical", data={"code": 79}, ts=1000 + 600 * i, id=f"x{i}"
            )
            out.write(msgspec.json.encode(event).decode() + "\n")


def _drains(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[list[tuple[str, str]], dict[str, object]]:
    capsys.readouterr()
    assert main(["rules", "test", "--json", "--no-entry-points", *argv]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return [(a["target"], a["verdict"]) for a in doc["actions"] if a["kind"] == "drain_node"], doc


def test_budgets_count_the_cluster_from_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = tmp_path / "events.jsonl"
    _two_drains(events)
    drains, doc = _drains(["--events", str(events)], capsys)
    assert drains == [("node-1", "allowed"), ("node-2", "suppressed")]  # 2 of the 2 nodes seen
    assert doc["cluster"]["nodes"] == 0 and "only the nodes seen" in doc["cluster"]["source"]
    config = tmp_path / "c.toml"
    nodes = ", ".join(f'"node-{i}"' for i in range(1, 21))
    config.write_text(f'[[coordinator.node_labels]]\nnodes = [{nodes}]\nrack = "r1"\n')
    drains, doc = _drains(["--events", str(events), "--config", str(config)], capsys)
    assert drains == [("node-1", "allowed"), ("node-2", "allowed")]  # budget 2 of 20 (fraction 0.1)
    assert doc["cluster"] == {"source": "20 nodes from coordinator.node_labels", "nodes": 20}


def test_budgets_and_labels_from_a_running_coordinator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ftd.config.schema import NodeLabelsConfig
    from ftd.events import NodeStatus
    from tests.unit.live_api import live_api

    async def twenty(coordinator: object) -> None:
        for i in range(3, 21):
            coordinator.state.apply_status(NodeStatus(node=f"node-{i}", state="online", ts=1.0))  # type: ignore[attr-defined]

    events = tmp_path / "events.jsonl"
    _two_drains(events)
    rack = [NodeLabelsConfig(nodes=["node-1", "node-2"], rack="r1")]
    with live_api(seed=twenty, node_labels=rack) as url:
        drains, doc = _drains(["--events", str(events), "--from", url], capsys)
        assert drains == [("node-1", "allowed"), ("node-2", "allowed")]
        assert doc["cluster"] == {"source": f"20 nodes from the coordinator at {url}", "nodes": 20}
        # the coordinator's rack labels (node-1, node-2: r1) with a per-rack budget of 1: held
        config = tmp_path / "c.toml"
        port = url.rsplit(":", 1)[1]
        config.write_text(
            f"[coordinator.api]\nport = {port}\n"
            '[[coordinator.node_labels]]\nnodes = ["node-99"]\nrack = "r9"\n'
            '[[coordinator.policy.domain_budgets]]\nlabel = "rack"\nmax_drained = 1\n'
        )
        drains, doc = _drains(["--events", str(events), "--config", str(config), "--from-api"], capsys)
        assert drains == [("node-1", "allowed"), ("node-2", "suppressed")]
        assert "rack r1 already has 1 node(s) drained" in doc["actions"][-1]["policy"]


def test_parse_kmsg_output_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "dmesg.txt"
    log.write_text("[  100.5] " + FALLEN_OFF.format(bus="3b") + "[  200.0] " + FALLEN_OFF.format(bus="5e"))
    parsed = tmp_path / "parsed.jsonl"
    assert main(["parse", "kmsg", str(log)]) == 0
    parsed.write_text(capsys.readouterr().out + '{"kind": "ecc", "data": {"dbe": 1}}\n')
    drains, doc = _drains(["--events", str(parsed), "--node", "gpu-7"], capsys)
    assert doc["bad_lines"] == [] and doc["filled"] == 3 and doc["events"] == 3
    assert drains == [("gpu-7", "allowed"), ("gpu-7", "suppressed")]  # the second: same node, held
    first = next(a for a in doc["actions"] if a["kind"] == "drain_node")
    assert first["event_id"] == "kmsg-1" and first["ts"] == 100.5 and "0000:3b:00.0" in first["reason"]
    capsys.readouterr()
    assert main(["rules", "test", "--no-entry-points", "--events", str(parsed), "--node", "gpu-7"]) == 0
    out = capsys.readouterr().out
    assert "3 line(s) completed with defaults" in out and "missing required field" not in out


RAW_DMESG = (
    "[    0.000000] Linux version 6.1.0-18-amd64 (builder@example) #1 SMP\n"
    "[    2.114000] pci 0000:3b:00.0: [10de:2330] type 00 class 0x030200\n"
    "[   14.520000] nvidia: loading out-of-tree module taints kernel.\n"
    "[   15.031000] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15\n"
    "[   98.200000] systemd[1]: Started ftd-agent.service.\n"
    "[  100.500000] " + FALLEN_OFF.format(bus="3b") + "[  101.250000] eth0: link up, 100 Gbps, full duplex\n"
    "[  130.000000] " + FALLEN_OFF.format(bus="5e")
)


def test_a_raw_kernel_log_is_read_through_the_agents_parser(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #32: a dmesg file was eight bad lines ("Expected object"), 0 events and exit 0."""
    log = tmp_path / "dmesg.txt"
    log.write_text(RAW_DMESG)
    drains, doc = _drains(["--events", str(log), "--node", "gpu-7"], capsys)
    assert doc["bad_lines"] == [] and doc["events"] == 2, doc
    assert doc["input"] == {"format": "kernel log", "kernel_lines": 8, "kernel_events": 2}
    assert drains == [("gpu-7", "allowed"), ("gpu-7", "suppressed")]
    first = next(a for a in doc["actions"] if a["kind"] == "drain_node")
    assert first["event_id"] == "kmsg-6" and first["ts"] == 100.5 and "0000:3b:00.0" in first["reason"]
    capsys.readouterr()
    assert main(["rules", "test", "--no-entry-points", "--events", str(log), "--node", "gpu-7"]) == 0
    out = capsys.readouterr().out
    assert "0 bad line(s)" in out and "Expected object" not in out, out
    assert "input: a kernel log: 8 line(s), 2 event(s) found by the agent's kernel-log parser" in out
    assert "2 events replayed" in out


def test_a_json_file_with_a_raw_line_keeps_it_a_bad_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first line decides: JSON lines stay JSON lines, a line that is not one is reported."""
    events = tmp_path / "events.jsonl"
    event = make_event("node-1", "xid", severity="critical", data={"code": 79}, ts=1000, id="e0")
    events.write_bytes(msgspec.json.encode(event) + b"\n[  100.5] " + FALLEN_OFF.format(bus="3b").encode())
    _, doc = _drains(["--events", str(events)], capsys)
    assert doc["events"] == 1 and [b["line"] for b in doc["bad_lines"]] == [2]  # type: ignore[index]
    assert doc["input"] == {"format": "json lines", "kernel_lines": 0, "kernel_events": 0}
