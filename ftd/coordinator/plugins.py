"""Loading rule plugins and calling them one at a time.

Sources, in order: the built-in rules (``ftd.rules.*``) and every module on the ``ftd`` entry-point
group. A plugin listed in ``disabled`` is blocked by name. Each ``ftd_evaluate`` implementation is
called in isolation so one broken rule cannot silence the rest; its failure is returned to the
engine to be logged and counted.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import cast

import pluggy

from ftd.coordinator import hookspecs
from ftd.coordinator.model import ActionRequest
from ftd.coordinator.state import ClusterView
from ftd.events import Event
from ftd.rules import BUILTIN_RULES


class PluginError(RuntimeError):
    pass


@dataclass
class Evaluation:
    requests: list[ActionRequest] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (rule, error)
    slow: list[tuple[str, float]] = field(default_factory=list)  # (rule, seconds)


def make_plugin_manager(
    *, disabled: Iterable[str] = (), extra: Iterable[ModuleType | object] = (), entry_points: bool = True
) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for name in disabled:
        pm.set_blocked(name)
    for module in BUILTIN_RULES():
        name = module.__name__.rsplit(".", 1)[-1]
        if not pm.is_blocked(name):
            pm.register(module, name=name)
    if entry_points:
        pm.load_setuptools_entrypoints(hookspecs.PROJECT)
    for plugin in extra:
        pm.register(plugin)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {exc.plugin!r} implements an unknown hook: {exc}") from exc
    return pm


def evaluate(pm: pluggy.PluginManager, event: Event, view: ClusterView, slow_s: float = 0.05) -> Evaluation:
    result = Evaluation()
    for impl in pm.hook.ftd_evaluate.get_hookimpls():
        rule = impl.plugin_name
        started = time.perf_counter()
        try:
            proposed = cast(Iterable[object] | None, impl.function(event=event, view=view))
        except Exception as exc:  # isolation: one broken rule must not silence the others
            result.errors.append((rule, f"{type(exc).__name__}: {exc}"))
            continue
        elapsed = time.perf_counter() - started
        if elapsed > slow_s:
            result.slow.append((rule, elapsed))
        for request in proposed or ():
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
