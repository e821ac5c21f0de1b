"""The API's wire types: what requests may carry and what responses look like.

msgspec Structs validate every path parameter, query and body (a problem is a 400 naming the field)
and shape every answer; the OpenAPI document (:mod:`ftd.coordinator.api.routes`) is generated from the
same types, so it cannot drift from the code.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

import msgspec

from ftd.events import JobAllocation, SupervisorInfo
from ftd.logs import get_logger
from ftd.plugin.actions import ActionRecord, ActionState

log = get_logger(__name__)
T = TypeVar("T")

MAX_BODY = 64 * 1024
MAX_LIMIT = 1000

# --------------------------------------------------------------------------------------------------
# Input types (validated with msgspec; the OpenAPI schemas are generated from them)

_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
NodeName = Annotated[str, msgspec.Meta(pattern=_NAME_RE, description="A node name.")]
JobId = Annotated[str, msgspec.Meta(pattern=_NAME_RE, description="A job id.")]
ActionId = Annotated[str, msgspec.Meta(min_length=1, max_length=200, description="An action id.")]
PlanId = Annotated[str, msgspec.Meta(min_length=1, max_length=200, description="A plan id.")]
Operator = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$",
        description="Who asks (recorded as the action's rule, api:<by>).",
    ),
]
Reason = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=200,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="Why (one line; shown in the scheduler's drain reason and the ledger).",
    ),
]
Limit = Annotated[int, msgspec.Meta(ge=1, le=MAX_LIMIT, description="How many, newest first.")]


Force = Annotated[
    bool,
    msgspec.Meta(
        description="Step past ftd's cooldown for this target (dedupe and drain budgets still apply); "
        "needs force_reason."
    ),
]
ForceReason = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=200,
        pattern=r"^[^\x00-\x1f\x7f]*[^\x00-\x1f\x7f\s][^\x00-\x1f\x7f]*$",
        description="Why the cooldown is overridden (one line; recorded in the ledger with the action).",
    ),
]


class ManualRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What every manual action accepts: who asks, and ``force`` with its audit reason."""

    by: Operator = "operator"
    force: Force = False
    force_reason: ForceReason | None = None

    def force_params(self) -> dict[str, Any]:
        """``params`` that carry the force into the ledger; ValueError (a 400) without a reason."""
        if not self.force:
            return {}
        if self.force_reason is None:
            raise ValueError("force needs force_reason: say why the cooldown is overridden (it is recorded)")
        return {"force": True, "force_reason": self.force_reason}


class BisectRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Start a bisection (issue #35): ``suspects`` tested first; ``nodes`` (default: every idle one)."""

    suspects: Annotated[list[NodeName], msgspec.Meta(max_length=1024)] = msgspec.field(default_factory=list)
    nodes: Annotated[list[NodeName], msgspec.Meta(max_length=100_000)] | None = None


class DrainRequest(ManualRequest, frozen=True, kw_only=True, forbid_unknown_fields=True):
    reason: Reason


class ResumeRequest(ManualRequest, frozen=True, kw_only=True, forbid_unknown_fields=True):
    reason: Reason = "manual resume"


class BurnInRequest(ManualRequest, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Run a node's burn-in (issue #36): a drained or new node; its agent refuses while a job runs."""

    reason: Reason = "manual burn-in"


class RestartRequest(ManualRequest, frozen=True, kw_only=True, forbid_unknown_fields=True):
    reason: Reason
    exclude: Annotated[
        list[NodeName], msgspec.Meta(max_length=64, description="Nodes the restarted job must avoid.")
    ] = msgspec.field(default_factory=list)


class InterruptionRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An operator's announcement of an interruption (issue #37): a node (every job on it) or a job,
    and when the work is killed: ``deadline`` (epoch seconds) or ``in_s`` (seconds from now)."""

    node: NodeName | None = None
    job: JobId | None = None
    deadline: float | None = None
    in_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    reason: Reason = "announced by an operator"
    by: Operator = "operator"


class InterruptionOut(msgspec.Struct, frozen=True, kw_only=True):
    """The announcement as fed to the rules: its event, deadline, and the actions it caused."""

    event_id: str
    node: str
    job: str
    deadline: float
    ref: str
    actions: list[ActionOut]


class ApproveRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    by: Operator = "operator"


class RejectRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    reason: Reason = "rejected by operator"
    by: Operator = "operator"


class EventsQuery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    limit: Limit = 100
    node: NodeName | None = None


class ActionsQuery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    limit: Limit = 100


NodeSort = Literal["name", "severity", "last_change"]
NodeStateName = Literal["offline", "drained", "unavailable", "condition", "acting", "healthy"]


class NodesQuery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``/v1/nodes`` filtered, sorted and paged on the server (the dashboard at 10,000 nodes)."""

    problems: Annotated[
        bool,
        msgspec.Meta(
            description="Only nodes that need a look: offline, drained, unavailable, "
            "with an active condition or an action in flight."
        ),
    ] = False
    state: Annotated[NodeStateName, msgspec.Meta(description="Only nodes in this state.")] | None = None
    q: (
        Annotated[
            str,
            msgspec.Meta(
                max_length=128,
                description="Case-insensitive substring of the name, a label, "
                "a job, a condition, the drain reason or the action's reason.",
            ),
        ]
        | None
    ) = None
    sort: Annotated[
        NodeSort, msgspec.Meta(description="severity: most urgent first, then the newest change.")
    ] = "name"
    limit: Annotated[int, msgspec.Meta(ge=1, le=100_000, description="At most this many.")] | None = None
    offset: Annotated[int, msgspec.Meta(ge=0, le=100_000, description="Skip this many first.")] = 0


# --------------------------------------------------------------------------------------------------
# Output types


class Error(msgspec.Struct, frozen=True, kw_only=True):
    error: str


class Health(msgspec.Struct, frozen=True, kw_only=True):
    status: Literal["ok"]
    version: str
    bus_connected: bool
    uptime_s: float
    actions_in_progress: int


class NodeOut(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    online: bool
    drained: bool  # drained by ftd
    drain_reason: str
    last_change: float
    jobs: list[str]
    # drained or down by someone else, as the scheduler says (upkeep.reconcile); not ftd's budget
    unavailable: str | None = None
    # the node's active critical conditions as its agent sees them (what `ftd health` reports there)
    conditions: list[str] = msgspec.field(default_factory=list)
    state: str = "healthy"  # exclusive: offline | drained | unavailable | condition | acting | healthy
    severity: str = "ok"  # critical | warning | info | ok (ftd.coordinator.api.views)
    labels: dict[str, str] = msgspec.field(default_factory=dict)  # coordinator.node_labels (rack, ...)
    # the action in flight on the node, else the newest the ledger recently holds for it
    action: NodeAction | None = None
    # when the node's problem began (the earliest of: offline, drained, unavailable, a condition, its
    # action in flight), seconds since the epoch; None for a healthy node
    since: float | None = None
    # its version drift against its hardware profile's peers and minimums, one reason per field (#36)
    drift: list[str] = msgspec.field(default_factory=list)


class NodeAction(msgspec.Struct, frozen=True, kw_only=True):
    """The action shown beside a node: what ftd does or did there, and why."""

    id: str
    kind: str
    target: str
    state: ActionState
    reason: str
    rule: str
    updated: float
    why: str = ""  # the policy's verdict, the error or the escalation, when there is one


class SummaryOut(msgspec.Struct, frozen=True, kw_only=True):
    """Counts for the first screen: nodes by exclusive state, by label value and state, problems,
    jobs by state, actions in flight and held for approval."""

    nodes: int
    problems: int
    by_state: dict[str, int]
    by_label: dict[str, dict[str, dict[str, int]]]  # label -> value -> state -> count
    jobs: dict[str, int]  # job state -> count
    in_flight: list[ActionOut]  # running, pending or awaiting approval, newest first
    # action id (of in_flight) -> wall-clock time past which it counts as stuck (model.deadlines)
    deadlines: dict[str, float] = msgspec.field(default_factory=dict)


class PlanStepOut(msgspec.Struct, frozen=True, kw_only=True):
    action: str
    kind: str
    target: str
    state: str | None  # the step's action's state (None: its row is missing)


class PlanOut(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    event_id: str | None
    state: str
    steps: list[PlanStepOut]


class RuleOut(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    source: str  # builtin | entry_point | rule_dir | declarative | extra (ftd.coordinator.decide.plugins)
    origin: str  # module, distribution, rule file or rules file
    hooks: list[str]


class RulesOut(msgspec.Struct, frozen=True, kw_only=True):
    rules: list[RuleOut]
    disabled: list[str]  # coordinator.disabled_rules: blocked, not loaded


class JobOut(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    nodes: list[str]
    ranks: list[int]
    last_step: int | None
    ranks_by_node: dict[str, list[int]]
    # node -> what the scheduler's Prolog reported (user, GPUs, ...); a job without the client has
    # only these (ftd.agent.jobs)
    allocations: dict[str, JobAllocation] = msgspec.field(default_factory=dict)
    # training | saving | restarting | pending after requeue | awaiting approval | allocated (no ranks)
    state: str = "training"
    action: str | None = None  # the id of the action in flight for the job, if any
    # A job run by rank supervisors (``ftd run``, issue #24): each node's supervisor (role, slot,
    # generation, state, preflight), its hot spares, the node of each training slot and the newest
    # generation; empty / None for a job without them.
    supervisors: dict[str, SupervisorInfo] = msgspec.field(default_factory=dict)
    spares: list[str] = msgspec.field(default_factory=list)
    slots: list[str | None] = msgspec.field(default_factory=list)
    generation: int | None = None
    # Issue #34: per level, the newest checkpoint verified on every rank ({"step", "verified_at"}),
    # and the steps quarantined with why; empty for a job that does not report its checkpoints.
    checkpoints: dict[str, dict[str, float]] = msgspec.field(default_factory=dict)
    quarantined: dict[str, str] = msgspec.field(default_factory=dict)
    # Issue #32: a job ftd requeued that does not train again yet (state "pending after requeue"):
    # since when, the nodes excluded, the action that moved it and what the scheduler says; None
    # for every other job.
    moved: MovedOut | None = None
    # Issue #37: how long the job's saves took, per level (count, p50_s, p95_s of the last saves);
    # empty until ftd saw one of its saves complete.
    save_times: dict[str, dict[str, float | int]] = msgspec.field(default_factory=dict)


class MovedOut(msgspec.Struct, frozen=True, kw_only=True):
    since: float  # when ftd requeued it
    excluding: list[str]  # the nodes the requeue excluded ([]: requeued in place)
    action: str  # the checkpoint_restart that moved it
    scheduler_state: str  # what the scheduler last said ("" before the reconciler asked it)
    scheduler_reason: str  # why it is pending, as the scheduler says
    why: str  # one sentence: "pending after requeue, excluding node-3 (action ..., since ...)"


class ActionOut(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    kind: str
    target: str
    state: ActionState
    reason: str
    rule: str
    params: dict[str, Any]
    event_id: str | None
    detail: dict[str, Any]
    created: float
    updated: float
    #: While a save runs: the ranks that acknowledged it so far (the ledger has them only once the
    #: save phase ends); null otherwise.
    acked: int | None = None


def action_out(record: ActionRecord, acked: int | None = None) -> ActionOut:
    req = record.request
    return ActionOut(
        acked=acked,
        id=record.id,
        kind=req.kind,
        target=req.target,
        state=record.state,
        reason=req.reason,
        rule=req.rule,
        params=req.params,
        event_id=req.event_id,
        detail=record.detail,
        created=record.created,
        updated=record.updated,
    )


# --------------------------------------------------------------------------------------------------
