"""The scheduler seam: what the coordinator's actions need from a batch scheduler, and a fake.

The drain/resume and checkpoint-restart actions (docs/architecture.md §6) talk to the scheduler only through
the :class:`Scheduler` protocol, so the same action code drives Slurm (:mod:`ftd.coordinator.actions.slurm`),
Kubernetes (:mod:`ftd.coordinator.actions.kubernetes`), or :class:`FakeScheduler` in unit tests and the demo.
One contract suite (``tests/contract/test_scheduler_contract.py``) runs against the fake and the real Slurm,
so the fake cannot drift from what Slurm really does.

Semantics every implementation keeps (the coordinator retries after a crash, so all are idempotent):

* ``drain(node, reason)``: the node takes no new work; running work is left alone. The stored reason is
  :func:`sanitize_reason` of the given one (``"ftd: "`` prefix, one line, bounded), so an operator (and
  ``resume_node``, which resumes only what ftd drained) can tell ftd's drains from others. Draining a
  drained node replaces the reason.
* ``resume(node)``: undo a drain. Resuming a node that is not drained is a no-op.
* ``requeue(job, exclude)``: make the job pending again (Restarts + 1) with ``exclude`` added to its
  excluded nodes, whether it is running or already finished (the coordinator stops the trainers first,
  so the batch job may have just exited). A job that is already pending only gets the exclusion (a
  retried requeue does not count a second restart).
* Unknown nodes and jobs, and refusals by the scheduler, raise :class:`SchedulerError`.
* ``list_nodes()``: every node the scheduler knows, as :class:`NodeInfo` (state, drained, down,
  reason), sorted by name; the coordinator's reconciliation (:mod:`ftd.coordinator.upkeep.reconcile`)
  compares it with the drains ftd recorded (ftd's own carry the ``ftd:`` reason prefix).
* ``reboot(node, reason, nextstate)``: reboot the node once it is idle (it takes no new work until
  then, like a drain, with the sanitized reason), then return it to service (``nextstate="RESUME"``)
  or leave it down (``"DOWN"``). The GPU reset's escalation (:mod:`ftd.coordinator.actions.gpu_reset`)
  uses it. A scheduler that cannot reboot nodes raises :class:`SchedulerError` saying so.
* ``requeue_held(job)`` / ``release(job)`` (:class:`JobHolder`, optional: a scheduler that has them
  says ``holds_jobs = True``; Slurm does, Kubernetes does not): make the job pending again
  (Restarts + 1) *held*, so it does not start until ``release``; a retry on a job already pending only
  holds it. ``release`` of a job that is not held is a no-op. ``job_info(job).held`` tells.
  The pinned-job hold (:mod:`ftd.coordinator.actions.pinned`) uses them.
* ``job_nodes(job)``: the nodes the job's processes run on *now* (empty when it is pending, finished,
  unknown or not a valid job id of this scheduler); :class:`SchedulerError` only when the scheduler
  cannot answer. The coordinator's placement check (:mod:`ftd.coordinator.intake.placement`) trusts a
  node's word about a job's ranks only when this names the node.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

REASON_PREFIX = "ftd: "
REBOOT_NEXTSTATES = frozenset({"RESUME", "DOWN"})
MAX_REASON_LEN = 200

_UNSAFE_RE = re.compile(r"[\x00-\x1f\x7f\"\\]+")


class SchedulerError(RuntimeError):
    """A scheduler command failed; the message names the command, its exit status and its stderr."""

    def __init__(
        self,
        message: str,
        *,
        command: Sequence[str] = (),
        returncode: int | None = None,
        stderr: str = "",
    ) -> None:
        self.command = tuple(command)
        self.returncode = returncode
        self.stderr = stderr.strip()
        parts = [message]
        if self.command:
            parts.append(f"command: {' '.join(self.command)}")
        if returncode is not None:
            parts.append(f"exit status {returncode}")
        if self.stderr:
            parts.append(f"stderr: {self.stderr}")
        super().__init__("; ".join(parts))


def sanitize_reason(reason: str) -> str:
    """One printable line, no double quotes or backslashes, ``ftd: `` prefix, at most 200 chars.

    Slurm stores the reason verbatim but its own parsers and ``sinfo -R`` choke on quotes and
    newlines; an event's text (a kernel line, a log line) must never be able to smuggle them in.
    """
    text = _UNSAFE_RE.sub(" ", reason.replace('"', "'"))
    text = " ".join(text.split())
    if not text.startswith(REASON_PREFIX.strip()):
        text = REASON_PREFIX + text if text else REASON_PREFIX.strip()
    if len(text) > MAX_REASON_LEN:
        text = text[: MAX_REASON_LEN - 3].rstrip() + "..."
    return text


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    state: str  # the scheduler's own spelling, e.g. "IDLE+DRAIN"
    flags: tuple[str, ...]  # state split into its parts, e.g. ("IDLE", "DRAIN")
    drained: bool  # drained or draining: takes no new work
    reason: str | None  # the drain reason as stored (without Slurm's "[user@time]" suffix)
    down: bool = False  # out of service without a drain: Slurm DOWN/FAIL, Kubernetes NotReady


@dataclass(frozen=True, slots=True)
class JobInfo:
    job: str
    state: str  # e.g. "RUNNING", "PENDING", "COMPLETED"
    nodes: tuple[str, ...]  # nodes it runs (or last ran) on; empty while pending
    excluded: tuple[str, ...]  # nodes it may not run on
    restarts: int  # times it was requeued
    reason: str | None = None  # why it is pending, if the scheduler says
    required: tuple[str, ...] = ()  # nodes it was pinned to (Slurm's ReqNodeList: sbatch -w)
    held: bool = False  # pending and held: it starts only once released
    time_left_s: float | None = None  # running: its time limit minus its run time; None: no limit known
    end_time: float | None = None  # running with a limit or preempted: epoch s it is ended (Slurm EndTime)
    preempt_time: float | None = None  # being preempted: epoch s it was chosen (Slurm PreemptTime)
    partition: str = ""  # Slurm's Partition (the grace audit reads its GraceTime); "" unknown


@dataclass(frozen=True, slots=True)
class Reservation:
    """A scheduler reservation of nodes (Slurm ``scontrol show reservation``): ``maintenance`` when its
    flags say MAINT (the nodes go out of service at ``start``)."""

    name: str
    start: float  # epoch s
    end: float | None
    nodes: tuple[str, ...]
    maintenance: bool


@runtime_checkable
class Scheduler(Protocol):
    name: str

    async def drain(self, node: str, reason: str) -> None: ...

    async def resume(self, node: str) -> None: ...

    async def requeue(self, job: str, exclude: Sequence[str] = ()) -> None: ...

    async def node_info(self, node: str) -> NodeInfo: ...

    async def job_info(self, job: str) -> JobInfo: ...

    async def list_nodes(self) -> list[NodeInfo]: ...

    async def reboot(self, node: str, reason: str, nextstate: str = "RESUME") -> None: ...

    async def job_nodes(self, job: str) -> tuple[str, ...]: ...


@runtime_checkable
class JobHolder(Scheduler, Protocol):
    """A scheduler that can requeue a job held and release it (see the module docstring)."""

    holds_jobs: bool

    async def requeue_held(self, job: str) -> None: ...

    async def release(self, job: str) -> None: ...


def job_holder(scheduler: Scheduler | None) -> JobHolder | None:
    """``scheduler`` when it can hold jobs (``holds_jobs`` true), else None."""
    if scheduler is not None and getattr(scheduler, "holds_jobs", False) is True:
        return scheduler if isinstance(scheduler, JobHolder) else None
    return None


@dataclass
class _FakeNode:
    state: str = "IDLE"
    drained: bool = False
    reason: str | None = None
    reboot: str | None = None  # the nextstate of a reboot asked for and not done yet


@dataclass
class _FakeJob:
    state: str = "RUNNING"
    nodes: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    restarts: int = 0
    requeue_allowed: bool = True
    held: bool = False
    required: tuple[str, ...] = ()
    ends_at: float | None = None  # time.time() when its time limit runs out (None: no limit)
    preempted_at: float | None = None  # time.time() when it was chosen for preemption (None: it is not)


@dataclass
class FakeScheduler:
    """In-process scheduler with Slurm's semantics; records every call in ``calls``.

    Add nodes and jobs with :meth:`add_node` / :meth:`add_job`; :meth:`finish_job` and
    :meth:`start_job` move a job along as the real scheduler would. ``fail_next`` makes the next call
    raise (to test error paths in actions).
    """

    name: str = "fake"
    holds_jobs: bool = True
    nodes: dict[str, _FakeNode] = field(default_factory=dict)
    jobs: dict[str, _FakeJob] = field(default_factory=dict)
    calls: list[tuple[str, tuple[object, ...]]] = field(default_factory=list)
    fail_next: SchedulerError | None = None
    reservations: list[Reservation] = field(default_factory=list)

    # -- test controls ----------------------------------------------------------------------------

    def add_node(self, node: str, state: str = "IDLE") -> None:
        self.nodes[node] = _FakeNode(state=state)

    def operator_drain(self, node: str, reason: str) -> None:
        """Test control: someone else (an operator's ``scontrol``) drains ``node``, reason as given."""
        n = self._node(node)
        n.drained, n.reason = True, reason

    def set_state(self, node: str, state: str) -> None:
        """Test control: the node's base state changes (e.g. ``DOWN`` when its daemon dies)."""
        self._node(node).state = state

    def add_job(
        self,
        job: str,
        nodes: Sequence[str],
        *,
        state: str = "RUNNING",
        requeue: bool = True,
        required: Sequence[str] = (),
        time_limit_s: float | None = None,
    ) -> None:
        """A job on ``nodes``; ``required``: the nodes it is pinned to (Slurm's ``sbatch -w``);
        ``time_limit_s``: its time limit from now (``sbatch --time``), None for none."""
        for node in (*nodes, *required):
            self.nodes.setdefault(node, _FakeNode())
        self.jobs[job] = _FakeJob(
            state=state,
            nodes=tuple(nodes),
            requeue_allowed=requeue,
            required=tuple(required),
            ends_at=None if time_limit_s is None else time.time() + time_limit_s,
        )

    def add_reservation(
        self,
        name: str,
        nodes: Sequence[str],
        start_in_s: float,
        duration_s: float,
        *,
        maintenance: bool = True,
    ) -> None:
        """Test control: an operator reserves ``nodes`` from ``start_in_s`` from now (Slurm's
        ``scontrol create reservation ... flags=maint``; whole seconds, as Slurm shows them)."""
        start = float(int(time.time() + start_in_s))
        self.reservations.append(Reservation(name, start, start + duration_s, tuple(nodes), maintenance))

    async def list_reservations(self) -> list[Reservation]:
        self._record("list_reservations")
        return list(self.reservations)

    def preempt_job(self, job: str, grace_s: float = 20.0) -> None:
        """Test control: a higher-priority job chose ``job`` for preemption now. As Slurm 22.05 does,
        ``PreemptTime`` is set and ``EndTime`` becomes now + ``grace_s`` (the partition's
        ``GraceTime``); the job keeps RUNNING until then."""
        j = self._job(job)
        j.preempted_at = time.time()
        j.ends_at = j.preempted_at + grace_s

    def finish_job(self, job: str, state: str = "COMPLETED") -> None:
        self._job(job).state = state

    def start_job(self, job: str, nodes: Sequence[str]) -> None:
        j = self._job(job)
        if j.held:
            raise SchedulerError(f"job {job} is held: it starts only once released")
        bad = set(nodes) & set(j.excluded)
        if bad:
            raise SchedulerError(f"job {job} may not run on excluded nodes {sorted(bad)}")
        j.state, j.nodes = "RUNNING", tuple(nodes)

    # -- Scheduler --------------------------------------------------------------------------------

    def _record(self, op: str, *args: object) -> None:
        self.calls.append((op, args))
        if self.fail_next is not None:
            err, self.fail_next = self.fail_next, None
            raise err

    def _node(self, node: str) -> _FakeNode:
        try:
            return self.nodes[node]
        except KeyError:
            raise SchedulerError(f"unknown node {node!r}", stderr="Invalid node name specified") from None

    def _job(self, job: str) -> _FakeJob:
        try:
            return self.jobs[job]
        except KeyError:
            raise SchedulerError(f"unknown job {job!r}", stderr="Invalid job id specified") from None

    async def drain(self, node: str, reason: str) -> None:
        self._record("drain", node, reason)
        n = self._node(node)
        n.drained, n.reason = True, sanitize_reason(reason)

    async def resume(self, node: str) -> None:
        self._record("resume", node)
        n = self._node(node)
        n.drained, n.reason = False, None

    async def requeue(self, job: str, exclude: Sequence[str] = ()) -> None:
        self._record("requeue", job, tuple(exclude))
        j = self._job(job)
        for node in exclude:
            self._node(node)  # like Slurm: an unknown excluded node is an error, the job is untouched
        if not j.requeue_allowed:
            raise SchedulerError(
                f"job {job} does not allow requeue", stderr="Requested operation is presently disabled"
            )
        if j.state != "PENDING":
            j.state, j.nodes, j.restarts = "PENDING", (), j.restarts + 1
        j.excluded = tuple(sorted(set(j.excluded) | set(exclude)))

    async def requeue_held(self, job: str) -> None:
        self._record("requeue_held", job)
        j = self._job(job)
        if not j.requeue_allowed:
            raise SchedulerError(
                f"job {job} does not allow requeue", stderr="Requested operation is presently disabled"
            )
        if j.state != "PENDING":
            j.state, j.nodes, j.restarts = "PENDING", (), j.restarts + 1
        j.held = True

    async def release(self, job: str) -> None:
        self._record("release", job)
        self._job(job).held = False

    async def node_info(self, node: str) -> NodeInfo:
        n = self._node(node)
        flags = (n.state, "DRAIN") if n.drained else (n.state,)
        down = any(f.startswith(("DOWN", "FAIL")) for f in flags)
        return NodeInfo(node, "+".join(flags), flags, n.drained, n.reason, down)

    async def job_info(self, job: str) -> JobInfo:
        j = self._job(job)
        left = end = None
        if j.ends_at is not None and j.state == "RUNNING":
            left, end = max(0.0, j.ends_at - time.time()), float(int(j.ends_at))  # Slurm shows whole seconds
        preempt = float(int(j.preempted_at)) if j.preempted_at is not None and j.state == "RUNNING" else None
        return JobInfo(
            job,
            j.state,
            j.nodes,
            j.excluded,
            j.restarts,
            required=j.required,
            held=j.held,
            time_left_s=left,
            end_time=end,
            preempt_time=preempt,
        )

    async def list_nodes(self) -> list[NodeInfo]:
        return [await self.node_info(name) for name in sorted(self.nodes)]

    async def job_nodes(self, job: str) -> tuple[str, ...]:
        self._record("job_nodes", job)
        j = self.jobs.get(job)
        return j.nodes if j is not None and j.state == "RUNNING" else ()

    async def running_job_nodes(self) -> dict[str, tuple[str, ...]]:
        self._record("running_job_nodes")
        return {job: j.nodes for job, j in self.jobs.items() if j.state == "RUNNING" and j.nodes}

    async def reboot(self, node: str, reason: str, nextstate: str = "RESUME") -> None:
        self._record("reboot", node, reason, nextstate)
        if nextstate not in REBOOT_NEXTSTATES:
            raise SchedulerError(f"invalid nextstate {nextstate!r} (one of {sorted(REBOOT_NEXTSTATES)})")
        n = self._node(node)
        n.drained, n.reason, n.reboot = True, sanitize_reason(reason), nextstate

    def finish_reboot(self, node: str) -> None:
        """Test control: the node rebooted; it comes back as its ``nextstate`` asked."""
        n = self._node(node)
        if n.reboot == "RESUME":
            n.drained, n.reason = False, None
        elif n.reboot == "DOWN":
            n.state = "DOWN"
        n.reboot = None
