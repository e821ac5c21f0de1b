"""What the on-call sees first: each node's state and severity, problems before healthy nodes, counts.

Functions over the coordinator's :class:`~ftd.coordinator.model.state.ClusterState` and the
actions it knows (and two small caches, :class:`RecentActions` and :class:`LabelTotals`), so
``/v1/nodes?problems=1&sort=severity`` and ``/v1/summary`` cost the browser little at 10,000 nodes:
the server filters, sorts and pages; the page renders a few dozen rows and folds the healthy nodes
into counts. Only the problem nodes are looked at one by one (:meth:`NodeIndex.problems`).

A node's *state* is exclusive (a node is counted once): ``offline`` (its agent is gone), ``drained``
(by ftd), ``unavailable`` (drained or down by someone else, as the scheduler says), ``condition`` (an
active critical condition its agent reports), ``acting`` (an action of ftd is in flight on it or
awaits approval) or ``healthy``. Its *severity* orders the problems panel: ``critical`` (offline, or
an active condition), ``warning`` (drained by ftd, an action in flight), ``info`` (unavailable by
someone else), ``ok``. A *problem* is any node that is not ``ok``.

The action shown beside a node is the one awaiting approval on it (a human must act), else the one in
flight (pending or running), else the newest the ledger holds among its recent actions: a node action
targets the node; a job action (checkpoint_restart) belongs to the nodes it excludes and the nodes
its job ran on. A problem node's ``since`` is when its problem began
(:meth:`ClusterState.problem_since`, or its action in flight's creation if earlier), not its last
status change.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal

from ftd.coordinator.api.wire import (
    JobOut,
    MovedOut,
    NodeAction,
    NodeOut,
    NodesQuery,
    SummaryOut,
    action_out,
)
from ftd.coordinator.ledger.store import LedgerStore
from ftd.coordinator.model.checkpoints import LEVELS as CHECKPOINT_LEVELS
from ftd.coordinator.model.state import ClusterState
from ftd.plugin.actions import ActionRecord, ActionState

NodeState = Literal["offline", "drained", "unavailable", "condition", "acting", "healthy"]
NodeSeverity = Literal["critical", "warning", "info", "ok"]
JobState = Literal[
    "training", "saving", "restarting", "pending after requeue", "awaiting approval", "allocated"
]

NODE_STATES: tuple[NodeState, ...] = ("offline", "drained", "unavailable", "condition", "acting", "healthy")
SEVERITY_RANK: dict[str, int] = {"critical": 3, "warning": 2, "info": 1, "ok": 0}
IN_FLIGHT = frozenset({ActionState.PENDING, ActionState.RUNNING, ActionState.AWAITING_APPROVAL})


def node_state(state: ClusterState, name: str, acting: bool) -> NodeState:
    """The node's one state (see the module docstring), the most urgent that applies."""
    node = state.nodes[name]
    if not node.online:
        return "offline"
    if node.drained_by_ftd:
        return "drained"
    if name in state.unavailable:
        return "unavailable"
    if state.conditions.get(name):
        return "condition"
    return "acting" if acting else "healthy"


def node_severity(state: ClusterState, name: str, acting: bool) -> NodeSeverity:
    """How urgent the node is for the on-call (see the module docstring)."""
    node = state.nodes[name]
    if state.conditions.get(name) or (not node.online and not node.drained_by_ftd):
        return "critical"
    if node.drained_by_ftd or acting or not node.online:
        return "warning"
    if name in state.unavailable:
        return "info"
    return "ok"


def action_nodes(record: ActionRecord) -> set[str]:
    """The nodes an action is about: its target for a node action; for a job action, the nodes it
    excludes and the nodes its job ran on (``detail["nodes"]``)."""
    request = record.request
    nodes: set[str] = set()
    exclude = request.params.get("exclude")
    ran_on = record.detail.get("nodes")
    for group in (exclude, ran_on):
        if isinstance(group, list):
            nodes.update(n for n in group if isinstance(n, str))
    if not nodes or request.kind not in ("checkpoint_restart", "checkpoint"):
        nodes.add(request.target)
    return nodes


def actions_by_node(
    in_flight: Iterable[ActionRecord], recent: Sequence[ActionRecord]
) -> dict[str, ActionRecord]:
    """Node -> the action to show beside it: one awaiting approval, then one pending or running (each
    newest first), before the newest of ``recent`` (newest first, as the ledger lists them)."""
    out: dict[str, ActionRecord] = {}
    flying = sorted(
        in_flight, key=lambda r: (r.state == ActionState.AWAITING_APPROVAL, r.created), reverse=True
    )
    for record in (*flying, *recent):
        for node in action_nodes(record):
            out.setdefault(node, record)
    return out


