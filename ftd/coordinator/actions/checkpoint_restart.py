"""checkpoint_restart: save every rank at the same step, stop them, requeue without the bad nodes --
or, for a job run by rank supervisors (``ftd run``), restart it inside its allocation.

Four phases (:class:`~ftd.coordinator.model.plan.PhasedExecutor`: inside a plan the engine runs a
node's reset or drain between the first two; outside one, calling the executor runs them all), each
recorded in the action's detail (the in-allocation path, issue #24: ``requeue`` chooses it and
``restart`` runs it, see :mod:`~ftd.coordinator.actions.in_allocation` and
:mod:`~ftd.coordinator.actions.restart_phase`):

1. **stop** -- *save*: a ``save`` directive on ``ftd/v1/nodes/{node}/directives/jobs`` of every node
   the job's ranks are on; each of those agents relays it to its ranks; wait for every known rank to
   ack (``save_deadline_s``). The directive carries ``params["save_at_step"]`` = S, the furthest step
   the ranks' heartbeats reported plus ``save_step_margin`` steps, or as many as the job runs in
   ``save_step_lead_s`` at its measured pace if more: every rank saves at its first step >= S
   (:mod:`ftd.client`), so ranks agree on the step without a collective. Acks with different steps
   make the action *escalated*, never succeeded (``detail["save_steps_differ"]``), and
   ``detail["resume_step"]`` is the newest step every rank has (the oldest of the ranks' acked steps).
   A rank that nacks or stays silent makes the action *escalated* too: the job still has to move, so
   we go on, and the detail names the ranks whose checkpoint is missing. A silent rank that has left
   its agent (its process died: ``detail["save_ranks_gone"]``) never acks, and its peers are blocked
   in a collective with it: the wait then ends ``save_rank_lost_grace_s`` later, not at the deadline
   (at once when every silent rank is gone).
   Then *stop*: a ``stop`` directive (with ``params["resume_step"]`` when known: the client offers it
   as ``Client.resume_step`` for the trainer to record where its restart reads it); wait
   (``stop_deadline_s``) until the job's ranks have left their agents (the retained job presence
   empties), so the scheduler does not kill a rank mid-write and a node action (GPU reset) never
   meets the job's processes.
2. **requeue** -- after ``params.delay_s`` seconds when a rule asks for a crash-loop backoff, through
   the scheduler, excluding ``params.exclude`` (the faulty nodes); ``detail["requeued_at"]`` is its
   time; the step to resume from is ``detail["resume_step"]`` (told to the ranks with the stop).
   A node the job is pinned to (Slurm's ``ReqNodeList``, ``sbatch -w``) is never excluded: that
   would leave the job pending forever (BadConstraints). What happens instead is
   :func:`~ftd.coordinator.actions.pinned.decide_pinned`'s choice, kept in ``detail["pinned"]``
   (``action``, ``nodes``, ``why``: the sentence, notified by
   :mod:`~ftd.coordinator.upkeep.pinned_holds`): the node is out of service -> *wait*, requeued
   without that exclusion, *escalated* with ``detail["exclude_refused"]``; the node stays in service
   (a condition that moves jobs without draining the node) -> *hold* (``coordinator.pinned_jobs``,
   the default: requeued held, ``detail["requeued"]`` None, ``pinned.waits_for`` the node's
   condition kinds the release waits for, ``pinned.held_at``) or *stop* (not requeued, escalated).
   Never requeued onto the node it just left, so never a loop of restarts.
   A job with rank supervisors is not requeued when its allocation can take it back: the phase
   chooses the path (in place, swap in spares, or this scheduler requeue; ``detail["path"]``,
   ``restart_why``) and returns the generation to start, its slots and the nodes out.
3. **restart** -- only on the in-allocation path: the ``restart`` directive of the generation to
   every node with a supervisor of the job, then the wait (``restart_deadline_s``) for every slot to
   run it; a slot that fails takes the next spare in the next generation, or the job is requeued.
4. **resume** -- a job restarted inside its allocation is followed until a rank of the new
   generation's run reports a step. A job requeued *in place* (no node excluded: an application
   fault, a hang) is followed until it trains again, not only until ``scontrol`` returned: until
   ``coordinator.resume_deadline_s`` after the requeue (a wall-clock deadline kept in the detail, so
   a coordinator restart resumes the watch, never extends it) the scheduler is asked for the job and
   the cluster state for its ranks. Running again with a rank of the new run registered (a run its
   client names differently from the stopped one's; any rank for a job that had none: running is
   enough) is ``detail["resumed_at"]`` (with ``resumed_step``, the first step the new run reported,
   when it did). Meanwhile ``detail["waiting"]`` says "waiting for the job to train again" (shown by
   ``ftd status`` and the API). A job that ends (FAILED, COMPLETED, CANCELLED, ...) before that, or the
   deadline passing, makes the action *escalated* with ``detail["not_resumed"]``: one sentence saying
   what was seen (still PENDING and why, running with no rank registered, ended FAILED), which the
   coordinator also notifies (:mod:`ftd.coordinator.upkeep.reconcile`). A job moved elsewhere (nodes
   excluded) is watched by ``coordinator.pending_alert_s`` instead.

With ``params["stop"] = False`` (the default for action kind ``checkpoint``) only the save runs: the
job saves and keeps training (a filesystem filling up: save while there is still room).

The save path (issue #23): ``params["save"] = False`` skips the save and stops the job at once
(``detail["save_skipped"]`` says why: ``params["no_save_reason"]``, e.g. the job's checkpoint
directory is on a read-only, full or unresponsive filesystem; a save there would hang or fail);
``params["save_path"]`` is sent with the save directive (the fallback directory the trainer declared,
``Client.save_path``). ``params["requeue"] = False`` stops without requeueing (an application failure
that would fail again): ``detail["requeued"]`` is None and ``detail["note"]`` says so.

The level (issue #34): the save before a stop (the job stopped for a drain, a swap, a restart, a
preemption) asks ``params["level"] = "local"``, the fast level: a checkpoint tier acknowledges once the
rank's manifest is written there, and the agent relays that acknowledgement only once it verified the
manifest (:mod:`ftd.agent.checkpoints`), so the stop waits for a local write, never a flush to the
shared directory. ``params["save_level"]`` (``local``, ``partner``, ``shared``) overrides it; a save
that does not stop the job (action kind ``checkpoint``) names no level unless asked (the tier's own
schedule stands). ``detail["save_level"]`` says which was asked. A trainer saving its own way ignores
the param, as before.

Directive ids derive from the action id, so a resumed action re-sends the *same* directives and
agents and trainers ignore the repeats.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

from ftd.bus import topics
from ftd.coordinator.actions.acks import AckBook, AckOutcome
from ftd.coordinator.actions.directive import Publish, directive_for, publish_with_retry
from ftd.coordinator.actions.pinned import DEFAULT_PINNED_POLICY, PinnedMove, decide_pinned, stop_instead
from ftd.coordinator.actions.restart_phase import (
    DEFAULT_RESTART_DEADLINE_S,
    IN_ALLOCATION,
    WAITING,
    InAllocation,
    Persist,
)
from ftd.coordinator.actions.scheduler import JobInfo, Scheduler, SchedulerError, job_holder
from ftd.coordinator.actions.slurm_signal import ClientlessFallback
from ftd.coordinator.decide.deadline import DEFAULT_MARGIN_S, BadDeadline, SaveDecision, decide_save
from ftd.coordinator.model.checkpoints import LEVELS
from ftd.coordinator.model.plan import merge_state
from ftd.coordinator.model.save_times import DEFAULT_LEVEL, SaveTimes
from ftd.coordinator.model.state import ClusterState
from ftd.events import DirectiveAction, RankInfo, encode
from ftd.logs import get_logger
from ftd.plugin.actions import ActionKind, ActionRecord, ActionState

log = get_logger(__name__)

DEFAULT_SAVE_STEP_MARGIN = 5
DEFAULT_SAVE_STEP_LEAD_S = 1.5  # coordinator.save_step_lead_s's default
#: The most steps a save's step is set ahead for its lead: counters claiming sub-microsecond steps
#: must not push the save past its deadline.
MAX_LEAD_STEPS = 100_000
DEFAULT_RESUME_DEADLINE_S = 600.0
#: After a rank that has not acked the save left its agent: how long the other ranks still get.
DEFAULT_SAVE_RANK_LOST_GRACE_S = 5.0
#: How often the save wait looks whether a silent rank has left (acks themselves wake it at once).
_GONE_POLL_S = 0.25
DEFAULT_LAST_WILL_GRACE_S = 10.0  # coordinator.offline_grace.last_will_s's default
HUNG_STOP_WAIT_S = 2.0  # how long a hung job's ranks get to leave before its restart goes on anyway

__all__ = ["WAITING", "CheckpointRestart", "not_resumed", "resume_step", "save_at_step", "steps_in"]
#: Scheduler job states after which a requeued job will not run again by itself.
ENDED = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)


def save_at_step(ranks: list[RankInfo], margin: int, lead_s: float = 0.0) -> int | None:
    """The step every rank saves at (the first step >= it): the furthest step the ranks' heartbeats
    reported, plus ``margin`` steps, or more: as many as the job runs in ``lead_s`` seconds at its
    measured pace (:func:`steps_in`); None when no rank reported a step or ``margin`` is negative
    (save at once). The lead covers what the ranks ran since their last reported step (presence is
    sent at most once a second) and the directive's trip, so no rank is already past the step when
    it arrives: a fixed count of steps cannot, since jobs' steps last from milliseconds to minutes
    (5 steps of 0.1 s were passed before the directive came, and the ranks saved 376 and 377).
    A job of one rank has no other rank to agree with: the margin alone, so its save (a preemption
    notice's) is not held back."""
    steps = [r.step for r in ranks if r.step is not None]
    if not steps or margin < 0:
        return None
    lead = steps_in(ranks, lead_s) if len(ranks) > 1 else 0
    return max(steps) + max(margin, lead)


def steps_in(ranks: list[RankInfo], seconds: float) -> int:
    """How many steps the job runs in ``seconds`` at its fastest rank's pace (its client's timing
    counters: the mean step time since the clock started), rounded up and at most
    :data:`MAX_LEAD_STEPS`; 0 when no rank reported its timing or ``seconds`` is not positive."""
    paces = [
        r.timing.step_s / r.timing.steps
        for r in ranks
        if r.timing is not None and r.timing.steps > 0 and r.timing.step_s > 0
    ]
    if not paces or seconds <= 0:
        return 0
    return min(MAX_LEAD_STEPS, math.ceil(seconds / min(paces)))


def resume_step(acked_steps: dict[int, int | None]) -> int | None:
    """The newest step every rank has a checkpoint of: the oldest of the ranks' newest acked steps."""
    steps = [s for s in acked_steps.values() if s is not None]
    return min(steps) if steps and len(steps) == len(acked_steps) else None


class CheckpointRestart:
    def __init__(
        self,
        *,
        publish: Publish,
        state: ClusterState,
        acks: AckBook,
        scheduler: Scheduler | None,
        save_deadline_s: float,
        stop_deadline_s: float,
        save_step_margin: int = DEFAULT_SAVE_STEP_MARGIN,
        save_step_lead_s: float = DEFAULT_SAVE_STEP_LEAD_S,
        job_moved: Callable[[str], None] = lambda job: None,
        resume_deadline_s: float = DEFAULT_RESUME_DEADLINE_S,
        resume_poll_s: float = 1.0,
        restart_deadline_s: float = DEFAULT_RESTART_DEADLINE_S,
        persist: Persist | None = None,
        allow_unchecked_spares: bool = False,
        pinned_policy: str = DEFAULT_PINNED_POLICY,
        save_rank_lost_grace_s: float = DEFAULT_SAVE_RANK_LOST_GRACE_S,
        last_will_grace_s: float = DEFAULT_LAST_WILL_GRACE_S,
        save_times: SaveTimes | None = None,
        stop_margin_s: float = DEFAULT_MARGIN_S,
    ) -> None:
        self._publish = publish
        # How long this job's saves took, per level (issue #37): recorded here after every complete
        # save, read by the decision against an interruption's deadline.
        self.save_times = save_times if save_times is not None else state.save_times
        self.stop_margin_s = stop_margin_s
        self._state = state
        self._acks = acks
        self._scheduler = scheduler
        self._job_moved = job_moved
        self.save_deadline_s = save_deadline_s
        self.stop_deadline_s = stop_deadline_s
        self.save_step_margin = save_step_margin
        self.save_step_lead_s = save_step_lead_s
        # Once a rank that has not acked has left its agent (its process ended), how much longer the
        # others get: the dead rank never acks, and its peers wait for it in a collective.
        self.save_rank_lost_grace_s = save_rank_lost_grace_s
        self.last_will_grace_s = last_will_grace_s
        self.resume_deadline_s = resume_deadline_s  # 0: an in-place requeue is not followed
        self.resume_poll_s = resume_poll_s
        self.pinned_policy = pinned_policy  # a pinned job whose node stays in service: hold or stop
        # A job with no rank registered (no ftd.client): the scheduler's own signal convention
        # (:mod:`ftd.coordinator.actions.slurm_signal`); None: nothing to save, requeue only.
        self.clientless: ClientlessFallback | None = None
        # A job run by rank supervisors (``ftd run``): restarted inside its allocation (issue #24).
        self.in_allocation = InAllocation(
            publish=publish,
            state=state,
            restart_deadline_s=restart_deadline_s,
            persist=persist,
            allow_unchecked=allow_unchecked_spares,
        )

    async def _send(
        self,
        record: ActionRecord,
        action: DirectiveAction,
        deadline_s: float,
        params: dict[str, Any] | None = None,
    ) -> str:
        job = record.request.target
        job_record = self._state.jobs.get(job)
        # The run of the job it is for, when its ranks named one (issue #20): never another run's.
        runs = {r.run for rs in job_record.ranks_by_node.values() for r in rs} if job_record else set()
        if len(runs) == 1 and None not in runs:
            params = {**(params or {}), "run": runs.pop()}
        directive = directive_for(record, action, job=job, deadline_s=deadline_s, params=params)
        # Once to each node the job's ranks are on (placement-checked presence): no node reads another's.
        for topic in topics.job_directives_for(job_record.nodes if job_record else ()):
            await publish_with_retry(self._publish, topic, encode(directive), deadline_s)
        return directive.id

    phases = ("stop", "requeue", "restart", "resume")

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        """Every phase in a row (outside a plan)."""
        detail: dict[str, Any] = {}
        state: str | None = None
        for phase in self.phases:
            part = await self.run_phase(record, phase)
            state = merge_state(state, part.pop("state", None))
            detail.update(part)
            record.detail.update(part)
        if state is not None:
            detail["state"] = state
        return detail

    async def run_phase(self, record: ActionRecord, phase: str) -> dict[str, Any]:
        if phase == "stop":
            return await self._save_and_stop(record)
        if phase == "requeue":
            return await self._requeue(record)
        if phase == "restart":
            follow = self.resume_deadline_s > 0
            return await self.in_allocation.restart(record, self._requeue_excluding, follow=follow)
        if phase == "resume":
            return await self._resume(record)
        raise ValueError(f"checkpoint_restart has no phase {phase!r}")

    async def _save_and_stop(self, record: ActionRecord) -> dict[str, Any]:
        job = record.request.target
        job_record = self._state.jobs.get(job)
        ranks = sorted(job_record.ranks) if job_record else []
        detail: dict[str, Any] = {"job": job, "ranks": ranks, "nodes": job_record.nodes if job_record else []}
        escalated = False
        stop = bool(record.request.params.get("stop", record.request.kind != ActionKind.CHECKPOINT))
        detail["stop"] = stop
        if not ranks:
            if job_record is not None and job_record.supervisors:
                # Its rank supervisors (ftd run) are its client: the ranks already ended (a crash),
                # nothing to save; never the scheduler's signal convention, which would end the
                # whole allocation, spares included.
                detail["note"] = "no rank of this job is running: its rank supervisors restart it"
                return detail
            if self.clientless is not None:
                detail.update(await self.clientless.save_and_stop(job, stop=stop))
                return detail
            detail["note"] = "no ranks of this job are registered with any agent: nothing to save"
            return detail

        infos = [r for rs in job_record.ranks_by_node.values() for r in rs] if job_record else []
        detail["runs"] = sorted({r.run for r in infos if r.run is not None})  # the run being stopped
        asked = record.request.params
        decision = self._against_deadline(job, asked, detail)
        save_wait_s, stop_wait_s = self.save_deadline_s, self.stop_deadline_s
        if decision is not None:
            # The real time left (issue #37), not the fixed deadlines.
            save_wait_s = decision.save_wait_s
            stop_wait_s = max(1.0, float(asked["deadline"]) - time.time())
            if decision.choice == "none":
                verified = [self._state.checkpoints.newest_verified(job, lvl) for lvl in LEVELS]
                newest = max((v[0] for v in verified if v is not None), default=None)
                detail["resume_from_step"] = newest  # the catalogue's newest verified, None: unknown
                why = f"{decision.reason} (step {newest})" if newest is not None else decision.reason
                asked = {**asked, "save": False, "no_save_reason": why}
            elif decision.level != DEFAULT_LEVEL:
                asked = {**asked, "save_level": decision.level}
        if asked.get("save") is False:
            why = asked.get("no_save_reason") or "the rule asked to stop without a save"
            detail["save_skipped"] = str(why)
            log.warning("save_skipped", job=job, why=detail["save_skipped"])
            if stop:
                await self._send(record, "stop", stop_wait_s)
                # A hung job restarted (a hang verdict): its ranks cannot stop themselves (a stopped
                # process, a loop stuck in a collective never reads the stop); the restart ends them
                # (ftd run's supervisors, or the scheduler's requeue). Waiting the whole stop deadline
                # for them cost every hung job that much (ftd bench culprit: 30 s of a 37 s recovery).
                hung = bool(asked.get("hang_verdict")) and asked.get("requeue") is not False
                wait_s = min(stop_wait_s, HUNG_STOP_WAIT_S) if hung else stop_wait_s
                detail["stopped"] = await self._wait_job_gone(job, wait_s)
                detail["stopped_at"] = time.time()
                if hung and not detail["stopped"]:
                    detail["stop_not_awaited"] = (
                        f"hung ranks cannot stop themselves; after {wait_s:g}s the restart ends them"
                    )
                elif not detail["stopped"]:
                    detail["state"] = str(ActionState.ESCALATED)
            return detail
        target = save_at_step(infos, self.save_step_margin, self.save_step_lead_s)
        params: dict[str, Any] = {"save_at_step": target} if target is not None else {}
        if isinstance(asked.get("save_path"), str) and asked["save_path"]:
            params["save_path"] = detail["save_path"] = asked["save_path"]
        detail["save_at_step"] = target
        level = save_level(asked, stop)
        if decision is not None and decision.level == DEFAULT_LEVEL:
            level = None  # time for the job's own save (its tier's schedule), not the fast level
        if level is not None:  # issue #34: a save before ftd acts goes to the fast level
            params["level"] = detail["save_level"] = level
        started = time.monotonic()
        save_id = await self._send(record, "save", save_wait_s, params)
        outcome, gone = await self._wait_save(job, save_id, ranks, save_wait_s)
        if outcome.complete:
            self.save_times.record(job, level, time.monotonic() - started)
        if gone:
            detail["save_ranks_gone"] = gone
        detail["saved"] = {str(r): {"step": a.step, "path": a.path} for r, a in sorted(outcome.acked.items())}
        acked = {r: a.step for r, a in outcome.acked.items()}
        steps = set(acked.values())
        detail["save_step"] = steps.pop() if len(steps) == 1 else sorted(s for s in steps if s is not None)
        if len(set(acked.values())) > 1:
            # Ranks saved different steps: no checkpoint of one step exists on every rank. Never call
            # this a success; resume from the newest step every rank has.
            escalated = True
            detail["save_steps_differ"] = {str(r): s for r, s in sorted(acked.items())}
            log.warning("save_steps_differ", job=job, steps=detail["save_steps_differ"])
        if outcome.complete:
            detail["resume_step"] = resume_step(acked)
        if not outcome.complete:
            escalated = True
            detail["save_missing"] = sorted(outcome.missing)
            detail["save_failed"] = {str(r): a.reason for r, a in outcome.nacked.items()}
            if stop:
                log.warning(
                    "save_incomplete_stopping_anyway",
                    job=job,
                    missing=sorted(outcome.missing),
                    nacked=sorted(outcome.nacked),
                )
        if stop:
            resume = detail.get("resume_step")
            if decision is not None:
                stop_wait_s = max(1.0, float(asked["deadline"]) - time.time())
            await self._send(
                record, "stop", stop_wait_s, {"resume_step": resume} if resume is not None else None
            )
            detail["stopped"] = await self._wait_job_gone(job, stop_wait_s)
            detail["stopped_at"] = time.time()
            escalated = escalated or not detail["stopped"]
        if escalated:
            detail["state"] = str(ActionState.ESCALATED)
        return detail

    def _against_deadline(
        self, job: str, asked: dict[str, Any], detail: dict[str, Any]
    ) -> SaveDecision | None:
        """The decision against an interruption's deadline (issue #37) when the request carries one
        (``params["deadline"]``, epoch seconds), made now with the job's recorded save times; None
        without a deadline or with one the decision refuses (logged: the usual save and stop run)."""
        deadline = asked.get("deadline")
        if deadline is None:
            return None
        usual = asked.get("save_level") if isinstance(asked.get("save_level"), str) else None
        try:
            decision = decide_save(time.time(), deadline, self.save_times.p95(job), usual, self.stop_margin_s)
        except BadDeadline as err:
            detail["deadline_refused"] = err.reason
            log.error("interruption_deadline_refused", job=job, deadline=deadline, why=err.reason)
            return None
        detail["deadline_decision"] = decision.as_params()
        log.info("interruption_save_decided", job=job, **decision.as_params())
        return decision

    async def _wait_save(
        self, job: str, save_id: str, ranks: list[int], wait_s: float | None = None
    ) -> tuple[AckOutcome, list[int]]:
        """Every rank's answer to the save, up to ``save_deadline_s`` -- but once a rank that has not
        answered has left its agent (the job's presence no longer lists it: its process ended), at most
        ``save_rank_lost_grace_s`` more (a rank on a node gone offline counts as left: :meth:`_live_ranks`):
        a dead rank never acks, and in a synchronous job its peers are
        blocked in a collective with it, so they never reach the save step either. Waiting the whole
        deadline made a killed rank's recovery slower than torchrun's restart (``ftd bench recovery``,
        rank_killed: 31-33 s against 9-15 s, issue #31). Returns the outcome and the ranks gone."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.save_deadline_s if wait_s is None else wait_s)
        gone: list[int] = []
        while True:
            outcome = await self._acks.wait(
                save_id, ranks, max(0.0, min(deadline - loop.time(), _GONE_POLL_S))
            )
            if not outcome.missing or loop.time() >= deadline:
                return outcome, gone
            if not gone:
                present = self._live_ranks(job)
                gone = sorted(r for r in outcome.missing if r not in present)
                if gone and not (outcome.missing - set(gone)):
                    # Every silent rank is gone: nobody is left to ack, no grace to give.
                    log.warning("save_rank_gone", job=job, ranks=gone, waiting_s=0.0, why="no rank left")
                    return outcome, gone
                if gone:
                    deadline = min(deadline, loop.time() + self.save_rank_lost_grace_s)
                    log.warning(
                        "save_rank_gone",
                        job=job,
                        ranks=gone,
                        waiting_s=round(max(0.0, deadline - loop.time()), 3),
                        why="a rank that left its agent never acks; its peers wait for it in a collective",
                    )

    async def _requeue(self, record: ActionRecord) -> dict[str, Any]:
        """Requeue with the bad nodes excluded (nothing for a save-only ``checkpoint``)."""
        if not record.detail.get("stop", True):
            return {}
        clientless = record.detail.get("clientless")
        if isinstance(clientless, dict) and clientless.get("finished"):
            # A job without the client that had already completed (exit 0) when asked: nothing to move
            # (requeueing it would run a finished job again).
            return {"requeued": None, "note": f"job already {clientless.get('job_state')}: not requeued"}
        job = record.request.target
        if record.request.params.get("requeue") is False:
            return {"requeued": None, "note": f"job {job} stopped, not requeued: no restart was asked"}
        chosen: dict[str, Any] = {}
        exclude = list(record.request.params.get("exclude") or [])
        job_record = self._state.jobs.get(job)
        if job_record is not None and job_record.supervisors:
            choice = self.in_allocation.plan(record)
            if choice.path != "requeue":
                return choice.detail()  # the "restart" phase starts the new generation
            chosen = choice.detail()  # why not inside the allocation; its bad slot nodes are excluded
            exclude += [n for n in choice.out if n not in exclude]
        out = await self._requeue_excluding(record, exclude)
        return {**chosen, **out}

    async def _requeue_excluding(self, record: ActionRecord, exclude: list[str]) -> dict[str, Any]:
        """Requeue through the scheduler without the nodes of ``exclude`` -- unless the job is pinned to
        one of them (see the module docstring: wait, hold or stop)."""
        job = record.request.target
        if self._scheduler is None:
            return {"requeued": None}
        move = await self._pinned(job, exclude, stopped=_stopped(record))
        if move.action in ("hold", "stop"):
            return await self._keep_off(record, move)
        if move.action == "wait":
            exclude = list(move.keep)
        delay = record.request.params.get("delay_s")
        if isinstance(delay, int | float) and not isinstance(delay, bool) and delay > 0:
            log.info("requeue_delayed", job=job, delay_s=delay)  # crash-loop backoff asked by the rule
            await asyncio.sleep(float(delay))
        await self._scheduler.requeue(job, exclude=exclude)
        requeued_at = self._requeued(job)
        requeued: dict[str, Any] = {"scheduler": self._scheduler.name, "exclude": exclude}
        if delay:
            requeued["delayed_s"] = delay
        out: dict[str, Any] = {"requeued": requeued, "requeued_at": requeued_at}
        refused = move.action == "wait"
        if refused:
            out.update(
                exclude_refused={"nodes": list(move.nodes), "why": move.why},
                pinned=_pinned_detail(move),
                state=str(ActionState.ESCALATED),
            )
        out["in_place"] = not exclude and not refused  # asked to stay on its nodes
        if self._follows(out):
            out["waiting"] = WAITING  # saved with phases_done: what the resume phase is doing
        return out

    def _requeued(self, job: str) -> float:
        """The job was requeued (now): placement and restart history told; returns the time."""
        requeued_at = time.time()
        self._job_moved(job)  # before any rank of the restarted job can register elsewhere
        # A fault of the job from now on is a new occurrence, not the incident that caused this.
        self._state.note_restart(job, requeued_at)
        return requeued_at

    async def _keep_off(self, record: ActionRecord, move: PinnedMove) -> dict[str, Any]:
        """A pinned job whose node stays in service: requeued held (released by
        :mod:`~ftd.coordinator.upkeep.pinned_holds`) or left stopped, never requeued onto that node."""
        job = record.request.target
        pinned = _pinned_detail(move)
        out: dict[str, Any] = {"requeued": None, "in_place": False, "pinned": pinned}
        holder = job_holder(self._scheduler)
        if move.action == "hold" and holder is not None:
            try:
                await holder.requeue_held(job)
            except SchedulerError as exc:  # a --no-requeue job, a scheduler outage: stopped, told
                log.warning("pinned_hold_failed", job=job, error=str(exc))
                move = stop_instead(move, f"holding it failed: {str(exc)[:300]}", stopped=_stopped(record))
                return await self._keep_off(record, move)
            pinned["held_at"] = self._requeued(job)
            pinned["waits_for"] = {n: sorted(set(self._state.condition_kinds.get(n, ()))) for n in move.nodes}
            if not any(pinned["waits_for"].values()):  # nothing to wait for: a human releases it
                out["state"] = str(ActionState.ESCALATED)
            log.warning("pinned_job_held", job=job, nodes=list(move.nodes), why=move.why)
        else:
            out["note"] = f"job {job} stopped, not requeued: pinned to {', '.join(move.nodes)}"
            out["state"] = str(ActionState.ESCALATED)
            log.warning("pinned_job_stopped", job=job, nodes=list(move.nodes), why=move.why)
        return out

    def _follows(self, detail: dict[str, Any]) -> bool:
        """Whether the resume phase follows this requeue: asked in place (no node to exclude; a pinned
        job whose exclusion was refused is escalated already and watched by pending_alert_s)."""
        requeued = detail.get("requeued")
        return (
            self.resume_deadline_s > 0
            and self._scheduler is not None
            and isinstance(requeued, dict)
            and detail.get("in_place") is True
        )

    async def _resume(self, record: ActionRecord) -> dict[str, Any]:
        """Until the job requeued in place trains again, or escalated with what was seen instead."""
        detail = record.detail
        if detail.get("path") in IN_ALLOCATION:
            return await self.in_allocation.resume(record, self.resume_deadline_s)
        if not self._follows(detail) or self._scheduler is None:
            return {}
        job = record.request.target
        requeued_at = float(detail.get("requeued_at") or time.time())
        deadline = requeued_at + self.resume_deadline_s  # wall clock: the same after a restart
        expect_ranks = bool(detail.get("ranks"))
        old_runs = {str(r) for r in detail.get("runs") or []}
        log.info("restart_followed", job=job, deadline_s=self.resume_deadline_s, expect_ranks=expect_ranks)
        while True:
            seen: JobInfo | None = None
            error: str | None = None
            try:
                seen = await self._scheduler.job_info(job)
            except SchedulerError as exc:
                error = str(exc)
            ranks = self._new_ranks(job, old_runs)
            now = time.time()
            if seen is not None and seen.state == "RUNNING" and (ranks or not expect_ranks):
                detail.pop("waiting", None)
                out: dict[str, Any] = {"resumed_at": now, "resumed_on": list(seen.nodes)}
                steps = [r.step for r in ranks if r.step is not None]
                if steps:
                    out["resumed_step"] = min(steps)
                log.info("job_trains_again", job=job, after_s=round(now - requeued_at, 1), **out)
                return out
            if (seen is not None and seen.state in ENDED) or now >= deadline:
                detail.pop("waiting", None)
                sentence = not_resumed(
                    job, seen, error, expect_ranks=expect_ranks, waited_s=now - requeued_at
                )
                log.warning("restart_not_resumed", job=job, why=sentence)
                seen_out = (
                    {"state": seen.state, "reason": seen.reason, "nodes": list(seen.nodes)} if seen else None
                )
                return {"not_resumed": sentence, "resume_seen": seen_out, "state": str(ActionState.ESCALATED)}
            await asyncio.sleep(self.resume_poll_s)

    def _new_ranks(self, job: str, old_runs: set[str]) -> list[RankInfo]:
        """The job's registered ranks that belong to a run other than the one ftd stopped."""
        record = self._state.jobs.get(job)
        ranks = [r for rs in record.ranks_by_node.values() for r in rs] if record else []
        return [r for r in ranks if not old_runs or (r.run is not None and r.run not in old_runs)]

    async def _pinned(self, job: str, exclude: list[str], *, stopped: bool = True) -> PinnedMove:
        """What to do about the nodes of ``exclude`` the job is pinned to (``sbatch -w``): asks the
        scheduler for the job's required nodes and whether each is out of service
        (:func:`~ftd.coordinator.actions.pinned.decide_pinned`). The scheduler cannot say which
        nodes the job is pinned to: the requeue goes on as asked; it cannot say whether a pinned
        node is in service: counted in service (no requeue onto it)."""
        if not exclude or self._scheduler is None:
            return PinnedMove("requeue", keep=tuple(exclude))
        try:
            required = (await self._scheduler.job_info(job)).required
        except SchedulerError as exc:
            log.warning("job_info_unavailable", job=job, error=str(exc))
            return PinnedMove("requeue", keep=tuple(exclude))
        out_of_service: dict[str, str | None] = {}
        for node in sorted(set(exclude) & set(required)):
            try:
                info = await self._scheduler.node_info(node)
            except SchedulerError as exc:
                log.warning("node_info_unavailable", node=node, error=str(exc))
                continue
            if info.drained or info.down:
                out_of_service[node] = f"{info.state}{f' ({info.reason})' if info.reason else ''}"
        move = decide_pinned(
            job,
            exclude=exclude,
            required=required,
            out_of_service=out_of_service,
            conditions=self._state.conditions,
            policy=self.pinned_policy,
            can_hold=job_holder(self._scheduler) is not None,
            stopped=stopped,
        )
        if move.action == "wait":
            log.warning("requeue_exclusion_refused", job=job, pinned=list(move.nodes), why=move.why)
        return move

    def _live_ranks(self, job: str) -> set[int]:
        """The job's ranks that may still answer: all but those on a node whose agent's Last Will
        (``offline``) is older than ``last_will_grace_s`` (``coordinator.offline_grace.last_will_s``,
        the grace after which the node's jobs are moved anyway). A node killed with its agent leaves
        its ranks' presence retained on the bus; waiting for them to ack a save or to leave cost the
        checkpoint bench's kill case the whole save and stop deadlines (71 s, issue #34). An agent
        stopped cleanly (``stopped``: a restart) is coming back: its ranks are still waited for."""
        record = self._state.jobs.get(job)
        if record is None:
            return set()
        now = time.time()
        live: set[int] = set()
        for node, ranks in record.ranks_by_node.items():
            known = self._state.nodes.get(node)
            dead = (
                known is not None
                and known.status == "offline"
                and now - known.last_change >= self.last_will_grace_s
            )
            if not dead:
                live.update(r.rank for r in ranks)
        return live

    async def _wait_job_gone(self, job: str, within_s: float | None = None) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.stop_deadline_s if within_s is None else within_s)
        # The ranks gone (the Prolog's allocation of the job may stay until the job itself ends).
        while self._live_ranks(job):
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True


