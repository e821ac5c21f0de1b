"""The plugin contract: documented hookspecs, rule directories, isolation of the new hooks."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest

from ftd.coordinator.decide.engine import Engine
from ftd.coordinator.decide.plugins import PluginError, make_plugin_manager
from ftd.coordinator.decide.policy import PolicyGate
from ftd.coordinator.ledger.sqlite import Ledger, SqliteStore
from ftd.coordinator.model.state import ClusterState
from ftd.events import Kind, make_event
from ftd.plugin import hookspecs
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState
from ftd.plugin.hookspecs import hookimpl

SPECS = [
    (name, fn)
    for name, fn in vars(hookspecs).items()
    if name.startswith("ftd_") and inspect.isfunction(fn) and hasattr(fn, "ftd_spec")
]


def test_the_contract_has_the_four_hooks() -> None:
    assert {name for name, _ in SPECS} == {
        "ftd_evaluate",
        "ftd_register_actions",
        "ftd_startup",
        "ftd_action_completed",
    }


@pytest.mark.parametrize(("name", "spec"), SPECS, ids=[name for name, _ in SPECS])
def test_every_hookspec_documents_its_sections_in_order(name: str, spec: Any) -> None:
    doc = inspect.getdoc(spec) or ""
    positions = [doc.find(section) for section in hookspecs.DOC_SECTIONS]
    assert all(p >= 0 for p in positions), f"{name} lacks one of {hookspecs.DOC_SECTIONS}"
    assert positions == sorted(positions), f"{name}: sections out of order"
    assert doc.splitlines()[0].strip(), f"{name} has no summary line"


GOOD_RULE = """
from ftd.plugin.hookspecs import hookimpl
from ftd.plugin.actions import ActionRequest

@hookimpl
def ftd_evaluate(event, view):
    if event.kind == "ib_link":
        return [ActionRequest(kind="notify", target=event.node, reason="ib link down")]
    return None
"""


def test_rule_directory_files_are_plugins_named_by_file(tmp_path: Path) -> None:
    (tmp_path / "ib_watch.py").write_text(GOOD_RULE)
    (tmp_path / "_helper.py").write_text("raise RuntimeError('never imported')\n")
    pm = make_plugin_manager(entry_points=False, builtins=False, rule_dirs=[tmp_path])
    assert pm.has_plugin("ib_watch")
    blocked = make_plugin_manager(
        entry_points=False, builtins=False, rule_dirs=[tmp_path], disabled=["ib_watch"]
    )
    assert not blocked.has_plugin("ib_watch")


def test_rule_file_with_a_syntax_error_fails_startup_with_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "broken.py"
    bad.write_text("x = 1\ndef oops(:\n    pass\n")
    with pytest.raises(PluginError, match=rf"{bad}:2: syntax error"):
        make_plugin_manager(entry_points=False, builtins=False, rule_dirs=[tmp_path])


def test_rule_file_with_an_import_error_fails_startup_with_file_line_reason(tmp_path: Path) -> None:
    bad = tmp_path / "needs_numpyy.py"
    bad.write_text("import os\nimport numpyy_does_not_exist\n")
    with pytest.raises(PluginError, match=rf"{bad}:2: ModuleNotFoundError: .*numpyy_does_not_exist"):
        make_plugin_manager(entry_points=False, builtins=False, rule_dirs=[tmp_path])


def test_missing_rule_directory_fails_startup(tmp_path: Path) -> None:
    with pytest.raises(PluginError, match="does not exist"):
        make_plugin_manager(entry_points=False, rule_dirs=[tmp_path / "nope"])


class Hooks:
    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.started: list[Any] = []
        self.completed: list[tuple[str, str]] = []

    @hookimpl
    def ftd_startup(self, coordinator: Any) -> None:
        if self.fail:
            raise RuntimeError("startup bug")
        self.started.append(coordinator)

    @hookimpl
    def ftd_action_completed(self, request: ActionRequest, record: ActionRecord) -> None:
        if self.fail:
            raise RuntimeError("completion bug")
        self.completed.append((request.target, str(record.state)))

    @hookimpl
    def ftd_evaluate(self, event: Any, view: Any) -> list[ActionRequest]:
        return [ActionRequest(kind=ActionKind.DRAIN_NODE, target=event.node, reason="x")]


async def test_startup_and_completion_hooks_are_called_each_in_isolation() -> None:
    broken, good = Hooks(fail=True), Hooks(fail=False)
    pm = make_plugin_manager(entry_points=False, builtins=False, extra=(broken, good))

    async def drain(record: ActionRecord) -> dict[str, Any]:
        return {}

    engine = Engine(
        state=ClusterState(),
        ledger=SqliteStore(Ledger(":memory:")),
        gate=PolicyGate(),
        plugins=pm,
        executors={ActionKind.DRAIN_NODE: drain},
    )
    engine.startup("the coordinator")
    assert good.started == ["the coordinator"]
    records = await engine.handle_event(make_event("node-1", Kind.ECC))
    assert len(records) == 2 and {r.state for r in records} == {ActionState.PENDING, ActionState.SUPPRESSED}
    await engine.wait_idle(5)
    await asyncio.sleep(0)
    assert good.completed == [("node-1", "succeeded")]
    assert engine.counters["hook_errors"] == 2  # one failed startup, one failed completion


def test_the_template_plugin_is_packaged_on_the_entry_point_group_and_loads() -> None:
    import importlib.util
    import tomllib

    root = Path(__file__).resolve().parents[2] / "plugins" / "ftd-plugin-template"
    project = tomllib.loads((root / "pyproject.toml").read_text())
    target = project["project"]["entry-points"]["ftd"]["template"]
    assert target == "ftd_plugin_template.rule"
    spec = importlib.util.spec_from_file_location(
        "template_rule", root / "src" / "ftd_plugin_template" / "rule.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pm = make_plugin_manager(entry_points=False, builtins=False, extra=(module,))
    assert pm.hook.ftd_evaluate.get_hookimpls()
