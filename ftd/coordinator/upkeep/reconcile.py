"""Drains that match the scheduler: ftd's drains persisted and reconciled, jobs stuck pending alerted.

What: the coordinator's memory of which nodes are out of service, and why, kept in step with the
scheduler (Slurm, Kubernetes) it acts on.

* **Recorded**: every ``drain_node`` that succeeds is written to the ledger's ``drains`` table
  (origin ``ftd``), every ``resume_node`` that succeeds removes it (:meth:`Reconciler.observe`,
  an :meth:`~ftd.coordinator.decide.engine.Engine.observe` observer, so the executors stay as they are).
  At start-up :meth:`Reconciler.restore` puts the recorded drains back into the cluster state
  *before* any event is decided, so a restarted coordinator counts its drains in the blast-radius
  budget (it used to forget them and drain past the budget).
* **Reconciled** (:meth:`Reconciler.reconcile`, at start-up and every
  ``coordinator.reconcile_interval_s``): the scheduler's node list (:meth:`Scheduler.list_nodes`)
  against the ledger. A node is *out* when it is drained or down; it is *ftd's* when its reason
  carries the ``ftd:`` prefix (:func:`~ftd.coordinator.actions.scheduler.sanitize_reason`; on
  Kubernetes, ftd's annotation on a cordoned/tainted node). Then:

  - ftd drained it and the scheduler has it back in service (an operator's ``scontrol update
    state=resume``, an uncordon and untaint): **released** -- no longer counted in ftd's budget,
    logged (``drain_released``) and recorded as an event;
  - out with ftd's reason but not in the ledger (a crash between the scheduler's drain and the
    record, a ledger moved aside, a requeue's exclusion cordon on Kubernetes): **adopted**;
  - out with someone else's reason (an operator's drain, a node DOWN): recorded as ``external``,
    an event is raised once (when first seen and when its reason changes) and the node is
    *unavailable capacity* (:meth:`ClusterState.mark_unavailable`), never counted in ftd's own
    budget; when it comes back, a last event says so. A node ftd drained whose reason someone
    replaced is released from ftd's budget and becomes external.

  A node with a drain or resume action in flight, or whose record changed after the listing was
  asked for, is left for the next round (the listing may predate the change).
* **Jobs stuck pending**: a job ftd requeued (a finished ``checkpoint_restart`` whose detail says
  ``requeued``) that the scheduler still shows PENDING ``coordinator.pending_alert_s`` after the
  requeue raises one alert: a ``job_pending`` note in the ledger (node
  :data:`~ftd.coordinator.ledger.store.NOTICE_NODE`), a warning in the log, and a ``notify`` action to the
  webhook when one is configured. Requeued jobs are found again in the ledger after a restart.
  Until it runs again (or ends, or the scheduler forgets it) such a job is kept in the cluster
  state's :class:`~ftd.coordinator.model.moved.MovedJobs` with what the scheduler says of it, so
  the API and ``ftd status`` keep showing it as "pending after requeue, excluding ..." (issue #32).
* **Restarts that did not resume**: a ``checkpoint_restart`` escalated because the job requeued in
  place did not train again (``detail.not_resumed``, :mod:`ftd.coordinator.actions.checkpoint_restart`)
  is notified once, with that sentence (a ``notify`` action, rule ``resume_watch``).
* **Saves skipped before a deadline**: an interruption's ``checkpoint_restart`` whose decision was
  that no save could land (``detail.save_skipped``, issue #37) is notified once: why, and the step
  the job will resume from (``detail.resume_from_step``; rule ``deadline``).
* **Unacted conditions** (:mod:`ftd.coordinator.upkeep.unacted`): a node in service whose agent
  reports an active critical condition, and whose drain failed, was suppressed or was never asked
  for, gets the drain proposed again through the engine (gate, budgets, approval apply), at most
  once a round and with a back-off (``coordinator.unacted_retry_s``); logged as
  ``unacted_condition_retried``.
* **Pinned jobs held** (:mod:`ftd.coordinator.upkeep.pinned_holds`): a restart that met a job
  pinned to the node it had to leave is notified with what really happened, and a job it requeued
  held is released once its node's condition clears (checked each round).

The events are :attr:`~ftd.events.Kind.AGENT_HEALTH` with ``source = "scheduler"`` and
``data.problem`` one of :data:`PROBLEMS`, severity warning (external drains and downs, adoption)
or info (releases and returns): never a fault of the node (severity < error), so the history
rules count them for nothing. They go through the engine like any event (ledger, live view, rules).

Why: a daemon whose idea of "drained" drifts from the scheduler's either suppresses a real drain
(an operator resumed the node, ftd still counted it: the next Xid 79 was held back by the budget and
a GPU off the bus stayed in service) or exceeds its budget (after a restart it forgot its drains).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ftd.coordinator.actions.checkpoint_restart import ENDED
from ftd.coordinator.actions.scheduler import NodeInfo, Scheduler, SchedulerError
from ftd.coordinator.ledger.store import NOTICE_NODE, Drain, LedgerStore
from ftd.coordinator.model.state import ClusterState
from ftd.coordinator.upkeep.pinned_holds import PinnedHolds
from ftd.coordinator.upkeep.unacted import UnactedConditions
from ftd.events import Event, Kind, Severity
from ftd.logs import get_logger
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState

if TYPE_CHECKING:
    from ftd.coordinator.decide.engine import Engine

log = get_logger(__name__)

FTD_PREFIX = "ftd:"
FTD, EXTERNAL = "ftd", "external"
PROBLEMS = (
    "ftd_drain_released",  # ftd drained it; the scheduler has it back in service (operator resume)
    "ftd_drain_adopted",  # the scheduler shows ftd's reason on a drain the ledger did not have
    "external_drain",  # drained by someone else
    "node_down",  # down (Slurm DOWN/FAIL, Kubernetes NotReady), not by ftd
    "external_returned",  # an external drain or down is over
    "job_pending",  # a job ftd requeued is still pending after pending_alert_s
)
REQUEUE_LOOKBACK_S = 7 * 86400.0  # requeues older than this are not watched again after a restart
_FINISHED = (ActionState.SUCCEEDED, ActionState.ESCALATED)
_DRAIN_KINDS = (ActionKind.DRAIN_NODE, ActionKind.RESUME_NODE)


def _why(state: str, reason: str) -> str:
    return f"{state}: {reason}" if reason else state


def is_ftds(info: NodeInfo) -> bool:
    """The scheduler's own record says ftd took this node out (reason prefix ``ftd:``)."""
    return (info.reason or "").startswith(FTD_PREFIX)