def _stopped(record: ActionRecord) -> bool:
    """Whether the stop phase stopped the job: its ranks left, or (a job without the client) the
    scheduler's signal was sent and not ignored."""
    clientless = record.detail.get("clientless")
    if isinstance(clientless, dict):
        return not (clientless.get("error") or clientless.get("signal_ignored"))
    return record.detail.get("stopped") is True


def _pinned_detail(move: PinnedMove) -> dict[str, Any]:
    return {"action": move.action, "nodes": list(move.nodes), "why": move.why}


def not_resumed(
    job: str, seen: JobInfo | None, error: str | None, *, expect_ranks: bool, waited_s: float
) -> str:
    """One sentence saying why a job ftd requeued in place is not training again."""
    head = f"job {job} did not train again after ftd restarted it in place:"
    waited = f"{waited_s:.0f} s after the requeue"
    if seen is None:
        return f"{head} the scheduler could not say where it is {waited} ({error or 'no answer'})"
    why = f" ({seen.reason})" if seen.reason and seen.reason not in ("None", "(null)") else ""
    where = f" on {', '.join(seen.nodes)}" if seen.nodes else ""
    if seen.state in ENDED:
        ranks = ", and no rank registered" if expect_ranks else ""
        return f"{head} it ended {seen.state}{why}{where} {waited}{ranks}"
    if seen.state == "RUNNING":
        return f"{head} it is RUNNING{where} but no rank registered {waited}"
    return f"{head} it is still {seen.state}{why} {waited}"


def save_level(asked: dict[str, Any], stop: bool) -> str | None:
    """The checkpoint level a save directive asks for: ``asked["save_level"]`` when it names one,
    else ``local`` (the fast level) when the job stops after the save, else none."""
    level = asked.get("save_level")
    if isinstance(level, str) and level in LEVELS:
        return level
    return "local" if stop else None
