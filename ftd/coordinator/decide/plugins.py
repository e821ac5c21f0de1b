"""Loading rule plugins and calling them one at a time.

Sources, in order (see :mod:`ftd.plugin.hookspecs`): the built-in rules (:data:`DEFAULT_RULES`), every
module on the ``ftd`` entry-point group, every ``*.py`` file in ``rule_dirs`` (sorted by name; files
starting with ``_`` or ``.`` are skipped, the name without ``.py`` is the plugin name), the declarative
rules of the ``rules_file`` packs (one TOML file, a list of them, or directories of ``*.toml`` packs;
plugin name ``toml:<rule name>``; see :mod:`ftd.coordinator.decide.declarative`), then ``extra``
objects (tests, embedding).
A plugin listed in ``disabled`` is blocked by name (built-ins, entry-point names, file stems and
``toml:`` names alike). A rule file that does not import fails start-up with a :class:`PluginError`
naming the file, the line and the reason; so does an unknown hook name (``check_pending``).

Each implementation is called in isolation (:func:`evaluate`, :func:`call_each`) so one broken rule
cannot silence the rest; its failure is returned to the caller to be logged and counted.

What is loaded, for operators (:func:`describe_plugins`): each plugin's name, its source
(:data:`SOURCES`: ``builtin``, ``entry_point``, ``rule_dir``, ``declarative``, ``extra``), where it
came from (module, distribution, file) and the hooks it implements. The coordinator logs it at
start-up (``rules_loaded``), ``GET /v1/rules`` serves it and ``ftd rules list`` prints it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
import traceback
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import pluggy

from ftd.events import Event
from ftd.plugin import hookspecs
from ftd.plugin.actions import ActionRequest
from ftd.plugin.hookspecs import Executor
from ftd.plugin.settings import RuleSettings
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
    "ftd.rules.app_faults",
    "ftd.rules.nccl_ib",
    "ftd.rules.sxid",
    "ftd.rules.gpu_health",
    "ftd.rules.thermal",
    "ftd.rules.memory",
    "ftd.rules.kernel",
    "ftd.rules.shared_fs",
    "ftd.rules.storage",
    "ftd.rules.host",
    "ftd.rules.supervisor",
    "ftd.rules.interruption",
    "ftd.rules.fabric",
)


class PluginError(RuntimeError):
    pass


#: Where a plugin comes from: a built-in rule (or ftd's own executors), a module on the ``ftd``
#: entry-point group, a file of ``coordinator.rule_dirs``, a ``[[rule]]`` of a ``coordinator.rules_file``
#: pack, or an object handed in by the embedding code (tests, ``extra``).
SOURCES = ("builtin", "entry_point", "rule_dir", "declarative", "extra")


@dataclass(frozen=True)
class PluginInfo:
    name: str
    source: str  # one of SOURCES
    origin: str  # module name, "distribution version (module)", file path or rule pack
    hooks: tuple[str, ...]  # the ftd_* hooks it implements

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "origin": self.origin, "hooks": list(self.hooks)}


# What make_plugin_manager registered from where: plugin name -> (source, origin), per manager.
_SOURCES: weakref.WeakKeyDictionary[pluggy.PluginManager, dict[str, tuple[str, str]]] = (
    weakref.WeakKeyDictionary()
)


def describe_plugins(pm: pluggy.PluginManager) -> list[PluginInfo]:
    """Every plugin registered in ``pm`` (built-ins first, then in loading order) with its source and
    hooks; a plugin registered some other way than :func:`make_plugin_manager` is ``extra``."""
    sources = _SOURCES.get(pm, {})
    infos: list[PluginInfo] = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:  # blocked (disabled)
            continue
        source, origin = sources.get(name) or ("extra", _module_of(plugin))
        hooks = tuple(sorted(caller.name for caller in pm.get_hookcallers(plugin) or ()))
        infos.append(PluginInfo(name, source, origin, hooks))
    order = {source: i for i, source in enumerate(SOURCES)}
    return sorted(infos, key=lambda info: order.get(info.source, len(order)))


def disabled_plugins(pm: pluggy.PluginManager) -> list[str]:
    """The names ``disabled`` blocked (they are not loaded)."""
    return sorted(name for name, plugin in pm.list_name_plugin() if plugin is None)


def _module_of(plugin: object) -> str:
    if isinstance(plugin, ModuleType):
        return plugin.__name__
    return f"{type(plugin).__module__}.{type(plugin).__qualname__}"


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
    rules_file: str | Path | Sequence[str | Path] | None = None,
    builtins: bool = True,
) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    sources = _SOURCES.setdefault(pm, {})
    for name in disabled:
        pm.set_blocked(name)
    if builtins:
        for module in DEFAULT_RULES:
            name = default_rule_name(module)
            if not pm.is_blocked(name):
                pm.register(importlib.import_module(module), name=name)
                sources[name] = ("builtin", module)
    if entry_points:
        pm.load_setuptools_entrypoints(hookspecs.PROJECT)
        for plugin, dist in pm.list_plugin_distinfo():
            loaded = pm.get_name(plugin)
            if loaded is not None:
                origin = f"{dist.project_name} {dist.version} ({_module_of(plugin)})"
                sources[loaded] = ("entry_point", origin)
    for path in rule_files(rule_dirs):
        if pm.is_blocked(path.stem):
            continue
        if pm.has_plugin(path.stem):
            raise PluginError(f"{path}: a plugin named {path.stem!r} is already loaded; rename the file")
        pm.register(load_rule_file(path), name=path.stem)
        sources[path.stem] = ("rule_dir", str(path))
    if rules_file is not None:
        from ftd.coordinator.decide.declarative import DeclarativeError, load_rule_packs

        try:
            declared = load_rule_packs(rules_file)
        except DeclarativeError as exc:
            raise PluginError(str(exc)) from exc
        for rule in declared:
            if not pm.is_blocked(rule.plugin_name) and not pm.is_blocked(rule.name):
                pm.register(rule, name=rule.plugin_name)
                sources[rule.plugin_name] = ("declarative", rule.source)
    for plugin in extra:
        given = getattr(plugin, "plugin_name", None)
        registered = pm.register(plugin, name=given if isinstance(given, str) else None)
        module = _module_of(plugin)
        if registered is not None:  # ftd's own (the built-in executors) or the embedder's
            sources[registered] = ("builtin" if module.startswith("ftd.") else "extra", module)
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


@dataclass(frozen=True)
class _Rule:
    name: str
    function: Any
    argnames: tuple[str, ...]
    kinds: frozenset[str] | None  # the plugin's EVENT_KINDS; None: every event


def _rules(pm: pluggy.PluginManager, kind: str) -> list[_Rule]:
    """The ``ftd_evaluate`` implementations that want events of ``kind``, with what :func:`evaluate`
    needs; rebuilt only when the registered plugins change (per event this was most of the engine's
    time), kept per kind so a rule declaring other ``EVENT_KINDS`` costs nothing per event."""
    impls = pm.hook.ftd_evaluate.get_hookimpls()
    cached: _Cached | None = getattr(pm, _CACHE_ATTR, None)  # on the manager: lives and dies with it
    if cached is None or cached[0] != impls:  # HookImpl compares by identity: a C-speed check
        cached = (impls, [_rule_of(impl) for impl in impls], {})
        setattr(pm, _CACHE_ATTR, cached)
    by_kind = cached[2]
    rules = by_kind.get(kind)
    if rules is None:
        rules = by_kind[kind] = [r for r in cached[1] if r.kinds is None or kind in r.kinds]
    return rules


def _rule_of(impl: Any) -> _Rule:
    declared = getattr(impl.plugin, "EVENT_KINDS", None)
    kinds = frozenset(str(kind) for kind in declared) if declared is not None else None
    return _Rule(impl.plugin_name, impl.function, tuple(impl.argnames), kinds)


_Cached = tuple[list[Any], list[_Rule], dict[str, list[_Rule]]]
_CACHE_ATTR = "_ftd_rules_by_kind"  # a weak-keyed map cost more per event than the rules' own work


_BOTH = ("event", "view")
_ALL = ("event", "view", "settings")


def evaluate(
    pm: pluggy.PluginManager,
    event: Event,
    view: ClusterView,
    settings: RuleSettings,
    slow_s: float = 0.05,
) -> Evaluation:
    """Ask every rule about ``event`` (a rule declaring ``EVENT_KINDS`` only for those kinds), each
    with the arguments it declares of ``event``, ``view`` and ``settings``."""
    result = Evaluation()
    arguments = {"event": event, "view": view, "settings": settings}
    ended = time.perf_counter()  # one clock read per rule: each starts when the one before ended
    for impl in _rules(pm, str(event.kind)):
        rule = impl.name
        started = ended
        try:
            if impl.argnames == _BOTH:
                proposed = cast(Iterable[object] | None, impl.function(event=event, view=view))
            elif impl.argnames == _ALL:
                proposed = cast(
                    Iterable[object] | None, impl.function(event=event, view=view, settings=settings)
                )
            else:
                proposed = impl.function(**{name: arguments[name] for name in impl.argnames})
        except Exception as exc:  # isolation: one broken rule must not silence the others
            ended = time.perf_counter()
            result.errors.append((rule, f"{type(exc).__name__}: {exc}"))
            continue
        ended = time.perf_counter()
        elapsed = ended - started
        if elapsed > slow_s:
            result.slow.append((rule, elapsed))
        if proposed is None:
            continue
        try:
            items = list(proposed)
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
