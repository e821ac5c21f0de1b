"""The policy gate: the last word before any action runs.

Checks, in order, each recorded with its reason when it says no:

1. **dedupe** — an action with the same key (kind + target) is pending, running or awaiting approval;
2. **cooldown** — the same cooldown key (the key, plus the faulty node for a job action) finished
   less than ``cooldown_s`` ago (a flapping GPU must not be drained, resumed and drained again every
   minute; a requeued job must still be restarted when a *different* node fails under it). A request
   whose ``params["severity"]`` ranks above the severity of the action that started the cooldown
   passes: a save asked on a warning must not hold back the stop on a critical crossing; so does a
   job action for a job that the finished action moved off the node (``params.exclude``) and that
   runs there again (the cluster view says so): it came back onto the fault, a new incident.
   A *failed* action cools down only ``failed_retry_s`` (default 30 s), and never holds back an
   operator's own action (``rule`` ``api:<by>``): what failed did not happen, so nothing is there
   to protect; its retry must not wait 10 minutes.
   Three requests are not held back by the cooldown at all, and the verdict's reason says so: a
   job action that moves its job off a node (``params.exclude`` or ``avoid``) the finished action left it on
   (an Xid 79 right after an Xid 13's restart in place: the stronger remedy), a crash-loop restart
   (a job action with ``params["attempt"]``, asked by the application-fault policy, which paces its
   restarts with its own backoff, ``params["delay_s"]``, and its own limit), and an operator's
   forced action (``params["force"]`` with ``params["force_reason"]``, from the
   API only: ``rule`` ``api:<by>``), the reason recorded in the ledger;
3. **rate limit** — at most ``max`` actions of a kind started within ``window_s`` (per
   :class:`RateLimit`; a storm of Xids on many nodes must not restart every job at once);
4. **blast radius** (``drain_node`` only) — the nodes drained by ftd (from the cluster state) plus
   the drains in flight may not exceed ``max(min_drain_budget, floor(max_drained_fraction x
   nodes known))``; nor ``max_drained_per_job`` among the nodes of any job on the target; nor
   ``max_drained`` of a :class:`DomainBudget` among nodes sharing the target's label value (rack,
   NVLink domain: ``coordinator.node_labels``). A node with no such label is not in any domain.
   "Drained by ftd" is the reconciled set (:mod:`ftd.coordinator.upkeep.reconcile`): persisted in the ledger
   (a restart remembers it) and checked against the scheduler, so a node an operator resumed no
   longer counts. Drains and downs made by others (no ``ftd:`` reason) are unavailable capacity
   (``ClusterState.unavailable``) but never count against ftd's budget: an operator's maintenance
   must not stop ftd from taking a GPU that fell off the bus out of service;
5. **dry-run** — globally, or for the proposing rule (shadow mode): recorded as ``dry_run``;
6. **approval** — a kind in ``approval_required_kinds`` is recorded as ``awaiting_approval``; a human
   approves (the request goes through checks 1-5 again, as the cluster may have changed) or rejects
   it (:meth:`ftd.coordinator.decide.engine.Engine.approve` / ``reject``).

The gate is a pure object over its own memory, a clock and the read-only cluster view handed to
:meth:`PolicyGate.decide`; the engine restores that memory from the ledger at start-up so a restart
does not reset dedupe or cooldowns (rate-limit windows do start afresh after a restart).
``checkpoint_restart`` and the other job actions are never held back by the drain budgets: moving a
job off a dead node is what saves its work, and the node is gone either way.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState

if TYPE_CHECKING:
    from ftd.config import CoordinatorConfig
    from ftd.plugin.view import NodeRecord


@dataclass(frozen=True)
class Verdict:
    state: ActionState  # PENDING (go), SUPPRESSED, DRY_RUN or AWAITING_APPROVAL
    reason: str = ""

    @property
    def allowed(self) -> bool:
        return self.state == ActionState.PENDING


@dataclass(frozen=True)
class RateLimit:
    kind: str
    max: int
    window_s: float


@dataclass(frozen=True)
class DomainBudget:
    label: str  # a node label, e.g. "rack" or "nvlink_domain"
    max_drained: int


def labels_from_config(cfg: CoordinatorConfig) -> dict[str, dict[str, str]]:
    """``coordinator.node_labels`` entries as node -> {label: value} (a later entry wins)."""
    labels: dict[str, dict[str, str]] = {}
    for entry in cfg.node_labels:
        for node in entry.nodes:
            for label in ("rack", "nvlink_domain"):
                value = getattr(entry, label)
                if value is not None:
                    labels.setdefault(node, {})[label] = value
    return labels


_SEVERITY_RANKS = {"info": 0, "warning": 1, "error": 2, "critical": 3}
_NO_SEVERITY = -1


def excluded_nodes(request: ActionRequest) -> frozenset[str]:
    """The nodes a job action moves its job off: ``params.exclude`` and ``params.avoid`` (a rank
    supervisor's slot given to a spare without a drain, issue #24)."""
    nodes: set[str] = set()
    for key in ("exclude", "avoid"):
        value = request.params.get(key)
        if isinstance(value, list):
            nodes.update(n for n in value if isinstance(n, str))
    return frozenset(nodes)


def severity_rank(request: ActionRequest) -> int:
    """The rank of ``params["severity"]`` (the severity of what the rule acted on; rules set it);
    -1 when the request does not say (such requests cool down as before, whatever they follow)."""
    severity = request.params.get("severity")
    return _SEVERITY_RANKS.get(severity, _NO_SEVERITY) if isinstance(severity, str) else _NO_SEVERITY


def forced_reason(request: ActionRequest) -> str:
    """The audit reason of an operator's forced action (``params["force"]`` true and a
    ``params["force_reason"]``, asked through the API: ``rule`` ``api:<by>``); "" otherwise. Only the
    API sets these: a rule's ``force`` is ignored, so no rule can step past the cooldown."""
    reason = request.params.get("force_reason")
    if request.params.get("force") is True and request.rule.startswith("api:") and isinstance(reason, str):
        return reason.strip()
    return ""


def crash_loop_attempt(request: ActionRequest) -> int:
    """The attempt number of a crash-loop restart (a job action with an int ``params["attempt"]``,
    the application-fault policy's), which its own backoff paces; 0 for any other request."""
    attempt = request.params.get("attempt")
    if not request.targets_job or isinstance(attempt, bool) or not isinstance(attempt, int):
        return 0
    return max(attempt, 0)


class GateView(Protocol):
    """What the gate reads from the cluster (ClusterState provides it)."""

    def node(self, name: str) -> NodeRecord | None: ...

    def jobs_on_node(self, node: str) -> list[str]: ...

    def job_nodes(self, job: str) -> list[str]: ...

    def node_names(self) -> list[str]: ...

    def node_count(self) -> int: ...

    def drained_by_ftd(self) -> frozenset[str]: ...


class PolicyGate:
    def __init__(
        self,
        *,
        cooldown_s: float = 600.0,
        dry_run: bool = False,
        dry_run_rules: Iterable[str] = (),
        rate_limits: Iterable[RateLimit] = (),
        max_drained_fraction: float = 1.0,
        min_drain_budget: int = 1,
        max_drained_per_job: int | None = None,
        domain_budgets: Iterable[DomainBudget] = (),
        node_labels: Mapping[str, Mapping[str, str]] | None = None,
        approval_required_kinds: Iterable[str] = (),
        failed_retry_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cooldown_s = cooldown_s
        self.failed_retry_s = failed_retry_s
        self.dry_run = dry_run
        self.dry_run_rules = frozenset(dry_run_rules)
        self.rate_limits = {limit.kind: limit for limit in rate_limits}
        self.max_drained_fraction = max_drained_fraction
        self.min_drain_budget = min_drain_budget
        self.max_drained_per_job = max_drained_per_job
        self.domain_budgets = tuple(domain_budgets)
        self.node_labels = {node: dict(labels) for node, labels in (node_labels or {}).items()}
        self.approval_required_kinds = frozenset(approval_required_kinds)
        self.clock = clock
        self._active: dict[str, str] = {}  # key -> action id (pending, running, awaiting approval)
        self._active_requests: dict[str, ActionRequest] = {}  # key -> its request
        self._finished_at: dict[str, float] = {}  # key -> when the last one finished
        self._finished_failed: dict[str, bool] = {}  # key -> whether that last one failed
        self._finished_severity: dict[str, int] = {}  # key -> the severity rank of that last one
        self._finished_exclude: dict[str, frozenset[str]] = {}  # key -> nodes that last one moved off
        self._starts: dict[str, deque[float]] = {}  # kind -> start times inside its rate window

    @classmethod
    def from_config(cls, cfg: CoordinatorConfig, *, clock: Callable[[], float] = time.time) -> PolicyGate:
        policy = cfg.policy
        return cls(
            cooldown_s=policy.cooldown_s,
            dry_run=policy.dry_run,
            dry_run_rules=policy.dry_run_rules,
            rate_limits=[RateLimit(r.kind, r.max, r.window_s) for r in policy.rate_limits],
            max_drained_fraction=policy.max_drained_fraction,
            min_drain_budget=policy.min_drain_budget,
            max_drained_per_job=policy.max_drained_per_job,
            domain_budgets=[DomainBudget(b.label, b.max_drained) for b in policy.domain_budgets],
            node_labels=labels_from_config(cfg),
            approval_required_kinds=policy.approval_required_kinds,
            failed_retry_s=policy.failed_retry_s,
            clock=clock,
        )

    def restore(self, records: Iterable[ActionRecord]) -> None:
        for record in records:
            key = record.request.key
            if record.state in (ActionState.PENDING, ActionState.RUNNING, ActionState.AWAITING_APPROVAL):
                self._active[key] = record.id
                self._active_requests[key] = record.request
            elif record.state in (
                ActionState.SUCCEEDED,
                ActionState.ESCALATED,
                ActionState.FAILED,
                ActionState.LOGGED,
            ):
                cooled = record.request.cooldown_key
                if record.updated >= self._finished_at.get(cooled, 0.0):
                    self._finished_severity[cooled] = severity_rank(record.request)
                    self._finished_exclude[cooled] = excluded_nodes(record.request)
                    self._finished_failed[cooled] = record.state == ActionState.FAILED
                self._finished_at[cooled] = max(self._finished_at.get(cooled, 0.0), record.updated)

    # --- the decision ---------------------------------------------------------------------------

    def decide(
        self, request: ActionRequest, view: GateView | None = None, *, approving: str | None = None
    ) -> Verdict:
        """The verdict on ``request``. ``approving``: the id of the held action a human approves."""
        key = request.key
        holder = self._active.get(key)
        if holder is not None and holder != approving:
            return Verdict(ActionState.SUPPRESSED, f"duplicate: {key} already in progress ({holder})")
        now = self.clock()
        cooled = request.cooldown_key
        finished = self._finished_at.get(cooled)
        before = self._finished_severity.get(cooled, _NO_SEVERITY)
        if finished is not None and before != _NO_SEVERITY and severity_rank(request) > before:
            finished = None  # a higher severity is never held back by the cooldown of a lower one
        if finished is not None and view is not None and self._came_back(request, view, cooled):
            finished = None  # the job was moved off this node and runs there again: a new incident
        note = ""
        failed = finished is not None and self._finished_failed.get(cooled, False)
        if finished is not None and failed and request.rule.startswith("api:"):
            finished = None  # what failed did not happen: an operator's own action goes ahead
        if finished is not None:
            length = min(self.failed_retry_s, self.cooldown_s) if failed else self.cooldown_s
            remaining = length - (now - finished)
            if remaining > 0:
                ago = f"{cooled} {'failed' if failed else 'finished'} {now - finished:.0f}s ago"
                if forced_reason(request):
                    note = f"force: cooldown ({ago}) overridden by {request.rule}: {forced_reason(request)}"
                elif moves_off := self._moves_off(request, cooled):
                    note = (
                        f"cooldown ({ago}) not applied: this moves the job off {', '.join(moves_off)}, "
                        "where the last action left it"
                    )
                elif crash_loop_attempt(request):
                    note = (
                        f"cooldown ({ago}) not applied: crash-loop restart {crash_loop_attempt(request)}, "
                        "paced by its own backoff"
                    )
                else:
                    return Verdict(ActionState.SUPPRESSED, f"cooldown: {ago}")
        limit = self.rate_limits.get(request.kind)
        if limit is not None:
            starts = self._window(request.kind, now)
            if len(starts) >= limit.max:
                return Verdict(
                    ActionState.SUPPRESSED,
                    f"rate limit: {len(starts)} {request.kind} started in the last {limit.window_s:g}s "
                    f"(max {limit.max})",
                )
        if request.kind == ActionKind.DRAIN_NODE and view is not None:
            reason = self._blast_radius(request, view, approving)
            if reason:
                return Verdict(ActionState.SUPPRESSED, reason)
        if self.dry_run:
            return Verdict(ActionState.DRY_RUN, "dry-run: coordinator in dry-run mode")
        if request.rule in self.dry_run_rules:
            return Verdict(ActionState.DRY_RUN, f"dry-run: rule {request.rule} is in shadow mode")
        if approving is None and request.kind in self.approval_required_kinds:
            return Verdict(
                ActionState.AWAITING_APPROVAL, f"approval: {request.kind} actions need a human's approval"
            )
        return Verdict(ActionState.PENDING, note)

    def _moves_off(self, request: ActionRequest, cooled: str) -> list[str]:
        """The nodes a job action moves its job off (``params.exclude``) that the action whose
        cooldown it meets left the job on: a stronger remedy (an Xid 79 after an Xid 13's restart
        in place), never held back by the weaker one's cooldown -- else the node would be drained
        under a job left running on a GPU that fell off the bus."""
        if not request.targets_job:
            return []
        return sorted(excluded_nodes(request) - self._finished_exclude.get(cooled, frozenset()))

    def _came_back(self, request: ActionRequest, view: GateView, cooled: str) -> bool:
        """A job action for a node the finished action moved the job off (``params.exclude``), while
        the job runs on that node again (restarted onto a still-full disk, say)."""
        node = request.params.get("node")
        if not request.targets_job or not isinstance(node, str):
            return False
        return node in self._finished_exclude.get(cooled, ()) and request.target in view.jobs_on_node(node)

    def drain_budget(self, cluster_size: int) -> int:
        return max(self.min_drain_budget, math.floor(self.max_drained_fraction * cluster_size + 1e-9))

    def drained_set(self, view: GateView, *, exclude_id: str | None = None) -> set[str]:
        """Nodes out of service because of ftd: drained (state) plus drains pending/running/held."""
        drained = set(view.drained_by_ftd())  # kept by the state: no scan of every node per drain
        for key, request in self._active_requests.items():
            if request.kind == ActionKind.DRAIN_NODE and self._active.get(key) != exclude_id:
                drained.add(request.target)
        return drained

    def _blast_radius(self, request: ActionRequest, view: GateView, approving: str | None) -> str:
        node = request.target
        drained = self.drained_set(view, exclude_id=approving)
        if node in drained:
            return ""  # already out: draining it again removes nothing more
        size = view.node_count() + (view.node(node) is None)
        budget = self.drain_budget(size)
        if len(drained) + 1 > budget:
            return (
                f"blast radius: draining {node} would make {len(drained) + 1} of {size} nodes drained by "
                f"ftd (budget {budget}: max_drained_fraction {self.max_drained_fraction:g}, "
                f"min_drain_budget {self.min_drain_budget})"
            )
        if self.max_drained_per_job is not None:
            for job in view.jobs_on_node(node):
                out = drained & set(view.job_nodes(job))
                if len(out) + 1 > self.max_drained_per_job:
                    return (
                        f"blast radius: job {job} already has {len(out)} node(s) drained "
                        f"(max_drained_per_job {self.max_drained_per_job})"
                    )
        labels = self.node_labels.get(node, {})
        for budget_rule in self.domain_budgets:
            value = labels.get(budget_rule.label)
            if value is None:
                continue
            peers = {n for n in drained if self.node_labels.get(n, {}).get(budget_rule.label) == value}
            if len(peers) + 1 > budget_rule.max_drained:
                return (
                    f"blast radius: {budget_rule.label} {value} already has {len(peers)} node(s) drained "
                    f"(max {budget_rule.max_drained})"
                )
        return ""

    def _window(self, kind: str, now: float) -> deque[float]:
        starts = self._starts.setdefault(kind, deque())
        limit = self.rate_limits.get(kind)
        if limit is not None:
            while starts and starts[0] <= now - limit.window_s:
                starts.popleft()
        return starts

    # --- lifecycle -------------------------------------------------------------------------------

    def hold(self, record: ActionRecord) -> None:
        """An action is awaiting approval: it occupies its key (dedupe) and, for drains, the budget."""
        self._active[record.request.key] = record.id
        self._active_requests[record.request.key] = record.request

    def started(self, record: ActionRecord) -> None:
        self._active[record.request.key] = record.id
        self._active_requests[record.request.key] = record.request
        if record.request.kind in self.rate_limits:
            self._window(record.request.kind, self.clock()).append(self.clock())

    def release(self, record: ActionRecord) -> None:
        """A held action was rejected or dropped: free its key without starting a cooldown."""
        key = record.request.key
        if self._active.get(key) == record.id:
            del self._active[key]
            self._active_requests.pop(key, None)

    def finished(self, record: ActionRecord) -> None:
        """An action ended: its cooldown starts (``failed_retry_s`` only, when it failed)."""
        self.release(record)
        self._finished_failed[record.request.cooldown_key] = record.state == ActionState.FAILED
        self._finished_at[record.request.cooldown_key] = self.clock()
        self._finished_severity[record.request.cooldown_key] = severity_rank(record.request)
        self._finished_exclude[record.request.cooldown_key] = excluded_nodes(record.request)
