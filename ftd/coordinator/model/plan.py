"""Sequenced remediation: the actions the rules ask for on one event run as one *plan*, in order.

Why: rules return what should happen, e.g. ``[checkpoint_restart(job, exclude=node), gpu_reset(node)]``.
Run side by side, the reset reaches the node while the job still holds the GPU (the agent rightly
refuses it), and on Kubernetes the drain's evictions race the save handshake. The order an incident
needs is always the same::

    save -> ack -> stop   (checkpoint_restart / checkpoint: the job's "stop" phase)
         -> reset / drain (gpu_reset's "reset" phase, drain_node)
         -> requeue       (checkpoint_restart's "requeue" phase)

The design chosen here: **phased executors plus ordering by role**, not one monolithic plan
executor and not a separate requeue action. A plan executor would have to re-implement every
executor's work (and a plugin's own executors could not take part); a separate requeue action would
split one checkpoint_restart into two ledger rows and two policy keys that rules, the API and
operators would have to correlate, and every plugin executor of checkpoint_restart would have to
learn a new kind. Phases keep the rule contract as it was; an executor without phases still works
(it runs as one step, in order).

* An executor may split its work into named phases (:class:`PhasedExecutor`: ``phases`` and
  ``run_phase(record, phase)``). ``checkpoint_restart`` has ``("stop", "requeue", "restart",
  "resume")`` (the third starts a new generation inside the allocation of a job run by rank
  supervisors, ``ftd run``; the last follows a job restarted in place until it trains again;
  ``checkpoint`` uses the same executor: its "stop" phase only saves, its other phases do nothing);
  ``gpu_reset`` has ``("reset", "verify")`` (the reset with its retries and, when it cannot be done,
  the reboot request or the drain; then the wait for the rebooted node); ``drain_node`` has
  ``("drain", "evict")``: the node stops taking work at once (Slurm's drain never touches running
  jobs; Kubernetes cordons and taints), and only the eviction (Kubernetes) waits for the save. A node
  executor names its ``disruptive_phase`` (waits for the jobs' stop) and ``settled_phase`` (the
  requeue waits for it), :func:`node_phases`. A plain executor is one phase. The action stays
  *one* record (one ledger row, one policy key), so the rules' contract, dedupe, cooldown and the
  API are unchanged; the engine runs the phases in order, records ``detail["phases_done"]`` after
  each, and a resumed action skips the phases already done.
* Each request of a plan gets a *role* from its kind (:func:`role_of`): ``job`` (checkpoint_restart,
  checkpoint), ``node`` (gpu_reset, drain_node: they disrupt whatever runs on the node) or ``free``
  (notify, collect_diagnostics, a plugin's own kinds: they start at once, as before; diagnostics in
  particular must run while the ranks are still alive). Dependencies (:func:`build`): every node
  step's disruptive phase waits for the first phase of every job step; every job step's second
  phase (the requeue) waits for the settled phase of every node step. So the reset never meets the
  job's processes, an eviction never races the save, and the job is requeued only once its node was
  reset, drained or handed to the scheduler for a reboot; with no node step, checkpoint_restart runs
  straight through as it always did.
* A dependency is about *order*, never success: a failed save does not stop the drain of a bad node
  (the node must go), a failed reset does not keep the job from being requeued (it must move); each
  record says how its own part went. A step the policy gate did not start (suppressed, dry run,
  awaiting approval) is not waited for; a job step suppressed as a duplicate of an action already
  running for that job is replaced by that running action (the reset still waits for *that* stop,
  and that action's requeue, if it has not begun, waits for this event's node steps; this late
  dependency lives in memory only, not in the ledger's plan).

Params a rule may set that the executors honour (see :mod:`ftd.plugin.actions`): checkpoint_restart
``exclude`` (nodes), ``stop`` (false: save only), ``delay_s`` (crash-loop backoff before the
requeue); gpu_reset ``pci``/``uuid``/``index``. The plan
itself is recorded in the ledger's ``plans`` table (steps, dependencies; each step's state is its
action's row) and rebuilt from it by :meth:`Engine.resume_unfinished` after a restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import msgspec

from ftd.plugin.actions import ActionKind, ActionRecord

Role = Literal["job", "node", "free"]

JOB_KINDS = frozenset({ActionKind.CHECKPOINT_RESTART, ActionKind.CHECKPOINT})
NODE_KINDS = frozenset({ActionKind.GPU_RESET, ActionKind.DRAIN_NODE})


def role_of(kind: str) -> Role:
    if kind in JOB_KINDS:
        return "job"
    if kind in NODE_KINDS:
        return "node"
    return "free"


@runtime_checkable
class PhasedExecutor(Protocol):
    """An executor whose work has named phases the engine may run apart (see the module docstring).

    ``run_phase`` returns the detail of that phase (merged into the record's detail before the next
    phase runs, so a later phase reads what an earlier one found in ``record.detail``); a ``state``
    in it (``escalated``, ``failed``) marks the whole action, the worst one wins. Calling the
    executor itself runs every phase, for callers that know nothing of plans."""

    phases: tuple[str, ...]

    async def run_phase(self, record: ActionRecord, phase: str) -> dict[str, Any]: ...


def phases_of(executor: object) -> tuple[str, ...] | None:
    """The executor's phases, or None for a plain (one-step) executor."""
    if isinstance(executor, PhasedExecutor) and executor.phases:
        return tuple(executor.phases)
    return None


