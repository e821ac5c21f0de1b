"""The shipped alert rules and Grafana dashboard: valid, tested, and about metrics ftd exports.

``promtool check rules`` and ``promtool test rules`` (Debian's ``prometheus`` package, a real part:
failed, not skipped, under FTD_REQUIRE_REAL=1) run on deploy/prometheus/; every metric name in an
alert or a dashboard query must be one the coordinator or the agent serves (read from a scrape of
both collectors, so a renamed metric breaks this test, not an on-call's night).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from ftd.agent.metrics import MetricsServer
from ftd.agent.wiring import build_agent
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import AgentConfig, ApiConfig, Config, CoordinatorConfig
from ftd.config.schema import AgentMetricsConfig
from ftd.coordinator.api import Api
from ftd.coordinator.ledger.sqlite import Ledger
from ftd.coordinator.wiring import build
from tests.e2e.daemons import REPO
from tests.realparts import require_binary

PROMETHEUS = REPO / "deploy" / "prometheus"
DASHBOARD = REPO / "deploy" / "grafana" / "ftd.json"
METRIC = re.compile(r"\bftd_[a-z0-9_]+")


def exported(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names |= {name} | {
                f"{name}{s}"
                for s in {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}.get(kind, [])
            }
    return names


@pytest.fixture
async def metric_names(tmp_path: Path) -> set[str]:
    config = Config(coordinator=CoordinatorConfig(ledger_path=":memory:", scheduler="slurm"))
    coordinator = build(config, bus=MemoryBus(MemoryBroker()), scheduler=None, ledger=Ledger(":memory:"))
    names = exported(generate_latest(Api(coordinator, ApiConfig(), token=None).registry).decode())
    await coordinator.engine.close()
    (tmp_path / "kmsg").touch()
    cfg = AgentConfig(
        node="n1",
        kmsg_path=str(tmp_path / "kmsg"),
        state_dir=str(tmp_path / "s"),
        socket_path=str(tmp_path / "a.sock"),
        metrics=AgentMetricsConfig(port=1),
    )
    agent = build_agent(cfg, bus=MemoryBus(MemoryBroker()), node="n1")
    return names | exported(generate_latest(MetricsServer(agent, cfg.metrics).registry).decode())


@pytest.mark.real
def test_promtool_checks_and_unit_tests_the_rules() -> None:
    promtool = require_binary("promtool", package="prometheus")
    check = subprocess.run(
        [promtool, "check", "rules", "ftd-alerts.yml"], cwd=PROMETHEUS, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    tests = sorted((PROMETHEUS / "tests").glob("*.yml"))
    assert tests
    run = subprocess.run([promtool, "test", "rules", *map(str, tests)], capture_output=True, text=True)
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr


def alert_names() -> list[str]:
    groups = yaml.safe_load((PROMETHEUS / "ftd-alerts.yml").read_text())["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule]


def rule_tests() -> dict[str, set[str]]:
    """What the ``promtool test rules`` files check per alert: ``firing`` when a test group expects it
    to fire at one time and stay quiet at another (so the quiet case sees the series that fire, not an
    empty input), ``fires``/``quiet`` for groups that check only one side."""
    seen: dict[str, set[str]] = {}
    for path in sorted((PROMETHEUS / "tests").glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["tests"]:
            sides: dict[str, set[str]] = {}
            for case in group.get("alert_rule_test", []):
                side = "fires" if case.get("exp_alerts") else "quiet"
                sides.setdefault(case["alertname"], set()).add(side)
            for name, found in sides.items():
                seen.setdefault(name, set()).update(
                    found | ({"both"} if found == {"fires", "quiet"} else set())
                )
    return seen


def test_every_alert_has_a_firing_and_a_quiet_promtool_test() -> None:
    """An alert added to ftd-alerts.yml without both cases in deploy/prometheus/tests fails here
    (the promtool run above only runs the cases that exist)."""
    names = alert_names()
    assert len(names) == len(set(names)) >= 12  # 12 shipped today: never a vacuous pass
    tested = rule_tests()
    untested = {
        name: sorted(tested.get(name, set())) for name in names if "both" not in tested.get(name, set())
    }
    assert not untested, f"alerts without a firing and a quiet case in one promtool test group: {untested}"
    assert not set(tested) - set(names), (
        f"promtool tests of alerts that do not exist: {set(tested) - set(names)}"
    )


def test_every_alert_has_a_runbook_and_names_exported_metrics(metric_names: set[str]) -> None:
    rules = [
        r for g in yaml.safe_load((PROMETHEUS / "ftd-alerts.yml").read_text())["groups"] for r in g["rules"]
    ]
    assert len(rules) >= 10
    for rule in rules:
        assert rule["annotations"]["runbook"].strip() and rule["annotations"]["summary"].strip(), rule[
            "alert"
        ]
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        unknown = set(METRIC.findall(rule["expr"])) - metric_names
        assert not unknown, f"{rule['alert']} uses metrics ftd does not export: {unknown}"


def test_grafana_dashboard_queries_exported_metrics(metric_names: set[str]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 10 and dashboard["uid"]
    used = {name for e in exprs for name in METRIC.findall(e)}
    assert not used - metric_names, f"the dashboard uses metrics ftd does not export: {used - metric_names}"
    # and it shows every family an operator alerts on
    for needed in ("ftd_bus_connected", "ftd_actions_stuck", "ftd_agent_spool_entries", "ftd_nodes"):
        assert needed in used
