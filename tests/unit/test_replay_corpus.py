"""The replay corpus of the built-in rules: events in, expected actions out, one file per scenario.

``tests/replay/scenarios/<scenario>.jsonl`` holds the events as the agent (or the coordinator, for
``node_offline``) sends them; ``<scenario>.expected.json`` the job placements (``jobs``, given to
``--job``), the events that must trigger nothing (``negative_controls``, each with why) and every
action in order (``event_id``, ``rule``, ``kind``, ``target``, ``verdict`` and a ``why``).

Each scenario is replayed through ``ftd rules test --json`` (the real engine, policy gate and every
built-in rule, nothing else) and must produce exactly its expected actions. Every built-in rule must
propose at least one action in some scenario: a new built-in rule without a scenario fails here. The
events are checked against what the agent's parsers really emit (kernel lines re-parsed, log lines
against the pattern table, NVML events carrying the GPU's identity; the fs and memory watchers'
data keys), so a scenario cannot pass on events the agent would never send.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ftd.agent.kmsg_parse import parse_lines
from ftd.catalog.log_patterns import load_patterns
from ftd.cli import main
from ftd.coordinator.decide.plugins import DEFAULT_RULES, default_rule_name
from ftd.events import Event, decode

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "tests" / "replay" / "scenarios"
NAMES = sorted(p.name.removesuffix(".jsonl") for p in SCENARIOS.glob("*.jsonl"))
BUILTINS = [default_rule_name(module) for module in DEFAULT_RULES]
FIELDS = ("event_id", "rule", "kind", "target", "verdict")

_PCI = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_LOG_KEYS = {"file", "line", "offset", "pattern", "text", "suppressed"}
_FS_KEYS = {"path", "reason", "level", "used_pct", "inodes_used_pct", "time_to_full_s", "capacity_factor"}
_MEM_LEAK_KEYS = {"leak", "pid", "job", "rank", "rss_mb", "growth_mb_per_min", "time_to_exhaustion_s"}
_FABRIC_COUNTER_KEYS = {"status", "source", "counter", "class", "per_s", "per_hour", "threshold", "profile"}
_PCIE_KEYS = {"pci", "cur_width", "max_width", "lanes_lost", "bandwidth_pct", "what", "status", "from"}
_MEM_HOST_KEYS = {"leak", "level", "previous", "mem_available_pct", "mem_available_mb", "mem_total_mb"}


def read_events(name: str) -> list[Event]:
    text = (SCENARIOS / f"{name}.jsonl").read_text()
    return [decode(line, Event) for line in text.splitlines() if line.strip()]


def expected_of(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((SCENARIOS / f"{name}.expected.json").read_text())
    return doc


def replay(name: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    argv = ["rules", "test", "--events", str(SCENARIOS / f"{name}.jsonl"), "--json", "--no-entry-points"]
    for job, nodes in expected_of(name)["jobs"].items():
        argv += ["--job", f"{job}={','.join(nodes)}"]
    assert main(argv) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return doc


def check_realistic(event: Event, patterns: dict[str, Any], seen: set[str]) -> None:
    """What the agent's watchers and storm control would have sent (or fail, naming the event)."""
    data, where = event.data, f"event {event.id}"
    if "repeat_of" in data:  # a storm-control summary of an earlier event of the scenario
        assert data["repeat_of"] in seen and event.id.startswith(data["repeat_of"]), where
    if event.source == "kmsg":
        parsed = list(parse_lines([data["message"]]))
        assert [(k.kind, k.pci, k.code) for k in parsed] == [
            (event.kind, data.get("pci"), data.get("code"))
        ], where
    elif event.source == "logs":
        assert set(data) == _LOG_KEYS, where
        first = next(p for p in patterns.values() if p.regex.search(data["text"]))  # the watcher's choice
        assert (first.name, first.severity) == (data["pattern"], event.severity), where
    elif event.source == "nvml":
        assert str(data.get("uuid", "")).startswith("GPU-") and _PCI.match(str(data.get("pci"))), where
        assert isinstance(data.get("index"), int), where
    elif event.source == "fs":
        assert set(data) >= _FS_KEYS and data["reason"] in ("threshold", "forecast"), where
        assert data.get("resource") in ("bytes", "inodes"), where
    elif event.source == "memory":
        assert (_MEM_LEAK_KEYS if data.get("leak") else _MEM_HOST_KEYS) <= set(data), where
    elif event.source == "fabric":  # ftd.agent.watchers.fabric: every event names its check's subject
        assert isinstance(data.get("subject"), str) and data["subject"], where
        if event.kind == "fabric":
            assert data.get("check") in ("counter", "port_rate", "skipped"), where
            if data["check"] == "counter":
                assert set(data) >= _FABRIC_COUNTER_KEYS, where
        else:
            assert event.kind == "pcie_link" and set(data) >= _PCIE_KEYS, where
    else:
        assert event.source in ("heartbeat", "coordinator", "agent"), (
            f"{where}: unexpected source {event.source!r}"
        )