class Dependency(msgspec.Struct, frozen=True, array_like=True):
    """Phase ``phase`` (an index) of action ``action`` must be over before this step's phase runs."""

    action: str
    phase: int


class Step(msgspec.Struct, kw_only=True):
    action: str
    kind: str
    target: str
    role: str
    # phase index of *this* step -> what must be over before it starts
    after: dict[int, list[Dependency]] = msgspec.field(default_factory=dict)


class Plan(msgspec.Struct, kw_only=True):
    id: str
    event_id: str | None
    steps: list[Step]
    state: str = "running"  # running | finished
    created: float = 0.0
    updated: float = 0.0

    def step(self, action_id: str) -> Step | None:
        return next((s for s in self.steps if s.action == action_id), None)


def node_phases(executor: object) -> tuple[int, int]:
    """(disruptive, settled) phase indexes of a node action's executor: the first phase that touches
    what runs on the node (it waits for the jobs' stop), and the phase after which the node is
    settled (reset, drained, handed over for a reboot: the jobs' requeue waits for it). Executors say
    so with ``disruptive_phase`` / ``settled_phase`` attributes; a plain one is (0, 0)."""
    disruptive = getattr(executor, "disruptive_phase", 0)
    settled = getattr(executor, "settled_phase", 0)
    return (disruptive if isinstance(disruptive, int) else 0, settled if isinstance(settled, int) else 0)


def build(
    plan_id: str,
    event_id: str | None,
    records: Sequence[ActionRecord],
    *,
    running_jobs: Iterable[ActionRecord] = (),
    phases: Callable[[str], tuple[int, int]] = lambda kind: (0, 0),
) -> Plan:
    """The plan of one event's records (see the module docstring for the dependencies).

    ``records`` are the records the gate let start (pending); ``running_jobs`` are job actions
    already running for jobs this event's job steps were suppressed for (duplicates): node steps wait
    for them too. ``phases(kind)`` is :func:`node_phases` of that kind's executor."""
    steps = [
        Step(action=r.id, kind=r.request.kind, target=r.request.target, role=role_of(r.request.kind))
        for r in records
    ]
    job_ids = [s.action for s in steps if s.role == "job"] + [r.id for r in running_jobs]
    node_deps = [Dependency(s.action, phases(s.kind)[1]) for s in steps if s.role == "node"]
    for s in steps:
        if s.role == "node" and job_ids:
            s.after[phases(s.kind)[0]] = [Dependency(a, 0) for a in job_ids]
        elif s.role == "job" and node_deps:
            s.after[1] = list(node_deps)
    return Plan(id=plan_id, event_id=event_id, steps=steps)


def worth_a_plan(plan: Plan) -> bool:
    """A plan orders something only when it has a dependency; otherwise it is not recorded."""
    return any(s.after for s in plan.steps)


@dataclass
class Progress:
    """How far one running action got: one event per phase, set when that phase is over."""

    phases: int
    done: list[asyncio.Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.done = [asyncio.Event() for _ in range(max(self.phases, 1))]

    def reached(self, phase: int) -> None:
        for event in self.done[: phase + 1]:
            event.set()

    def finish(self) -> None:
        self.reached(len(self.done) - 1)

    async def wait(self, phase: int) -> None:
        await self.done[min(phase, len(self.done) - 1)].wait()


def merge_state(current: str | None, new: str | None) -> str | None:
    """The worse of two phase outcomes (failed > escalated > succeeded/None)."""
    order = {None: 0, "succeeded": 0, "escalated": 1, "failed": 2}
    return new if order.get(new, 0) > order.get(current, 0) else current


plan_encoder = msgspec.json.Encoder()
plan_decoder = msgspec.json.Decoder(Plan)
