"""The site policy shipped in ``rules/``: it loads through the real loaders and does what its scenario says.

Files are found by glob, never listed here: every ``rules/*.toml`` pack and every ``rules/python/*.py``
module (the files ``coordinator.rule_dirs`` would load) must

* load through the coordinator's own loaders (``load_rules_file``, ``make_plugin_manager``);
* have a scenario: ``tests/replay/rules/<path under rules/, no suffix>.jsonl`` (events as the agent
  sends them) and ``.expected.json`` (``jobs`` placed with ``--job``, ``negative_controls`` = event
  id -> why it must trigger nothing, ``actions`` = every action in order: event_id, rule, kind,
  target, verdict, and a ``why`` for the reader). A shipped file without one fails, and so does a
  scenario whose file is gone;
* replayed through ``ftd rules test --json`` (in-process, the real Engine and policy gate), produce
  exactly the expected actions, with every rule of the file proposing at least once.

Built-in rules are disabled in these replays so a scenario shows what its file adds; they have their
own tests, and ``ftd rules test`` with an operator's real config shows the combination.

The scenario events are checked against what the agent really emits (kernel lines re-parsed by the
agent's parser, log events against its pattern table, NVML events carry the GPU's identity), so a
pack cannot pass on events the agent would never send.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import sys
import tomllib
from pathlib import Path
from typing import Any

import pluggy
import pytest

from ftd.agent.kmsg_parse import parse_lines
from ftd.catalog.log_patterns import load_patterns
from ftd.cli import main
from ftd.config import load_config
from ftd.coordinator.decide.declarative import load_rules_file
from ftd.coordinator.decide.plugins import DEFAULT_RULES, default_rule_name, make_plugin_manager, rule_files
from ftd.events import Event, decode

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "rules"
SCENARIOS = ROOT / "tests" / "replay" / "rules"
PACKS = sorted(RULES.glob("*.toml"))
MODULES = rule_files([RULES / "python"])  # exactly what coordinator.rule_dirs would load
SHIPPED = PACKS + MODULES
BUILTINS = [default_rule_name(module) for module in DEFAULT_RULES]


def _id(path: Path) -> str:
    return str(path.relative_to(RULES))


def scenario_of(path: Path) -> tuple[Path, Path]:
    stem = path.relative_to(RULES).with_suffix("")
    return SCENARIOS / f"{stem}.jsonl", SCENARIOS / f"{stem}.expected.json"


def rule_names(path: Path) -> set[str]:
    """The plugin names a shipped file registers (what ``ActionRequest.rule`` says)."""
    if path.suffix == ".toml":
        return {rule.plugin_name for rule in load_rules_file(path)}
    return {path.stem}


def evaluators(pm: pluggy.PluginManager) -> list[str]:
    """The plugins whose ``ftd_evaluate`` the engine will call, in its order."""
    return [impl.plugin_name for impl in pm.hook.ftd_evaluate.get_hookimpls()]


def read_events(path: Path) -> list[Event]:
    return [decode(line, Event) for line in path.read_text().splitlines() if line.strip()]


# --- discovery -------------------------------------------------------------------------------------


def test_the_folder_ships_packs_and_modules() -> None:
    assert PACKS, "no rules/*.toml found: the glob would make every other test here vacuous"
    assert MODULES, "no rules/python/*.py found"


def test_every_shipped_file_has_a_scenario() -> None:
    missing = [str(p.relative_to(ROOT)) for f in SHIPPED for p in scenario_of(f) if not p.is_file()]
    assert not missing, f"shipped rule files need a replay scenario: {missing}"


def test_every_scenario_belongs_to_a_shipped_file() -> None:
    expected = {p for f in SHIPPED for p in scenario_of(f)}
    found = {p for p in SCENARIOS.rglob("*") if p.is_file()}
    assert not found - expected, f"scenarios without a shipped file: {sorted(map(str, found - expected))}"


# --- loading ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("pack", PACKS, ids=_id)
def test_pack_loads_through_the_real_loader(pack: Path) -> None:
    rules = load_rules_file(pack)
    assert rules, f"{pack.name} has no [[rule]]"
    for rule in rules:
        assert rule.reason.strip(), f"{pack.name}: rule {rule.name} has no reason"
    pm = make_plugin_manager(rules_file=pack, entry_points=False, builtins=False)
    assert evaluators(pm) == [rule.plugin_name for rule in rules]


@pytest.mark.parametrize("pack", PACKS, ids=_id)
def test_pack_matches_log_patterns_the_agent_has(pack: Path) -> None:
    """A misspelt pattern name would load fine and never match: check it against the agent's table."""
    known = {p.name for p in load_patterns()}
    for rule in tomllib.loads(pack.read_text())["rule"]:
        spec = rule["match"].get("data.pattern")
        names = spec if isinstance(spec, list) else [spec] if isinstance(spec, str) else []
        literal = [n for n in names if not n.startswith(("~", ">", "<", "!"))]
        assert set(literal) <= known, (
            f"{pack.name} {rule['name']}: unknown log pattern(s) {set(literal) - known}"
        )