def test_the_corpus_is_there() -> None:
    assert len(NAMES) >= 10, NAMES
    for name in NAMES:
        assert (SCENARIOS / f"{name}.expected.json").is_file(), f"{name}.jsonl has no expected file"
    stray = {p.name for p in SCENARIOS.iterdir()} - {
        f"{n}{s}" for n in NAMES for s in (".jsonl", ".expected.json")
    }
    assert not stray, f"files in the corpus without a scenario: {sorted(stray)}"


@pytest.mark.parametrize("name", NAMES)
def test_scenario_events_are_what_the_agent_sends(name: str) -> None:
    patterns = {p.name: p for p in load_patterns()}
    seen: set[str] = set()
    events = read_events(name)
    for event in events:
        assert event.id not in seen, f"duplicate id {event.id}"
        check_realistic(event, patterns, seen)
        seen.add(event.id)
    assert [e.ts for e in events] == sorted(e.ts for e in events), "events must be in time order"


@pytest.mark.parametrize("name", NAMES)
def test_scenario_replays_to_the_expected_actions(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    expected = expected_of(name)
    event_ids = [e.id for e in read_events(name)]
    doc = replay(name, capsys)
    assert doc["bad_lines"] == [] and doc["rule_errors"] == [] and doc["duplicates"] == 0
    assert doc["events"] == len(event_ids)
    actual = [tuple(a[f] for f in FIELDS) for a in doc["actions"]]
    assert actual == [tuple(a[f] for f in FIELDS) for a in expected["actions"]]
    assert all(a["why"].strip() for a in expected["actions"]), "every expected action says why"
    unfilled = [a["reason"] for a in doc["actions"] if re.search(r"\{\w+\}", a["reason"])]
    assert not unfilled, f"reason placeholders the event did not fill: {unfilled}"
    negatives = expected["negative_controls"]
    assert negatives, "a scenario needs events that must trigger nothing"
    assert set(negatives) <= set(event_ids), "negative controls must be events of the scenario"
    assert not set(negatives) & {a["event_id"] for a in doc["actions"]}


def test_every_builtin_rule_has_a_scenario() -> None:
    """A built-in rule that proposes nothing in any scenario is a rule without a replay: fail."""
    proposing = {a["rule"] for name in NAMES for a in expected_of(name)["actions"]}
    missing = sorted(set(BUILTINS) - proposing)
    assert not missing, f"built-in rules with no scenario in tests/replay/scenarios: {missing}"


@pytest.mark.parametrize(
    "name", ["app_xids", "app_crash_loop", "fs_fill", "memory", "repeat_offender", "hang_straggler_death"]
)
def test_application_faults_and_pressure_never_drain_a_healthy_node(name: str) -> None:
    """The controls the issue asks for, stated directly: no drain where nothing implicates hardware.
    (In repeat_offender only the node with a GPU that failed its row remapping twice is drained.)"""
    drained = {a["target"] for a in expected_of(name)["actions"] if a["kind"] == "drain_node"}
    assert drained <= ({"gpu-c01"} if name == "repeat_offender" else set()), drained
