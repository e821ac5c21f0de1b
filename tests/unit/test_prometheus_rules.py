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