@pytest.mark.parametrize("module", MODULES, ids=_id)
def test_module_loads_through_the_real_plugin_manager(module: Path, tmp_path: Path) -> None:
    shutil.copy(module, tmp_path / module.name)
    pm = make_plugin_manager(rule_dirs=[tmp_path], entry_points=False, builtins=False)
    plugin = pm.get_plugin(module.stem)
    assert plugin is not None
    assert evaluators(pm) == [module.stem]
    assert "coordinator.rule_dirs" in (plugin.__doc__ or ""), "the docstring must say how to install it"


def test_the_python_folder_loads_as_one_rule_dir() -> None:
    pm = make_plugin_manager(rule_dirs=[RULES / "python"], entry_points=False, builtins=False)
    assert evaluators(pm) == [m.stem for m in MODULES]


@pytest.mark.parametrize("module", MODULES, ids=_id)
def test_module_imports_only_the_rule_contract_and_the_standard_library(module: Path) -> None:
    tree = ast.parse(module.read_text(), filename=str(module))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    bad = {n for n in imported if n != "ftd.plugin" and n.split(".")[0] not in sys.stdlib_module_names}
    assert not bad, f"{module.name} imports {sorted(bad)}: a site rule imports ftd.plugin and the stdlib only"


def test_example_config_rule_paths_exist_from_a_checkout() -> None:
    """A first start on the example config must not die on a rule directory that is not there."""
    coordinator = load_config(ROOT / "examples" / "config" / "coordinator.toml").coordinator
    dirs = [ROOT / d for d in coordinator.rule_dirs]  # relative paths: the checkout is the working dir
    assert dirs and all(d.is_dir() for d in dirs), dirs
    rules_file = ROOT / coordinator.rules_file if coordinator.rules_file else None
    make_plugin_manager(rule_dirs=dirs, rules_file=rules_file, entry_points=False)


# --- scenarios -------------------------------------------------------------------------------------

_PCI = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_LOG_KEYS = {"file", "line", "offset", "pattern", "text", "suppressed"}


def check_realistic(event: Event, patterns: dict[str, Any], seen: set[str]) -> None:
    """What the agent's watchers and storm control would have sent (or fail, naming the event)."""
    data, where = event.data, f"event {event.id}"
    if "repeat_of" in data:  # a storm-control summary of an earlier event of the scenario
        assert data["repeat_of"] in seen and event.id.startswith(data["repeat_of"]), where
    if event.source == "kmsg":
        parsed = list(parse_lines([data["message"]]))
        assert [(k.kind, k.pci) for k in parsed] == [(event.kind, data.get("pci"))], where
    elif event.source == "logs" and event.kind == "log_pattern":
        assert set(data) == _LOG_KEYS, where
        first = next(p for p in patterns.values() if p.regex.search(data["text"]))  # the watcher's choice
        assert (first.name, first.severity) == (data["pattern"], event.severity), where
    elif event.source == "nvml":
        assert str(data.get("uuid", "")).startswith("GPU-") and _PCI.match(str(data.get("pci"))), where
        assert isinstance(data.get("index"), int), where
    else:
        assert event.source in ("logs", "heartbeat"), f"{where}: unexpected source {event.source!r}"


@pytest.mark.parametrize("shipped", SHIPPED, ids=_id)
def test_scenario_events_are_what_the_agent_sends(shipped: Path) -> None:
    events_file, _ = scenario_of(shipped)
    events = read_events(events_file)
    patterns = {p.name: p for p in load_patterns()}
    seen: set[str] = set()
    for event in events:
        assert event.id not in seen, f"duplicate id {event.id}"
        check_realistic(event, patterns, seen)
        seen.add(event.id)
    assert [e.ts for e in events] == sorted(e.ts for e in events), "events must be in time order"


