"""Which rules are loaded, seen three ways: the start-up log, ``GET /v1/rules`` and ``ftd rules list``.

One site config with every kind of source -- the built-ins, a ``rule_dirs`` file, a declarative
``rules_file`` pack, a disabled built-in -- plus, for the CLI, a plugin installed on the ``ftd``
entry-point group (a real ``*.dist-info`` on ``PYTHONPATH``). The API runs over a real Coordinator
(MemoryBus, in-memory ledger) with the aiohttp test client, in the style of ``test_api.py``; the
CLI runs as a subprocess, offline (no coordinator).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from aiohttp.test_utils import TestClient, TestServer

from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import ApiConfig, Config, CoordinatorConfig
from ftd.coordinator.api import Api
from ftd.coordinator.daemon import Coordinator
from ftd.coordinator.decide.plugins import DEFAULT_RULES, default_rule_name
from ftd.coordinator.ledger.sqlite import Ledger
from ftd.coordinator.wiring import build
from ftd.plugin.hookspecs import hookimpl

REPO = Path(__file__).resolve().parents[2]
BUILTINS = [default_rule_name(m) for m in DEFAULT_RULES]

SITE_RULE = """from ftd.plugin import hookimpl


@hookimpl
def ftd_evaluate(event, view):
    return []


@hookimpl
def ftd_action_completed(request, record):
    return None