def acting_nodes(by_node: Mapping[str, ActionRecord]) -> set[str]:
    return {node for node, record in by_node.items() if record.state in IN_FLIGHT}


def matches(query: str, name: str, texts: Iterable[str]) -> bool:
    """Case-insensitive substring search over the node's name and what is said about it."""
    q = query.lower()
    return q in name.lower() or any(q in t.lower() for t in texts)


def job_state(has_ranks: bool, action: ActionRecord | None) -> JobState:
    """What a job is doing, from its ranks and the checkpoint_restart in flight for it, if any."""
    if action is not None and action.state in IN_FLIGHT:
        if action.state == ActionState.AWAITING_APPROVAL:
            return "awaiting approval"
        done = action.detail.get("phases_done") or []
        if action.detail.get("path") in ("in_place", "spare"):  # inside its allocation (ftd run)
            return "restarting"
        if "requeue" in done or action.detail.get("waiting"):
            return "pending after requeue"
        if "stop" in done or action.detail.get("stopped") is not None:
            return "restarting"
        return "saving"
    return "training" if has_ranks else "allocated"


def action_why(record: ActionRecord) -> str:
    """One line on why an action stands where it does: the gate's verdict, the error, what an
    escalated restart saw; empty when it simply went as planned."""
    detail = record.detail
    for key in ("policy", "error", "not_resumed", "waiting"):
        value = detail.get(key)
        if isinstance(value, str) and value:
            return value
    pinned = detail.get("pinned")  # a pinned job held, stopped or waiting (and its release)
    if isinstance(pinned, dict):
        released = pinned.get("released")
        if isinstance(released, dict) and isinstance(released.get("why"), str):
            return str(released["why"])
        if isinstance(pinned.get("why"), str) and pinned["why"]:
            return str(pinned["why"])
    refused = detail.get("exclude_refused")
    if isinstance(refused, dict) and isinstance(refused.get("why"), str):
        return str(refused["why"])
    if detail.get("save_missing"):
        return f"no save from rank(s) {detail['save_missing']}"
    return ""


def node_action(record: ActionRecord) -> NodeAction:
    req = record.request
    return NodeAction(
        id=record.id,
        kind=req.kind,
        target=req.target,
        state=record.state,
        reason=req.reason,
        rule=req.rule,
        updated=record.updated,
        why=action_why(record),
    )


class NodeIndex:
    """One request's look at the cluster: each node's state and severity, its jobs and its action."""

    def __init__(
        self,
        state: ClusterState,
        labels: Mapping[str, Mapping[str, str]],
        in_flight: Iterable[ActionRecord],
        recent: Sequence[ActionRecord],
    ) -> None:
        self.state = state
        self.labels = labels
        self.by_node = actions_by_node(in_flight, recent)
        self.acting = acting_nodes(self.by_node)
        self.jobs: dict[str, list[str]] = {}
        for job in state.jobs.values():
            for node in {*job.ranks_by_node, *job.allocations}:
                self.jobs.setdefault(node, []).append(job.id)

    def node_state(self, name: str) -> NodeState:
        return node_state(self.state, name, name in self.acting)

    def severity(self, name: str) -> NodeSeverity:
        return node_severity(self.state, name, name in self.acting)

    def problems(self) -> set[str]:
        """The nodes that are not healthy (severity not ``ok``), without looking at each node's
        every field: the offline and drained ones, and those the scheduler, a condition or an
        action names."""
        nodes = self.state.nodes
        out = {name for name, node in nodes.items() if not node.online or node.drained_by_ftd}
        for named in (self.state.unavailable, self.state.conditions, self.acting):
            out.update(n for n in named if n in nodes)
        return out

    def texts(self, name: str) -> list[str]:
        node = self.state.nodes[name]
        out = [*self.labels.get(name, {}).values(), *self.jobs.get(name, ())]
        out += self.state.conditions.get(name, ())
        out += [node.drain_reason, self.state.unavailable.get(name, "")]
        action = self.by_node.get(name)
        if action is not None:
            out += [action.request.kind, action.request.reason, str(action.state)]
        return out

    def select(self, query: NodesQuery) -> tuple[int, list[NodeOut]]:
        """The nodes the query asks for, sorted and paged: (how many matched, the page)."""
        problems = self.problems()
        names: Iterable[str] = self.state.nodes
        if query.problems or (query.state is not None and query.state != "healthy"):
            names = problems
        if query.state == "healthy":
            names = [n for n in names if n not in problems]
        elif query.state is not None:
            names = [n for n in names if self.node_state(n) == query.state]
        if query.q:
            q = query.q
            names = [n for n in names if matches(q, n, self.texts(n))]
        nodes = self.state.nodes
        if query.sort == "severity":
            rank = {n: SEVERITY_RANK[self.severity(n)] for n in problems}  # the others are ok (0)
            ordered = sorted(names, key=lambda n: (-rank.get(n, 0), -nodes[n].last_change, n))
        elif query.sort == "last_change":
            ordered = sorted(names, key=lambda n: (-nodes[n].last_change, n))
        else:
            ordered = sorted(names)
        end = None if query.limit is None else query.offset + query.limit
        return len(ordered), [self.node_out(n) for n in ordered[query.offset : end]]

    def since(self, name: str) -> float | None:
        """When the node's problem began: its state's problems, or its action in flight's creation."""
        times = [t for t in (self.state.problem_since(name),) if t is not None]
        action = self.by_node.get(name)
        if action is not None and action.state in IN_FLIGHT and action.created:
            times.append(action.created)
        return min(times) if times else None

    def drift(self, name: str) -> list[str]:
        report = self.state.inventory.report(name)
        return [d.text() for d in report.drift] if report is not None else []

    def node_out(self, name: str) -> NodeOut:
        node = self.state.nodes[name]
        action = self.by_node.get(name)
        return NodeOut(
            name=name,
            online=node.online,
            drained=node.drained_by_ftd,
            drain_reason=node.drain_reason,
            last_change=node.last_change,
            jobs=sorted(self.jobs.get(name, ())),
            unavailable=self.state.unavailable.get(name),
            conditions=self.state.conditions.get(name, []),
            state=self.node_state(name),
            severity=self.severity(name),
            labels=dict(self.labels.get(name, {})),
            action=node_action(action) if action is not None else None,
            since=self.since(name),
            drift=self.drift(name),
        )


