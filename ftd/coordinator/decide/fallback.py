"""What the engine does with an action nothing here can carry out: notify instead, or say why not.

A coordinator without a scheduler (``coordinator.scheduler = "none"``: detect and notify only) has
no ``drain_node`` / ``resume_node`` executor. A rule that asks for a drain there (Xid 79) must not
end in a failed action whose error is a Python repr; the operator needs to hear that the node should
be drained, and that it is theirs to do. So a rule's request of a kind without an executor becomes a
``notify`` (when one is registered) naming what was asked and why, with ``params["instead_of"]``;
an operator's own request (``rule`` ``api:<by>``) is refused with a sentence that says what to do,
since a notification back to the person asking would be no answer. Pure functions: the engine
records and runs what they return.
"""

from __future__ import annotations

from collections.abc import Container

from ftd.coordinator.decide import drill
from ftd.plugin.actions import ActionKind, ActionRequest

_VERBS: dict[str, str] = {ActionKind.DRAIN_NODE: "drain", ActionKind.RESUME_NODE: "resume"}
_PAST: dict[str, str] = {ActionKind.DRAIN_NODE: "drained", ActionKind.RESUME_NODE: "resumed"}
_SCHEDULER_KINDS = frozenset(_VERBS)
NO_SCHEDULER = 'no scheduler is configured (coordinator.scheduler = "none": detect and notify only)'


def _verb(kind: str) -> str:
    return _VERBS.get(kind, f"run {kind} for")


def instead(request: ActionRequest, executors: Container[str]) -> ActionRequest | None:
    """The notification to send instead of ``request`` (which has no executor), or None when it
    must fail: an operator's own request, or no ``notify`` executor either."""
    if request.rule.startswith("api:") or ActionKind.NOTIFY not in executors:
        return None
    if request.kind in _SCHEDULER_KINDS:
        why = f'coordinator.scheduler = "none" (detect and notify only): {_verb(request.kind)} it by hand'
    else:
        why = f"no executor is registered for {request.kind}: carry it out by hand"
    target = request.target
    subject = f"job {target}" if request.targets_job else target
    told = ActionRequest(
        kind=ActionKind.NOTIFY,
        target=target if not request.targets_job else str(request.params.get("node") or target),
        reason=f"{subject} should be {_past(request.kind)} ({request.reason}), but {why}",
        params={
            **request.params,
            "instead_of": str(request.kind),
            "target": target,
            **({"job": target} if request.targets_job else {}),  # a job's: its notification names it
        },
        rule=request.rule,
        event_id=request.event_id,
    )
    return drill.marked(told) if request.params.get("drill") is True else told


def _past(kind: str) -> str:
    return _PAST.get(kind, f"acted on ({kind})")


def no_executor_error(request: ActionRequest) -> str:
    """The sentence a request without an executor fails with (never a repr)."""
    if request.kind in _SCHEDULER_KINDS:
        verb = _VERBS[request.kind]
        return (
            f"cannot {verb} {request.target}: {NO_SCHEDULER}; {verb} it in the scheduler by hand, "
            "or set coordinator.scheduler to the scheduler ftd should use."
        )
    return (
        f"cannot {_verb(request.kind)} {request.target}: no executor is registered for action kind "
        f"{request.kind} (a plugin that provides it is not loaded)."
    )
