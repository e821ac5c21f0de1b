"""The plugin contract (pluggy, project name ``ftd``): every hook a rule plugin may implement.

Plugins implement hooks with ``@ftd.plugin.hookspecs.hookimpl`` (a module, or an object whose
methods are hooks). They are found in four places, in this order: the built-in rules
(``ftd.rules``), every module on the ``ftd`` entry-point group, every ``*.py`` file in the
directories named by ``coordinator.rule_dirs``, and the declarative rules of
``coordinator.rules_file``. A plugin named in ``coordinator.disabled_rules`` is not loaded.

The engine calls **each implementation on its own** (never pluggy's all-at-once call, for every hook
the coordinator calls after start-up): one implementation that raises is logged, counted and
skipped while the others still run. A hook name a plugin misspells fails start-up
(``check_pending``), as does a rule file that cannot be imported (file, line, reason).

Every hook below documents, in this order, the sections (checked by a test):

- **Called:** when and how often the coordinator calls it;
- **Arguments:** what each argument is (and what may not be done with it);
- **Result:** what to return and how the results of several plugins combine;
- **Errors:** what happens when the implementation raises.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from ftd.events import Event
    from ftd.plugin.actions import ActionRecord, ActionRequest
    from ftd.plugin.settings import RuleSettings
    from ftd.plugin.view import ClusterView

PROJECT = "ftd"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

Executor = Callable[["ActionRecord"], Awaitable[dict[str, Any]]]

#: The sections every hookspec docstring has, in order (tests/unit/test_hookspecs.py checks them).
DOC_SECTIONS = ("Called:", "Arguments:", "Result:", "Errors:")


@hookspec
def ftd_evaluate(event: Event, view: ClusterView, settings: RuleSettings) -> list[ActionRequest] | None:
    """Decide what, if anything, should happen because of ``event``.

    Called: once per new (deduplicated) event, synchronously in the coordinator's event loop, before
    the event is folded into the cluster history (so ``view.node_history`` shows the past only).
    ``ftd rules test`` calls it the same way while replaying recorded events.
    Arguments: ``event`` (:class:`ftd.events.Event`, frozen) and ``view``, a read-only
    :class:`~ftd.plugin.view.ClusterView` (nodes, jobs and where they run, GPUs by UUID,
    fault history). Do not mutate either. ``settings`` (:class:`~ftd.plugin.settings.RuleSettings`,
    frozen) is what this coordinator's configuration says to rules (the crash-loop limits of
    ``policy.app_fault_*``), the same object for every event; an implementation that does not need
    it leaves the argument out (``def ftd_evaluate(event, view)``), as with any pluggy hook.
    Result: a list of :class:`~ftd.plugin.actions.ActionRequest` (or None / [] for nothing). The
    requests of all plugins are concatenated; ``rule`` defaults to the plugin's name and
    ``event_id`` to the event's id. The engine, not the rule, applies the policy gate (dedupe,
    cooldown, rate limit, budgets, dry-run, approval) and runs the actions.
    Rules must be pure and fast: no I/O, no sleeping, no clock (use ``event.ts``); state kept inside a
    rule object (a sliding-window counter) is allowed when it depends only on the events seen.
    Errors: an exception is logged and counted (``rule_errors``); the other plugins still decide.
    A result item that is not an ActionRequest is reported the same way and dropped.
    Speed: a plugin (module or object) may declare ``EVENT_KINDS``, the event kinds it decides on;
    it is then called only for those (``EVENT_KINDS = frozenset({Kind.XID})``). Without it, every
    event. The built-in rules declare theirs, and a property test holds them to it.
    """


@hookspec
def ftd_register_actions() -> Mapping[str, Executor] | None:
    """Offer executors for action kinds, as ``{kind: async callable(record) -> detail dict}``.

    Called: once at start-up, after the built-in executors are registered.
    Arguments: none.
    Result: a mapping; a kind that is already registered (built-in or by another plugin) is an
    error reported at start-up. The executor must be idempotent: a restarted coordinator may run
    an unfinished action again. Its detail dict may carry ``state`` (an ActionState value, e.g.
    ``"escalated"``); otherwise a normal return means ``succeeded``.
    Errors: an exception here fails start-up (a coordinator without its executors must not run).
    """


@hookspec
def ftd_startup(coordinator: Any) -> None:
    """Get ready once the coordinator exists (open a webhook session, read a static inventory...).

    Called: once, after the engine is built and has read its memory from the ledger (ftd's drains,
    held approvals, recent history), before the first bus message is handled.
    Arguments: ``coordinator``, the :class:`ftd.coordinator.daemon.Coordinator` (``.config``,
    ``.state``, ``.engine``, ``.ledger``). Treat it as read-only; keep a reference if you need one.
    ``.ledger`` is the asynchronous :class:`~ftd.coordinator.ledger.store.LedgerStore` (await its
    methods, from a task of your own: this hook itself is synchronous).
    In a replay or a simulation (``ftd rules test``, ``ftd sim goodput``) it is a stand-in with the
    same attributes and ``simulated = True``: read settings, but open no connections then.
    Result: ignored (return None).
    Errors: an exception is logged with the plugin's name and start-up goes on; the plugin's other
    hooks are still called, so a plugin whose start-up failed should make them do nothing.
    """


@hookspec
def ftd_action_completed(request: ActionRequest, record: ActionRecord) -> None:
    """Learn how an action ended (follow-up bookkeeping, notifications, metrics).

    Called: once per action that ran, after its executor returned or raised and its final state
    was written to the ledger (succeeded, escalated or failed). Not called for actions the policy
    gate suppressed, dry-run or rejected ones (their verdict is in the ledger and the observers').
    Arguments: ``request`` (the :class:`~ftd.plugin.actions.ActionRequest`, frozen) and
    ``record`` (the :class:`~ftd.plugin.actions.ActionRecord`: ``state`` and ``detail``); do
    not mutate the record.
    Result: ignored. To act on the outcome, a plugin cannot submit actions from here (rules stay
    pure); it may emit an event through its own channel, which rules then see.
    Errors: an exception is logged with the plugin's name; the other implementations still run.
    """