def job_actions(in_flight: Iterable[ActionRecord]) -> dict[str, ActionRecord]:
    """Job -> its job action in flight (checkpoint_restart, checkpoint), the newest if several."""
    out: dict[str, ActionRecord] = {}
    for record in sorted(in_flight, key=lambda r: r.created):
        if record.request.kind in ("checkpoint_restart", "checkpoint"):
            out[record.request.target] = record
    return out


def moved_out(state: ClusterState, job: str) -> MovedOut | None:
    """What a job ftd requeued and that does not train again yet says (issue #32), or None."""
    moved = state.moved.get(job)
    if moved is None:
        return None
    return MovedOut(
        since=moved.since,
        excluding=list(moved.excluding),
        action=moved.action,
        scheduler_state=moved.scheduler_state,
        scheduler_reason=moved.scheduler_reason,
        why=moved.why(),
    )


def jobs_out(state: ClusterState, in_flight: Iterable[ActionRecord]) -> list[JobOut]:
    acting = job_actions(in_flight)
    out: list[JobOut] = []
    for j in sorted(state.jobs.values(), key=lambda j: j.id):
        action = acting.get(j.id)
        moved = None if j.ranks_by_node else moved_out(state, j.id)
        shown = job_state(bool(j.ranks_by_node), action)
        if moved is not None and shown == "allocated":  # an allocation left from before the requeue
            shown = "pending after requeue"
        out.append(
            JobOut(
                id=j.id,
                nodes=j.nodes,
                ranks=sorted(j.ranks),
                last_step=j.last_step,
                ranks_by_node={n: sorted(r.rank for r in ranks) for n, ranks in j.ranks_by_node.items()},
                allocations=dict(sorted(j.allocations.items())),
                state=shown,
                action=action.id if action is not None and action.state in IN_FLIGHT else None,
                supervisors=dict(sorted(j.supervisors.items())),
                spares=j.spares,
                slots=j.slots,
                generation=j.generation,
                checkpoints=checkpoints_of(state, j.id),
                quarantined=dict(state.checkpoints.quarantined(j.id)),
                moved=moved,
                save_times={lvl: s.as_dict() for lvl, s in state.save_times.stats(j.id).items()},
            )
        )
    # a job ftd requeued has no ranks until it trains again: still shown while its action follows it,
    # and after, while it waits in the scheduler's queue (state.moved, until it trains again)
    waiting: dict[str, ActionRecord | None] = {
        job: action for job, action in acting.items() if action.state in IN_FLIGHT
    }
    for moved_job in state.moved:
        waiting.setdefault(moved_job.job, None)
    for job, flying in sorted(waiting.items()):
        if job in state.jobs:
            continue
        out.append(
            JobOut(
                id=job,
                nodes=[],
                ranks=[],
                last_step=None,
                ranks_by_node={},
                state=job_state(False, flying) if flying is not None else "pending after requeue",
                action=flying.id if flying is not None else None,
                checkpoints=checkpoints_of(state, job),
                moved=moved_out(state, job),
                save_times={lvl: s.as_dict() for lvl, s in state.save_times.stats(job).items()},
            )
        )
    return out