"""
PACK = """[[rule]]
name = "xid-storm"
match = { kind = "xid" }
count = 3
window_s = 60
action = "notify"
"""


class Embedded:
    """A plugin object handed to the coordinator by the embedding code."""

    plugin_name = "embedded"

    @hookimpl
    def ftd_startup(self, coordinator: Any) -> None:
        return None


@pytest.fixture
def site(tmp_path: Path) -> CoordinatorConfig:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "site_policy.py").write_text(SITE_RULE)
    (rules / "_helper.py").write_text("raise RuntimeError('never imported: starts with _')\n")
    (tmp_path / "pack.toml").write_text(PACK)
    return CoordinatorConfig(
        ledger_path=":memory:",
        rule_dirs=[str(rules)],
        rules_file=str(tmp_path / "pack.toml"),
        disabled_rules=["hang"],
    )


def expected_rules(site: CoordinatorConfig, *, coordinator: bool) -> list[dict[str, Any]]:
    """What every listing must say for ``site`` (the coordinator adds its executors and the
    embedded plugin; entry points are left out here)."""
    rules: list[dict[str, Any]] = []
    for module in DEFAULT_RULES:
        name = default_rule_name(module)
        if name != "hang":
            rules.append({"name": name, "source": "builtin", "origin": module})
    if coordinator:  # ftd's executors are a built-in plugin too (sources in order: builtin first)
        executors = "ftd.coordinator.actions.BuiltinExecutors"
        rules.append({"name": "builtin_executors", "source": "builtin", "origin": executors})
    site_policy = f"{site.rule_dirs[0]}/site_policy.py"
    rules.append({"name": "site_policy", "source": "rule_dir", "origin": site_policy})
    rules.append({"name": "toml:xid-storm", "source": "declarative", "origin": site.rules_file})
    if coordinator:
        rules.append({"name": "embedded", "source": "extra", "origin": f"{__name__}.Embedded"})
    return rules


def without_hooks(listing: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "hooks"} for r in listing]


def hooks_of(listing: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {r["name"]: r["hooks"] for r in listing}


def make_coordinator(site: CoordinatorConfig) -> Coordinator:
    return build(
        Config(coordinator=site),
        bus=MemoryBus(MemoryBroker()),
        scheduler=None,
        ledger=Ledger(":memory:"),
        extra_plugins=(Embedded(),),
    )


# --- the coordinator: start-up log and API ------------------------------------------------------------


@pytest.fixture
async def client(site: CoordinatorConfig) -> AsyncIterator[TestClient[Any, Any]]:
    coordinator = make_coordinator(site)
    api = Api(coordinator, ApiConfig(), token=None)  # no token: reads must still answer
    test_client: TestClient[Any, Any] = TestClient(TestServer(api.app))
    await test_client.start_server()
    try:
        yield test_client
    finally:
        await test_client.close()
        await coordinator.engine.close()


async def test_start_up_logs_the_rules_loaded(site: CoordinatorConfig) -> None:
    with structlog.testing.capture_logs() as logs:
        coordinator = make_coordinator(site)
    await coordinator.engine.close()
    [loaded] = [r for r in logs if r["event"] == "rules_loaded"]
    assert loaded["disabled"] == ["hang"]
    lines = loaded["rules"]
    assert len(lines) == len(expected_rules(site, coordinator=True))
    assert "site_policy (rule_dir: ftd_action_completed, ftd_evaluate)" in lines
    assert "toml:xid-storm (declarative: ftd_evaluate)" in lines
    assert "builtin_executors (builtin: ftd_register_actions)" in lines
    assert "embedded (extra: ftd_startup)" in lines
    assert not any(line.startswith("hang ") for line in lines)


async def test_api_lists_rules_without_a_token(client: TestClient[Any, Any], site: CoordinatorConfig) -> None:
    resp = await client.get("/v1/rules")
    assert resp.status == 200
    body = await resp.json()
    assert body["disabled"] == ["hang"]
    assert without_hooks(body["rules"]) == expected_rules(site, coordinator=True)
    hooks = hooks_of(body["rules"])
    assert hooks["site_policy"] == ["ftd_action_completed", "ftd_evaluate"]
    assert hooks["toml:xid-storm"] == ["ftd_evaluate"]
    assert hooks["builtin_executors"] == ["ftd_register_actions"]
    assert all("ftd_evaluate" in hooks[name] for name in BUILTINS if name != "hang")


async def test_api_rules_is_read_only(client: TestClient[Any, Any]) -> None:
    for method in ("POST", "PUT", "DELETE"):
        assert (await client.request(method, "/v1/rules")).status == 405
    document = await (await client.get("/openapi.json")).json()
    assert set(document["paths"]["/v1/rules"]) == {"get"}


# --- the CLI, offline -------------------------------------------------------------------------------


def ftd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **(env or {})}
    command = [sys.executable, "-m", "ftd.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=REPO, env=environment)


def write_config(site: CoordinatorConfig, path: Path) -> Path:
    path.write_text(
        f'[coordinator]\nrule_dirs = ["{site.rule_dirs[0]}"]\nrules_file = "{site.rules_file}"\n'
        'disabled_rules = ["hang"]\n'
    )
    return path


def installed_plugin(tmp_path: Path) -> dict[str, str]:
    """A distribution ``ftd-site-plugin`` 1.2 on the ``ftd`` entry-point group, on PYTHONPATH."""
    site_packages = tmp_path / "site-packages"
    dist = site_packages / "ftd_site_plugin-1.2.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ftd-site-plugin\nVersion: 1.2\n")
    (dist / "entry_points.txt").write_text("[ftd]\nsite_plugin = ftd_site_plugin\n")
    (site_packages / "ftd_site_plugin.py").write_text(SITE_RULE)
    path = os.pathsep.join(p for p in (str(site_packages), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


def test_cli_lists_every_source_as_json(site: CoordinatorConfig, tmp_path: Path) -> None:
    config = write_config(site, tmp_path / "coordinator.toml")
    run = ftd("rules", "list", "--config", str(config), "--json", env=installed_plugin(tmp_path))
    assert run.returncode == 0, run.stderr
    listing = json.loads(run.stdout)
    assert listing["disabled"] == ["hang"]
    origin = "ftd-site-plugin 1.2 (ftd_site_plugin)"
    entry = {"name": "site_plugin", "source": "entry_point", "origin": origin}
    got = without_hooks(listing["rules"])
    assert entry in got  # (other installed ftd plugins, if any, are listed too)
    assert [r for r in got if r["source"] != "entry_point"] == expected_rules(site, coordinator=False)
    assert hooks_of(listing["rules"])["site_plugin"] == ["ftd_action_completed", "ftd_evaluate"]


def test_cli_table_and_no_entry_points(site: CoordinatorConfig, tmp_path: Path) -> None:
    config = write_config(site, tmp_path / "coordinator.toml")
    run = ftd("rules", "list", "--config", str(config), "--no-entry-points", env=installed_plugin(tmp_path))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split() == ["name", "source", "hooks", "origin"]
    rows = {line.split()[0]: line.split() for line in lines[2:] if line.strip() and not line[0].isdigit()}
    assert "site_plugin" not in rows
    assert rows["site_policy"][:3] == ["site_policy", "rule_dir", "ftd_action_completed,ftd_evaluate"]
    assert rows["toml:xid-storm"][:3] == ["toml:xid-storm", "declarative", "ftd_evaluate"]
    assert "hang" not in rows
    count = len(expected_rules(site, coordinator=False))
    assert lines[-1] == f"{count} rule plugin(s) loaded; disabled: hang"


def test_cli_missing_rule_dir_is_an_error(tmp_path: Path) -> None:
    config = tmp_path / "coordinator.toml"
    config.write_text(f'[coordinator]\nrule_dirs = ["{tmp_path}/nope"]\n')
    run = ftd("rules", "list", "--config", str(config))
    assert run.returncode == 2 and run.stdout == ""
    assert f"{tmp_path}/nope: rule directory does not exist" in run.stderr
    assert "Traceback" not in run.stderr
