"""Rules declare the event kinds they decide on (``EVENT_KINDS``); the coordinator skips them for
the rest. The declaration is a promise the property test below holds every built-in rule to: for an
event of any other kind, whatever its data and whatever came before, the rule would have said
nothing. (With fourteen built-in rules, calling each for every event was most of the engine's time.)
"""

from __future__ import annotations

import importlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.coordinator.decide.plugins import DEFAULT_RULES, evaluate, make_plugin_manager
from ftd.events import Kind
from ftd.plugin import ActionKind, ActionRequest, hookimpl
from ftd.plugin.settings import RuleSettings
from ftd.testing import make_event, view_with
from tests.properties import examples
from tests.unit.test_signal_rules import _KEYS, _VALUES

MODULES = [importlib.import_module(name) for name in DEFAULT_RULES]
DECLARING = [module for module in MODULES if hasattr(module, "EVENT_KINDS")]
ALL_KINDS = [k.value for k in Kind]


def _call(module: Any, event: Any, view: Any) -> Any:
    """The module's ``ftd_evaluate`` with the arguments it declares, as the engine calls it."""
    arguments = {"event": event, "view": view, "settings": RuleSettings()}
    wanted = module.ftd_evaluate.__code__.co_varnames[: module.ftd_evaluate.__code__.co_argcount]
    return module.ftd_evaluate(**{name: arguments[name] for name in wanted})


def test_most_builtin_rules_declare_their_kinds() -> None:
    assert len(DECLARING) >= len(DEFAULT_RULES) - 1  # repeat_offender looks at every event's GPU
    for module in DECLARING:
        assert module.EVENT_KINDS and set(module.EVENT_KINDS) <= set(ALL_KINDS), module.__name__


@settings(max_examples=examples(300), deadline=None)
@given(
    history=st.lists(
        st.tuples(
            st.sampled_from(ALL_KINDS),
            st.sampled_from(["info", "warning", "error", "critical"]),
            st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=6),
        ),
        max_size=4,
    ),
    severity=st.sampled_from(["info", "warning", "error", "critical"]),
    data=st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=8),
    kind=st.sampled_from(ALL_KINDS),
)
def test_a_rule_says_nothing_about_kinds_it_does_not_declare(
    history: list[tuple[str, str, dict[str, Any]]], severity: str, data: dict[str, Any], kind: str
) -> None:
    view = view_with(jobs={"j1": ["node-1", "node-2"]})
    for i, (past_kind, past_severity, past_data) in enumerate(history):
        past = make_event("node-1", past_kind, severity=past_severity, data=past_data, ts=1000.0 + i)
        view.apply_event(past)
    event = make_event("node-1", kind, severity=severity, data=data, ts=2000.0)
    for module in DECLARING:
        if kind not in module.EVENT_KINDS:
            assert not _call(module, event, view), (module.__name__, kind)


class OnlyXid:
    EVENT_KINDS = frozenset({Kind.XID})

    def __init__(self) -> None:
        self.seen: list[str] = []

    @hookimpl
    def ftd_evaluate(self, event: Any) -> list[ActionRequest]:
        self.seen.append(str(event.kind))
        return [ActionRequest(kind=ActionKind.NOTIFY, target=event.node, reason="x")]


class Everything:
    def __init__(self) -> None:
        self.seen: list[str] = []

    @hookimpl
    def ftd_evaluate(self, event: Any) -> None:
        self.seen.append(str(event.kind))


def test_evaluate_skips_undeclared_kinds_and_sees_plugins_registered_later() -> None:
    only, every = OnlyXid(), Everything()
    pm = make_plugin_manager(entry_points=False, builtins=False, extra=(only,))
    view = view_with()
    for kind in ("xid", "thermal"):
        evaluate(pm, make_event("node-1", kind), view, RuleSettings())
    pm.register(every, name="everything")  # the cached dispatch table must follow
    result = evaluate(pm, make_event("node-1", "thermal"), view, RuleSettings())
    assert only.seen == ["xid"] and every.seen == ["thermal"] and result.requests == []
