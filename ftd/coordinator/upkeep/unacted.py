"""Active critical conditions that were never acted on: the drain asked for again, with a back-off.

What: each reconciliation round (:meth:`~ftd.coordinator.upkeep.reconcile.Reconciler.reconcile`)
looks at every node whose agent reports active critical conditions (retained
``ftd/v1/nodes/{node}/conditions/ftd``, :attr:`ClusterState.conditions`) and that is still in
service: not drained by ftd, not out by someone else (an operator's drain, a node down), no
drain or resume of it pending, running or awaiting approval. Such a node is *unacted on* when

* ftd's last drain of it **failed** (a scheduler outage when the fault came), was **escalated**, or was
  **suppressed** by the gate (the blast-radius budget was full, a cooldown, a rate limit): that
  request is proposed again; or
* ftd never asked to drain it although one of its conditions is a fault whose remedy in the catalog is
  a drain (Xid 79 and the other RESTART_BM / RESTART_VM / CHECK_MECHANICALS codes,
  ``gpu_fallen_off_bus``): a ledger moved aside, an event lost before it was committed.

The request goes through :meth:`Engine.submit` like any other (rule ``reconcile``), so the policy
gate, the budgets, dry-run and manual approval all apply to it; its reason says it is a retry
("retry of an unacted condition: <the original reason>"), its ``params`` name the action it retries
and the node's conditions, and the log line ``unacted_condition_retried`` says why. At most one request per
node per round, and never sooner than ``coordinator.unacted_retry_s`` after the last attempt,
doubling with each retry that did not drain the node, up to ``coordinator.unacted_retry_max_s``.

Never retried: a drain an operator rejected (their answer stands), one decided in dry-run (the
site asked not to act), one that succeeded (the node was drained and someone returned it to service
since: their call), and any node once its conditions are gone (the back-off starts over).

Why: "the node keeps its active Xid 79, undrained, for good" (issue #20): one failed ``scontrol``
during a fault left a GPU off the bus in service, because an event is decided once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ftd.catalog.remedy import DRAIN, resolve_xid
from ftd.coordinator.model.state import ClusterState
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState

RULE = "reconcile"
RETRY_PREFIX = "retry of an unacted condition: "
#: The outcomes of ftd's last drain of a node after which it is asked again.
RETRIED = frozenset({ActionState.FAILED, ActionState.ESCALATED, ActionState.SUPPRESSED})
_IN_FLIGHT = frozenset({ActionState.PENDING, ActionState.RUNNING, ActionState.AWAITING_APPROVAL})
_XID = re.compile(r"^xid (\d+)\b")
_DRAIN_KINDS = ("gpu_fallen_off_bus",)
_RETRY_PARAMS = (
    "retry_of",
    "last_state",
    "why",
    "conditions",
)  # condition kinds whose remedy is always a drain


def drain_remedy(condition: str) -> bool:
    """Whether an active condition (its agent's one-line reason, :func:`ftd.agent.conditions.reason_of`:
    ``xid 79 on 0000:3b:00.0``, ``gpu_fallen_off_bus ...``) is a fault the catalog answers with a drain."""
    match = _XID.match(condition)
    if match:
        return resolve_xid(int(match.group(1)), {}).plan == DRAIN
    return condition.split(" ", 1)[0] in _DRAIN_KINDS


def rejected(record: ActionRecord) -> bool:
    """An operator said no to this action (the engine's ``rejected by ...`` policy note)."""
    return str(record.detail.get("policy", "")).startswith("rejected by")


@dataclass
class Retry:
    """One node's retries so far: how many, and when the last one (or the attempt it retries) was."""

    attempts: int = 0
    last: float = 0.0


@dataclass
class UnactedConditions:
    """Decides, each round, which nodes' drains to ask for again (see the module docstring)."""

    backoff_s: float = 300.0  # 0: never retried
    max_backoff_s: float = 3600.0
    clock: Callable[[], float] = field(default=lambda: 0.0)
    last_drain: dict[str, ActionRecord] = field(default_factory=dict)  # node -> ftd's last drain_node
    retries: dict[str, Retry] = field(default_factory=dict)

    def observe(self, record: ActionRecord) -> None:
        """Every drain_node decision and state change (the reconciler's engine observer)."""
        if record.request.kind != ActionKind.DRAIN_NODE:
            return
        node = record.request.target
        previous = self.last_drain.get(node)
        if previous is None or previous.id == record.id or (record.created or 0) >= (previous.created or 0):
            self.last_drain[node] = record
        if record.state == ActionState.SUCCEEDED:
            self.retries.pop(node, None)

    def restore(self, records: Iterable[ActionRecord]) -> None:
        """The ledger's recent actions at start-up, oldest first."""
        for record in records:
            self.observe(record)

    def wait_s(self, attempts: int) -> float:
        """How long after the last attempt the next retry may be asked (doubling, capped)."""
        return float(min(self.backoff_s * (2**attempts), max(self.max_backoff_s, self.backoff_s)))

    def due(self, state: ClusterState, *, busy: Callable[[str], bool]) -> list[ActionRequest]:
        """The drain requests to propose this round, one per node at most (``busy(node)``: a drain or
        resume of it is under way, the reconciler's own bookkeeping)."""
        if self.backoff_s <= 0:
            return []
        now = self.clock()
        for node in [n for n in self.retries if n not in state.conditions]:
            del self.retries[node]  # its conditions are over: a later fault starts afresh
        out: list[ActionRequest] = []
        for node, conditions in sorted(state.conditions.items()):
            record = state.nodes.get(node)
            if (record is not None and record.drained_by_ftd) or node in state.unavailable or busy(node):
                continue
            request = self._request(node, conditions, self.last_drain.get(node))
            if request is None:
                continue
            retry = self.retries.setdefault(node, Retry())
            last = self.last_drain.get(node)
            since = max(retry.last, (last.updated or last.created) if last is not None else 0.0)
            if since and now - since < self.wait_s(retry.attempts):
                continue
            retry.attempts += 1
            retry.last = now
            out.append(request)
        return out

    def _request(self, node: str, conditions: list[str], last: ActionRecord | None) -> ActionRequest | None:
        if last is not None:
            if last.state in _IN_FLIGHT or last.state not in RETRIED or rejected(last):
                return None  # under way, done (succeeded: released since), dry run, or an operator's no
            why = str(last.detail.get("error") or last.detail.get("policy") or last.state)
            original = last.request.reason.removeprefix(RETRY_PREFIX)
            params: dict[str, Any] = {
                **{k: v for k, v in last.request.params.items() if k not in _RETRY_PARAMS},
                "retry_of": last.id,
                "last_state": str(last.state),
                "why": why[:300],
            }
            return self._build(node, original, conditions, params, last.request.event_id)
        remedied = [c for c in conditions if drain_remedy(c)]
        if not remedied:
            return None  # none of its conditions is answered with a drain by the catalog
        params = {"last_state": "never asked", "why": "no drain of this node was ever asked for"}
        return self._build(node, remedied[0], conditions, params, None)

    def _build(
        self,
        node: str,
        original: str,
        conditions: list[str],
        params: Mapping[str, Any],
        event_id: str | None,
    ) -> ActionRequest:
        return ActionRequest(
            kind=ActionKind.DRAIN_NODE,
            target=node,
            reason=RETRY_PREFIX + original,
            params={**params, "conditions": list(conditions[:16])},
            rule=RULE,
            event_id=event_id,
        )