def checkpoints_of(state: ClusterState, job: str) -> dict[str, dict[str, float]]:
    """level -> {"step", "verified_at"} of the job's newest checkpoint verified on every rank."""
    out: dict[str, dict[str, float]] = {}
    for level in CHECKPOINT_LEVELS:
        newest = state.checkpoints.newest_verified(job, level)
        if newest is not None:
            out[level] = {"step": newest[0], "verified_at": newest[1]}
    return out


def summary(
    index: NodeIndex,
    in_flight: Sequence[ActionRecord],
    stuck_after_s: Callable[[str], float],
    label_totals: Mapping[str, Mapping[str, int]],
) -> SummaryOut:
    """The first screen's counts; ``stuck_after_s(kind)``: how long an action of that kind may run;
    ``label_totals``: label -> value -> known nodes (:class:`LabelTotals`). Only the problem nodes
    are looked at one by one: every other node is healthy."""
    by_state: dict[str, int] = dict.fromkeys(NODE_STATES, 0)
    unhealthy: dict[str, dict[str, dict[str, int]]] = {}
    problems = index.problems()
    for name in problems:
        node_state_ = index.node_state(name)
        by_state[node_state_] += 1
        for label, value in index.labels.get(name, {}).items():
            counts = unhealthy.setdefault(label, {}).setdefault(value, {})
            counts[node_state_] = counts.get(node_state_, 0) + 1
    by_state["healthy"] = len(index.state.nodes) - len(problems)
    by_label: dict[str, dict[str, dict[str, int]]] = {}
    for label, values in label_totals.items():
        for value, total in values.items():
            counts = dict(unhealthy.get(label, {}).get(value, {}))
            healthy = total - sum(counts.values())
            by_label.setdefault(label, {})[value] = {"healthy": healthy, **counts} if healthy else counts
    jobs: dict[str, int] = {}
    for job in jobs_out(index.state, in_flight):
        jobs[job.state] = jobs.get(job.state, 0) + 1
    flying = sorted(in_flight, key=lambda r: r.created, reverse=True)[:MAX_IN_FLIGHT]
    return SummaryOut(
        nodes=len(index.state.nodes),
        problems=len(problems),
        by_state=by_state,
        by_label=by_label,
        jobs=jobs,
        in_flight=[action_out(r) for r in flying],
        deadlines={r.id: r.created + stuck_after_s(r.request.kind) for r in flying if r.created},
    )


class LabelTotals:
    """label -> value -> how many known nodes carry it; counted again only when nodes were added
    (the state never forgets a node), so ``/v1/summary`` does not walk 10,000 labels each time."""

    def __init__(self, labels: Mapping[str, Mapping[str, str]]) -> None:
        self.labels = labels
        self._known = -1
        self._totals: dict[str, dict[str, int]] = {}

    def totals(self, state: ClusterState) -> Mapping[str, Mapping[str, int]]:
        if len(state.nodes) != self._known:
            totals: dict[str, dict[str, int]] = {}
            for node, labels in self.labels.items():
                if node in state.nodes:
                    for label, value in labels.items():
                        values = totals.setdefault(label, {})
                        values[value] = values.get(value, 0) + 1
            self._totals, self._known = totals, len(state.nodes)
        return self._totals


MAX_IN_FLIGHT = 200  # the summary's in-flight list (the count is in the metrics)


class RecentActions:
    """The ledger's newest actions (the node's "last action"), read again only after the engine
    reported an action's change or ``max_age_s`` passed (records written around the engine), so a
    dashboard polling every 2 s does not decode hundreds of ledger rows per query."""

    def __init__(self, ledger: LedgerStore, limit: int, max_age_s: float = 2.0) -> None:
        self.ledger = ledger
        self.limit = limit
        self.max_age_s = max_age_s
        self._records: list[ActionRecord] | None = None
        self._read_at = 0.0

    def observe(self, what: str, payload: object) -> None:
        """An engine observer: any action's change makes the next read go to the ledger."""
        if what == "action":
            self._records = None

    async def get(self) -> list[ActionRecord]:
        now = time.monotonic()
        if self._records is None or now - self._read_at > self.max_age_s:
            self._records = await self.ledger.actions(limit=self.limit)
            self._read_at = now
        return self._records