def replay(
    shipped: Path, tmp_path: Path, jobs: dict[str, list[str]], capsys: Any, *, builtins: bool = False
) -> dict[str, Any]:
    """``ftd rules test --json`` on the scenario, with only ``shipped`` as site policy (and the
    built-in rules beside it with ``builtins``, as an install that copies it has them)."""
    lines = [] if builtins else [f"disabled_rules = {json.dumps(BUILTINS)}"]
    if shipped.suffix == ".toml":
        lines.append(f"rules_file = {json.dumps(str(shipped))}")
    else:
        rule_dir = tmp_path / "rule_dir"
        rule_dir.mkdir()
        shutil.copy(shipped, rule_dir / shipped.name)
        lines.append(f"rule_dirs = [{json.dumps(str(rule_dir))}]")
    config = tmp_path / "coordinator.toml"
    config.write_text("[coordinator]\n" + "\n".join(lines) + "\n")
    events_file, _ = scenario_of(shipped)
    argv = ["rules", "test", "--events", str(events_file), "--config", str(config), "--json"]
    argv.append("--no-entry-points")
    for job, nodes in jobs.items():
        argv += ["--job", f"{job}={','.join(nodes)}"]
    assert main(argv) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return doc


@pytest.mark.parametrize("shipped", SHIPPED, ids=_id)
def test_scenario_replays_to_the_expected_actions(
    shipped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events_file, expected_file = scenario_of(shipped)
    expected = json.loads(expected_file.read_text())
    event_ids = [e.id for e in read_events(events_file)]
    doc = replay(shipped, tmp_path, expected["jobs"], capsys)

    assert doc["bad_lines"] == [] and doc["rule_errors"] == [] and doc["duplicates"] == 0
    assert doc["events"] == len(event_ids)
    fields = ("event_id", "rule", "kind", "target", "verdict")
    actual = [tuple(a[f] for f in fields) for a in doc["actions"]]
    assert actual == [tuple(a[f] for f in fields) for a in expected["actions"]]

    unfilled = [a["reason"] for a in doc["actions"] if re.search(r"\{\w+\}", a["reason"])]
    assert not unfilled, f"reason placeholders the event did not fill: {unfilled}"
    proposing = {a["rule"] for a in doc["actions"]}
    assert rule_names(shipped) <= proposing, f"never exercised: {rule_names(shipped) - proposing}"

    negatives = expected["negative_controls"]
    assert negatives, "a scenario needs events that must trigger nothing"
    assert set(negatives) <= set(event_ids), "negative controls must be events of the scenario"
    assert not set(negatives) & {a["event_id"] for a in doc["actions"]}


@pytest.mark.parametrize("shipped", MODULES, ids=_id)
def test_a_shipped_rule_never_pages_twice_for_what_a_built_in_rule_pages(
    shipped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #32 item 9: installed as the guide says (operators.md copies every ``rules/python/*.py``
    beside the built-in rules), a shipped rule must not notify about an event a built-in rule already
    notifies about: that paged twice for every hot GPU (``thermal_throttle`` repeated the built-in
    ``thermal`` rule's onset notification)."""
    _, expected_file = scenario_of(shipped)
    jobs = json.loads(expected_file.read_text())["jobs"]
    doc = replay(shipped, tmp_path, jobs, capsys, builtins=True)
    shipped_rules = rule_names(shipped)
    # A page is about an event and, where its sentence names one, a GPU: two pages on one event about
    # two GPUs (one hot now, another throttling on and off for minutes) tell two things.
    pages: dict[tuple[str, str], set[str]] = {}
    for action in doc["actions"]:
        if action["kind"] == "notify" and action["verdict"] == "allowed":
            gpus = re.findall(r"GPU-[0-9a-fA-F-]{8,}", action["reason"]) or [""]
            for gpu in gpus:
                pages.setdefault((action["event_id"], gpu), set()).add(action["rule"])
    twice = {
        event: sorted(rules)
        for event, rules in pages.items()
        if rules & shipped_rules and rules - shipped_rules
    }
    assert not twice, f"paged by a shipped rule and a built-in one for the same event: {twice}"
