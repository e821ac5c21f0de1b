"""Loading rule plugins and calling them one at a time.

Sources, in order (see :mod:`ftd.plugin.hookspecs`): the built-in rules (:data:`DEFAULT_RULES`), every
module on the ``ftd`` entry-point group, every ``*.py`` file in ``rule_dirs`` (sorted by name; files
starting with ``_`` or ``.`` are skipped, the name without ``.py`` is the plugin name), the declarative
rules of ``rules_file`` (plugin name ``toml:<rule name>``), then ``extra`` objects (tests, embedding).
A plugin listed in ``disabled`` is blocked by name (built-ins, entry-point names, file stems and
``toml:`` names alike). A rule file that does not import fails start-up with a :class:`PluginError`
naming the file, the line and the reason; so does an unknown hook name (``check_pending``).

Each implementation is called in isolation (:func:`evaluate`, :func:`call_each`) so one broken rule
cannot silence the rest; its failure is returned to the caller to be logged and counted.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import pluggy

from ftd.events import Event
from ftd.plugin import hookspecs
from ftd.plugin.actions import ActionRequest
from ftd.plugin.hookspecs import Executor
from ftd.plugin.view import ClusterView

#: The built-in rules, by module name (pytest's ``default_plugins`` style): the coordinator does not
#: import ``ftd.rules`` statically, so the rules depend on the contract and never the reverse.
DEFAULT_RULES = (
    "ftd.rules.xid_catalog",
    "ftd.rules.ecc_remap",
    "ftd.rules.repeat_offender",
    "ftd.rules.fs_fill",
    "ftd.rules.hang",
    "ftd.rules.node_death",
    "ftd.rules.straggler",
)


class PluginError(RuntimeError):
    pass


def default_rule_name(module: str) -> str:
    """The plugin name of a built-in rule: its module's last component (``xid_catalog``)."""
    return module.rsplit(".", 1)[-1]


@dataclass
class Evaluation:
    requests: list[ActionRequest] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (rule, error)
    slow: list[tuple[str, float]] = field(default_factory=list)  # (rule, seconds)


def load_rule_file(path: Path) -> ModuleType:
    """Import one operator rule file as a module; :class:`PluginError` with file:line: reason if not."""
    name = f"ftd_rule_dir.{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise PluginError(f"{exc.filename or path}:{exc.lineno}: syntax error: {exc.msg}") from exc
    except Exception as exc:
        sys.modules.pop(name, None)
        line = None
        resolved = str(path.resolve())
        for frame in traceback.extract_tb(exc.__traceback__):
            if str(Path(frame.filename).resolve()) == resolved:
                line = frame.lineno
        where = f"{path}:{line}" if line is not None else str(path)
        raise PluginError(f"{where}: {type(exc).__name__}: {exc}") from exc
    return module


def rule_files(rule_dirs: Iterable[str | Path]) -> list[Path]:
    files: list[Path] = []
    for directory in rule_dirs:
        root = Path(directory)
        if not root.is_dir():
            raise PluginError(f"{root}: rule directory does not exist (coordinator.rule_dirs)")
        files.extend(p for p in sorted(root.glob("*.py")) if not p.name.startswith(("_", ".")))
    return files


def make_plugin_manager(
    *,
    disabled: Iterable[str] = (),
    extra: Iterable[ModuleType | object] = (),
    entry_points: bool = True,
    rule_dirs: Iterable[str | Path] = (),
    rules_file: str | Path | None = None,
    builtins: bool = True,
) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for name in disabled:
        pm.set_blocked(name)
    if builtins:
        for module in DEFAULT_RULES:
            name = default_rule_name(module)
            if not pm.is_blocked(name):
                pm.register(importlib.import_module(module), name=name)
    if entry_points:
        pm.load_setuptools_entrypoints(hookspecs.PROJECT)
    for path in rule_files(rule_dirs):
        if pm.is_blocked(path.stem):
            continue
        if pm.has_plugin(path.stem):
            raise PluginError(f"{path}: a plugin named {path.stem!r} is already loaded; rename the file")
        pm.register(load_rule_file(path), name=path.stem)
    if rules_file is not None:
        from ftd.coordinator.declarative import DeclarativeError, load_rules_file

        try:
            declared = load_rules_file(rules_file)
        except DeclarativeError as exc:
            raise PluginError(str(exc)) from exc
        for rule in declared:
            if not pm.is_blocked(rule.plugin_name) and not pm.is_blocked(rule.name):
                pm.register(rule, name=rule.plugin_name)
    for plugin in extra:
        given = getattr(plugin, "plugin_name", None)
        pm.register(plugin, name=given if isinstance(given, str) else None)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {exc.plugin!r} implements an unknown hook: {exc}") from exc
    return pm


def call_each(pm: pluggy.PluginManager, hook: str, **kwargs: Any) -> list[tuple[str, str]]:
    """Call every implementation of ``hook`` on its own; returns ``(plugin, error)`` for failures."""
    errors: list[tuple[str, str]] = []
    for impl in getattr(pm.hook, hook).get_hookimpls():
        try:
            impl.function(**{name: kwargs[name] for name in impl.argnames})
        except Exception as exc:  # isolation: one broken plugin must not silence the others
            errors.append((impl.plugin_name, f"{type(exc).__name__}: {exc}"))
    return errors


def evaluate(pm: pluggy.PluginManager, event: Event, view: ClusterView, slow_s: float = 0.05) -> Evaluation:
    result = Evaluation()
    arguments = {"event": event, "view": view}
    for impl in pm.hook.ftd_evaluate.get_hookimpls():
        rule = impl.plugin_name
        started = time.perf_counter()
        try:
            kwargs = {name: arguments[name] for name in impl.argnames}
            proposed = cast(Iterable[object] | None, impl.function(**kwargs))
        except Exception as exc:  # isolation: one broken rule must not silence the others
            result.errors.append((rule, f"{type(exc).__name__}: {exc}"))
            continue
        elapsed = time.perf_counter() - started
        if elapsed > slow_s:
            result.slow.append((rule, elapsed))
        try:
            items = list(proposed or ())
        except TypeError:
            result.errors.append((rule, f"returned {type(proposed).__name__}, not a list"))
            continue
        for request in items:
            if not isinstance(request, ActionRequest):
                result.errors.append((rule, f"returned {type(request).__name__}, not ActionRequest"))
                continue
            result.requests.append(
                ActionRequest(
                    kind=request.kind,
                    target=request.target,
                    reason=request.reason,
                    params=request.params,
                    rule=request.rule or rule,
                    event_id=request.event_id or event.id,
                )
            )
    return result


def collect_executors(pm: pluggy.PluginManager) -> dict[str, Executor]:
    """Every plugin's ``ftd_register_actions`` offers, merged; two offers for one kind fail start-up."""
    executors: dict[str, Executor] = {}
    owners: dict[str, str] = {}
    for impl in pm.hook.ftd_register_actions.get_hookimpls():
        try:
            offered = dict(cast(Mapping[str, Executor] | None, impl.function()) or {})
        except Exception as exc:
            raise PluginError(f"plugin {impl.plugin_name!r}: ftd_register_actions failed: {exc}") from exc
        for kind, executor in offered.items():
            if kind in executors:
                raise PluginError(
                    f"two executors for action kind {kind!r}: {owners[kind]!r} and {impl.plugin_name!r}"
                )
            executors[kind], owners[kind] = executor, impl.plugin_name
    return executors