class Reconciler:
    def __init__(
        self,
        *,
        state: ClusterState,
        ledger: LedgerStore,
        scheduler: Scheduler | None,
        engine: Engine,
        interval_s: float = 60.0,
        pending_alert_s: float = 600.0,
        unacted_retry_s: float = 300.0,
        unacted_retry_max_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self.ledger = ledger
        self.scheduler = scheduler
        self.engine = engine
        self.interval_s = interval_s
        self.pending_alert_s = pending_alert_s
        self.clock = clock
        self.requeued: dict[str, float] = {}  # job -> when ftd requeued it (watched while pending)
        self.alerted: set[str] = set()  # jobs whose pending alert was raised
        self.rounds = 0
        self._changes = 0  # drain records changed here so far (a sequence, not a clock)
        self._touched: dict[str, int] = {}  # node -> the change number of its record's last change
        self._in_flight: dict[str, str] = {}  # node -> id of a drain/resume action not finished
        self._notified: set[str] = (
            set()
        )  # restarts whose "did not resume" (id) or skipped save ("skipped:" id) was notified
        self._tasks: set[asyncio.Task[Any]] = set()
        self.unacted = UnactedConditions(
            backoff_s=unacted_retry_s, max_backoff_s=unacted_retry_max_s, clock=clock
        )
        self.pinned = PinnedHolds(
            state=state,
            ledger=self.ledger,
            scheduler=scheduler,
            engine=engine,
            settle_s=interval_s,
            clock=clock,
        )

    # --- start-up -------------------------------------------------------------------------------

    async def restore(self) -> None:
        """Put the ledger's drains back into the cluster state; watch the jobs requeued lately."""
        for drain in await self.ledger.drains():
            if drain.origin == FTD:
                self.state.mark_drained(drain.node, drain.reason, since=drain.since)
            else:
                self.state.mark_unavailable(drain.node, _why(drain.state, drain.reason), since=drain.since)
        since = self.clock() - REQUEUE_LOOKBACK_S
        recent = await self.ledger.recent(since)
        for record in recent:
            self._note_requeue(record)
        self.unacted.restore(sorted(recent, key=lambda r: r.created))
        await self.pinned.restore()
        drains = self.state.drained_nodes()
        if drains or self.state.unavailable:
            log.info(
                "drains_restored",
                ftd=sorted(drains),
                external=sorted(self.state.unavailable),
            )

    # --- what the engine did ----------------------------------------------------------------------

    async def observe(self, what: str, payload: Any) -> None:
        """An :meth:`Engine.observe` observer: record drains and resumes that succeeded, requeues."""
        if what != "action" or not isinstance(payload, ActionRecord):
            return
        record = payload
        kind, node = record.request.kind, record.request.target
        self.unacted.observe(record)
        if kind in _DRAIN_KINDS:
            if record.state in (ActionState.PENDING, ActionState.RUNNING):
                self._in_flight[node] = record.id
                return
            if self._in_flight.get(node) == record.id:
                del self._in_flight[node]
            if record.state != ActionState.SUCCEEDED:
                return
            now = self.clock()
            self._changes += 1
            self._touched[node] = self._changes
            if kind == ActionKind.DRAIN_NODE:
                reason = str(record.detail.get("reason") or record.request.reason)
                await self.ledger.save_drain(Drain(node, FTD, reason, now, action_id=record.id))
                self.state.mark_unavailable(node, None)
            else:
                await self.ledger.drop_drain(node)
            return
        self._note_requeue(record)
        self._notify_not_resumed(record)
        self._notify_save_skipped(record)
        self.pinned.observe(record)

    def _notify_save_skipped(self, record: ActionRecord) -> None:
        """An interruption's restart that decided no save could land (issue #37): one notification
        saying why and the step the job will resume from (the catalogue's newest verified)."""
        why = record.detail.get("save_skipped")
        if (
            record.request.kind != ActionKind.CHECKPOINT_RESTART
            or not record.request.params.get("interruption")
            or not isinstance(why, str)
            or "skipped:" + record.id in self._notified
            or ActionKind.NOTIFY not in self.engine.executors
        ):
            return
        self._notified.add("skipped:" + record.id)
        job = record.request.target
        step = record.detail.get("resume_from_step")
        resume = (
            f"it resumes from its last verified checkpoint, step {step}"
            if isinstance(step, int)
            else "no verified checkpoint of it is known: it resumes from whatever it finds"
        )
        self._submit_notify(
            ActionRequest(
                kind=ActionKind.NOTIFY,
                target=job,
                reason=f"job {job}: no save before the deadline ({why}); {resume}",
                params={"job": job, "action_id": record.id, "resume_from_step": step, "severity": "warning"},
                rule="deadline",
                event_id=record.request.event_id,
            ),
            f"notify-save-skipped:{record.id}",
        )

    def _submit_notify(self, request: ActionRequest, name: str) -> None:
        """Submit ``request`` as a task (an observer must not call back into the engine: it runs in a
        decision)."""
        task = asyncio.create_task(self.engine.submit(request), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _notify_not_resumed(self, record: ActionRecord) -> None:
        """A restart escalated because the job did not train again: one notification with the sentence.
        Scheduled as a task (an observer must not call back into the engine: it runs in a decision)."""
        sentence = record.detail.get("not_resumed")
        if (
            record.request.kind != ActionKind.CHECKPOINT_RESTART
            or record.state != ActionState.ESCALATED
            or not isinstance(sentence, str)
            or record.id in self._notified
            or ActionKind.NOTIFY not in self.engine.executors
        ):
            return
        self._notified.add(record.id)
        job = record.request.target
        request = ActionRequest(
            kind=ActionKind.NOTIFY,
            target=job,
            reason=sentence,
            params={"job": job, "action_id": record.id, "seen": record.detail.get("resume_seen")},
            rule="resume_watch",
            event_id=record.request.event_id,
        )
        self._submit_notify(request, f"notify-not-resumed:{record.id}")

    def _note_requeue(self, record: ActionRecord) -> None:
        if record.request.kind != ActionKind.CHECKPOINT_RESTART:
            return
        if record.state not in _FINISHED and not record.detail.get("requeued"):
            return  # a restart still following its job (resume phase) was requeued already: watched
        requeued = record.detail.get("requeued")
        if requeued:
            job = record.request.target
            self.requeued[job] = max(self.requeued.get(job, 0.0), record.updated or self.clock())
            self.alerted.discard(job)
            at = record.detail.get("requeued_at")
            since = float(at) if isinstance(at, int | float) else record.updated or self.clock()
            exclude = requeued.get("exclude") if isinstance(requeued, dict) else None
            excluding = [str(n) for n in exclude] if isinstance(exclude, list) else []
            if not record.detail.get("resumed_at"):  # (a followed restart that saw it train: done)
                self.state.moved.note(job, since, excluding, record.id)  # shown until it trains again

    # --- the rounds -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Reconcile now and every ``interval_s`` until cancelled; a failed round is logged."""
        while True:
            try:
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except SchedulerError as exc:
                log.warning("reconcile_failed", error=str(exc))
            except Exception as exc:  # never fatal: the next round tries again
                log.exception("reconcile_failed", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(self.interval_s)

    async def reconcile(self) -> dict[str, list[str]]:
        """One round (see the module docstring); returns the nodes changed, by ``data.problem``."""
        changes: dict[str, list[str]] = {}
        if self.scheduler is None:
            return changes
        asked = self._changes
        listed = {info.name: info for info in await self.scheduler.list_nodes()}
        recorded = {drain.node: drain for drain in await self.ledger.drains()}
        for name in sorted(set(listed) | set(recorded)):
            if name in self._in_flight or self._touched.get(name, 0) > asked:
                continue  # a drain or resume of ftd's is under way: the listing may be older
            problem = await self._node(name, listed.get(name), recorded.get(name))
            if problem:
                changes.setdefault(problem, []).append(name)
        await self._check_pending(changes)
        await self._retry_unacted(changes)
        for job in await self.pinned.check():
            changes.setdefault("pinned_released", []).append(job)
        self.rounds += 1
        if changes:
            log.info("reconciled", **{k: v for k, v in changes.items()})
        return changes

    async def _node(self, name: str, info: NodeInfo | None, drain: Drain | None) -> str | None:
        out = info is not None and (info.drained or info.down)
        if info is None or not out:  # in service (or gone from the scheduler)
            if drain is None:
                return None
            await self.ledger.drop_drain(name)
            why = "gone from the scheduler" if info is None else f"back in service ({info.state})"
            if drain.origin == FTD:
                self.state.mark_drained(name, "", drained=False)
                log.warning("drain_released", node=name, reason=drain.reason, why=why, by="scheduler")
                return await self._event(name, "ftd_drain_released", Severity.INFO, drain, info, why=why)
            self.state.mark_unavailable(name, None)
            log.info("external_drain_over", node=name, why=why)
            return await self._event(name, "external_returned", Severity.INFO, drain, info, why=why)
        reason = info.reason or ""
        if is_ftds(info):
            if drain is not None and drain.origin == FTD:
                if drain.state != info.state:
                    kept = Drain(name, FTD, drain.reason, drain.since, info.state, drain.action_id)
                    await self.ledger.save_drain(kept)
                self.state.mark_drained(name, drain.reason, since=drain.since)
                return None
            await self.ledger.save_drain(Drain(name, FTD, reason, self.clock(), info.state))
            self.state.mark_unavailable(name, None)
            self.state.mark_drained(name, reason)
            log.warning("drain_adopted", node=name, reason=reason, state=info.state)
            return await self._event(name, "ftd_drain_adopted", Severity.WARNING, drain, info)
        problem = "node_down" if info.down and not info.drained else "external_drain"
        why = _why(info.state, reason)
        self.state.mark_unavailable(name, why)
        if drain is not None and drain.origin == EXTERNAL and drain.reason == reason:
            if drain.state != info.state:
                await self.ledger.save_drain(Drain(name, EXTERNAL, reason, drain.since, info.state))
            return None
        await self.ledger.save_drain(Drain(name, EXTERNAL, reason, self.clock(), info.state))
        if drain is not None and drain.origin == FTD:  # someone replaced ftd's reason: theirs now
            self.state.mark_drained(name, "", drained=False)
            log.warning("drain_released", node=name, reason=drain.reason, why=f"now {why}", by="other")
            await self._event(name, "ftd_drain_released", Severity.INFO, drain, info, why=f"now {why}")
        log.warning("external_drain_seen", node=name, problem=problem, state=info.state, reason=reason)
        return await self._event(name, problem, Severity.WARNING, drain, info)

    async def _retry_unacted(self, changes: dict[str, list[str]]) -> None:
        """Ask again for the drain of nodes whose active critical conditions were never acted on."""
        for request in self.unacted.due(self.state, busy=lambda node: node in self._in_flight):
            node = request.target
            record = await self.engine.submit(request)
            changes.setdefault("unacted_retried", []).append(node)
            log.warning(
                "unacted_condition_retried",
                node=node,
                conditions=request.params.get("conditions"),
                last_state=request.params.get("last_state"),
                why=request.params.get("why"),
                retry_of=request.params.get("retry_of"),
                attempt=self.unacted.retries[node].attempts,
                next_retry_s=self.unacted.wait_s(self.unacted.retries[node].attempts),
                action_id=record.id,
                state=str(record.state),
                policy=record.detail.get("policy"),
            )

    async def _event(
        self,
        node: str,
        problem: str,
        severity: Severity,
        drain: Drain | None,
        info: NodeInfo | None,
        **extra: Any,
    ) -> str:
        now = self.clock()
        data: dict[str, Any] = {"problem": problem, **extra}
        if info is not None:
            data.update(state=info.state, drained=info.drained, down=info.down, reason=info.reason)
        if drain is not None:
            data["recorded"] = {"origin": drain.origin, "reason": drain.reason, "since": drain.since}
        event = Event(
            id=f"scheduler-{node}-{problem}-{int(now * 1000)}",
            ts=now,
            node=node,
            kind=Kind.AGENT_HEALTH,
            severity=severity,
            source="scheduler",
            data=data,
        )
        await self.engine.handle_event(event)
        return problem

    async def _check_pending(self, changes: dict[str, list[str]]) -> None:
        assert self.scheduler is not None
        now = self.clock()
        for job, since in sorted(self.requeued.items()):
            try:
                info = await self.scheduler.job_info(job)
            except SchedulerError:
                del self.requeued[job]  # unknown now (purged): nothing to watch
                self.state.moved.trains_again(job)  # nor to show
                continue
            self.state.moved.scheduler_says(job, info.state, info.reason or "")
            if info.state == "RUNNING" or info.state in ENDED:
                del self.requeued[job]
                self.alerted.discard(job)
                self.state.moved.trains_again(job)  # running again, or ended
                continue
            if info.state != "PENDING":
                continue  # on its way (REQUEUED, CONFIGURING, ...): watched at the next round
            waited = now - since
            if waited < self.pending_alert_s or job in self.alerted:
                continue
            self.alerted.add(job)
            changes.setdefault("job_pending", []).append(job)
            data = {
                "problem": "job_pending",
                "job": job,
                "pending_s": round(waited, 1),
                "requeued_at": since,
                "reason": info.reason,
                "excluded": list(info.excluded),
            }
            new = await self.ledger.record_event(
                Event(
                    id=f"{NOTICE_NODE}-job-pending-{job}-{int(since * 1000)}",
                    ts=now,
                    node=NOTICE_NODE,
                    kind=Kind.AGENT_HEALTH,
                    severity=Severity.ERROR,
                    source="scheduler",
                    data=data,
                )
            )
            log.warning("job_pending_too_long", job=job, pending_s=round(waited, 1), reason=info.reason)
            if new and ActionKind.NOTIFY in self.engine.executors:
                text = f"job {job} still pending {waited:.0f}s after ftd requeued it ({info.reason or '?'})"
                await self.engine.submit(
                    ActionRequest(
                        kind=ActionKind.NOTIFY,
                        target=job,
                        reason=text,
                        params={"job": job, "event": data},
                        rule="reconcile",
                    )
                )
