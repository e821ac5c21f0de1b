"""checkpoint_restart inside the allocation (issue #24): the "restart" phase and the resume watch of a
job whose ranks are run by rank supervisors (``ftd run``).

What: after the save and the stop, :meth:`InAllocation.plan` asks :func:`~.in_allocation.choose` for
the path (in place, swap in spares, or the scheduler requeue); :meth:`InAllocation.restart` sends
the ``restart`` directive of the chosen generation to every node with a supervisor of the job
(active, spare, out) and waits (``restart_deadline_s``) until every slot's supervisor reports that
generation running. A slot supervisor that fails (a spare failing its preflight at activation), is
lost, or whose node goes offline, is drained or gets a critical condition meanwhile (a second fault
during the restart) makes that slot need a spare too: the next choice starts generation g+1 without
those nodes, or, when no eligible spare is left, the job is requeued through the scheduler excluding
them (``detail["restart_why"]`` says why). :meth:`InAllocation.resume` waits for a rank of run
``<supervisor run>.gen-{g}`` (:func:`~ftd.client.protocol.generation_run`) to report a step
(``resumed_at``, ``resumed_step``, like a requeued job's resume).

Why this shape: every attempt is written to the action's detail *and persisted* (``persist``, the
ledger) before its directive goes out, so a coordinator restarted mid-phase (or an HA standby taking
over) re-sends the same directive id for the same generation -- supervisors ignore a generation they
already acted on -- and finishes once; without a ledger the next generation is still above any the
supervisors report (:func:`~.in_allocation.next_generation`), so an older generation is never reused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ftd.bus import topics
from ftd.client.protocol import generation_run
from ftd.coordinator.actions.directive import Publish, directive_for, publish_with_retry
from ftd.coordinator.actions.in_allocation import Choice, choose, next_generation
from ftd.coordinator.actions.spare_tests import SpareTests
from ftd.coordinator.ledger.store import LedgerUnavailable
from ftd.coordinator.model.state import ClusterState
from ftd.events import RankInfo, SupervisorInfo, encode
from ftd.logs import get_logger
from ftd.plugin.actions import ActionRecord, ActionState
from ftd.plugin.view import JobRecord

log = get_logger(__name__)

DEFAULT_RESTART_DEADLINE_S = 120.0
Persist = Callable[[ActionRecord], Awaitable[None]]
#: Requeue through the scheduler (checkpoint_restart's own code): the job, the nodes to exclude.
Requeue = Callable[[ActionRecord, list[str]], Awaitable[dict[str, Any]]]
IN_ALLOCATION = ("in_place", "spare")
WAITING = "waiting for the job to train again"
#: A slot's supervisor states that mean it started the generation's ranks: ``exited`` too (they
#: started, then ended: done, or an application fault the rules judge as a new incident; the resume
#: phase escalates when no rank of the generation ever reports a step). Never a reason to burn a spare.
STARTED = frozenset({"running", "exited"})


class InAllocation:
    def __init__(
        self,
        *,
        publish: Publish,
        state: ClusterState,
        restart_deadline_s: float = DEFAULT_RESTART_DEADLINE_S,
        persist: Persist | None = None,
        allow_unchecked: bool = False,
        poll_s: float = 0.05,
    ) -> None:
        self._publish = publish
        self._state = state
        self.restart_deadline_s = restart_deadline_s
        self.persist = persist
        self.allow_unchecked = allow_unchecked
        self.poll_s = poll_s
        # issue #35: spares pair-tested against the job's nodes first (coordinator.fabric.test_spares)
        self.spare_tests: SpareTests | None = None

    # --- the path ----------------------------------------------------------------------------

    def unfit(self, record: ActionRecord, job: JobRecord | None) -> dict[str, str]:
        """The nodes that may not hold a slot of this job now, each with why."""
        params = record.request.params
        why: dict[str, str] = {}
        for key in ("exclude", "avoid"):
            for node in params.get(key) or []:
                why.setdefault(str(node), f"the rule asked to {key} it")
        for node, reason in (record.detail.get("unfit") or {}).items():
            why.setdefault(str(node), str(reason))
        nodes = set(job.supervisors) if job else set()
        for node in sorted(nodes):
            bad = self._node_trouble(node)
            if bad:
                why.setdefault(node, bad)
            info = job.supervisors[node] if job else None
            if info is not None and info.role == "spare":
                # issue #35: a spare whose newest pair test (with the job's nodes, when it had one)
                # was slow or failed does not join the job
                active = [n for n, i in job.supervisors.items() if i.role == "active"] if job else []
                slow = self._state.pairs.trouble(node, active)
                if slow:
                    why.setdefault(node, slow)
            if info is not None and info.role == "active" and info.state in ("failed", "lost"):
                why.setdefault(node, f"its supervisor is {info.state}{_reason(info)}")
            elif info is not None and info.role == "out":
                why.setdefault(node, "the job swapped it out")
            elif info is not None and info.role == "spare":
                drift = self._state.inventory.blocks_spare(node)  # coordinator.drift.action = no_spare
                if drift:
                    why.setdefault(node, drift)
        return why

    def _node_trouble(self, node: str) -> str | None:
        state = self._state
        record = state.nodes.get(node)
        if record is not None and not record.online:
            return "offline"
        if record is not None and record.drained_by_ftd:
            return f"drained by ftd ({record.drain_reason})"
        if node in state.unavailable:
            return f"out of service ({state.unavailable[node]})"
        if state.conditions.get(node):
            return f"critical condition ({'; '.join(state.conditions[node])})"
        return None

    def _unchecked(self, record: ActionRecord) -> bool:
        """Whether a spare never preflighted may be chosen (the executor's setting or the rule's
        ``params.unchecked_spares``); it runs its preflight when activated either way."""
        return self.allow_unchecked or record.request.params.get("unchecked_spares") is True

    def plan(self, record: ActionRecord) -> Choice:
        """The path for the stopped job (see :func:`~.in_allocation.choose`)."""
        job = self._state.jobs.get(record.request.target)
        supervisors = dict(job.supervisors) if job else {}
        asked = record.request.params.get("restart")
        requeue_asked = None
        if asked == "requeue":
            requeue_asked = str(record.request.params.get("restart_reason") or "a job-wide fault")
        choice = choose(
            job.slots if job else [],
            supervisors,
            self.unfit(record, job),
            generation=next_generation(supervisors),
            requeue_asked=requeue_asked,
            allow_unchecked=self._unchecked(record),
        )
        log.info("restart_path_chosen", job=record.request.target, path=choice.path, why=choice.why)
        return choice

    # --- the restart phase -------------------------------------------------------------------

    async def restart(self, record: ActionRecord, requeue: Requeue, *, follow: bool) -> dict[str, Any]:
        """Start the chosen generation on every slot and wait until each runs it (module docstring);
        ``follow``: the resume phase watches for the first step (``detail["waiting"]`` says so)."""
        detail = record.detail
        if detail.get("path") not in IN_ALLOCATION:
            return {}
        job = record.request.target
        asked = record.request.params.get("delay_s")
        delay = float(asked) if isinstance(asked, int | float) and not isinstance(asked, bool) else 0.0
        if delay > 0 and "restart_sent" not in detail:  # a crash-loop backoff, before the first start
            log.info("restart_delayed", job=job, delay_s=delay)
            await asyncio.sleep(delay)
        while True:
            generation = int(detail["generation"])
            slots = [str(n) for n in detail["slots"]]
            if detail.get("restart_sent") != generation and self._superseded(job, generation):
                # Not recorded as sent, yet a supervisor runs a newer generation: a retry went out
                # that the ledger never kept (no persist). Plan again above it, never reuse one.
                choice = self._replan(record, slots, generation)
                if choice.path != "requeue":
                    detail.update(choice.detail())
                    continue
            if (
                detail.get("path") == "spare"
                and detail.get("restart_sent") != generation
                and self.spare_tests
            ):
                # issue #35: each spare is pair-tested against its new neighbours before it joins
                rejected = await self.spare_tests.unfit(record)
                if rejected:
                    log.warning("restart_spares_unfit", job=job, generation=generation, unfit=rejected)
                    moved = await self._plan_without(record, slots, generation, rejected, requeue)
                    if moved is not None:
                        return moved
                    continue
            if detail.get("restart_sent") != generation:  # a resumed action re-sends, never re-plans
                detail["restart_sent"] = generation
                detail["restart_sent_at"] = time.time()
                await self._persist(record)  # before the directive: a restart resumes this attempt
            await self._send(record, generation)
            failed = await self._wait_running(job, generation, slots, float(detail["restart_sent_at"]))
            if not failed:
                now = time.time()
                log.info("generation_running", job=job, generation=generation, slots=slots)
                self._state.note_restart(job, now)  # later faults are a new occurrence
                out: dict[str, Any] = {"restarted_at": now, "running_generation": generation}
                if follow:
                    out["waiting"] = WAITING
                return out
            log.warning("restart_slots_failed", job=job, generation=generation, failed=failed)
            self._quarantine_if_resume_crashed(record, slots, failed)
            moved = await self._plan_without(record, slots, generation, failed, requeue)
            if moved is not None:
                return moved

    async def _plan_without(
        self,
        record: ActionRecord,
        slots: list[str],
        generation: int,
        failed: dict[str, str],
        requeue: Requeue,
    ) -> dict[str, Any] | None:
        """Plan the attempt after ``generation`` with ``failed`` (node -> why) unfit: ``None`` when it
        stays inside the allocation (the plan is in ``detail``), else the scheduler requeue's result."""
        detail = record.detail
        unfit = dict(detail.get("unfit") or {})
        unfit.update(failed)
        tries = list(detail.get("restart_failures") or [])
        tries.append({"generation": generation, "failed": failed})
        detail["unfit"] = unfit
        detail["restart_failures"] = tries
        choice = self._replan(record, slots, generation)
        log.info(
            "restart_path_chosen", job=record.request.target, path=choice.path, why=choice.why, retry=True
        )
        if choice.path == "requeue":
            exclude = sorted(set(record.request.params.get("exclude") or []) | set(unfit))
            detail.update(choice.detail())
            moved = await requeue(record, exclude)
            moved["path"] = "requeue"
            moved["restart_why"] = choice.why
            moved["state"] = str(ActionState.ESCALATED)  # the in-allocation restart did not work
            return moved
        detail.update(choice.detail())
        return None

    async def _persist(self, record: ActionRecord) -> None:
        """Write the attempt to the ledger. A ledger that is down does not hold the restart up (the
        job is stopped: every second counts); a restarted coordinator then plans above the newest
        generation the supervisors report instead. Fenced (another coordinator leads) propagates."""
        if self.persist is None:
            return
        try:
            await self.persist(record)
        except LedgerUnavailable as exc:
            log.warning(
                "restart_not_persisted",
                action_id=record.id,
                generation=record.detail.get("generation"),
                error=str(exc),
                effect="a coordinator restart re-plans above the generation the supervisors report",
            )

    def _replan(self, record: ActionRecord, slots: list[str], generation: int) -> Choice:
        """The next attempt after ``generation`` on ``slots``: its bad slots get spares (or requeue)."""
        job = self._state.jobs.get(record.request.target)
        supervisors = dict(job.supervisors) if job else {}
        return choose(
            slots,
            supervisors,
            self.unfit(record, job),
            generation=next_generation(supervisors, at_least=generation + 1),
            allow_unchecked=self._unchecked(record),
        )

    def _choose_checkpoint(self, record: ActionRecord) -> None:
        """Where the new generation resumes from (issue #34): the newest checkpoint verified on every
        rank that the restart can read, from the agents' ``checkpoint`` reports; the nodes swapped out,
        excluded or unfit count as lost (their disks are not read). Only for a job that reports its
        checkpoints: for the others, the step from the save's acknowledgements stands, as before.
        ``detail["resume"]`` says step, level, path and why; ``resume_step`` follows it."""
        detail = record.detail
        job = record.request.target
        lost = set(detail.get("out") or []) | set(detail.get("unfit") or {})
        lost |= set(record.request.params.get("exclude") or [])
        choice = self._state.checkpoints.choose(job, lost)
        if choice is None:
            if job in self._state.checkpoints.jobs():
                detail["resume"] = {"step": None, "why": "no checkpoint verified on every rank can be read"}
            return
        acked = detail.get("resume_step")
        if "resume_from_acks" not in detail:
            detail["resume_from_acks"] = acked
        detail["resume"] = choice.as_params()
        detail["resume_step"] = choice.step
        log.info("resume_checkpoint_chosen", job=job, acked_step=acked, **choice.as_params())

    def _quarantine_if_resume_crashed(
        self, record: ActionRecord, slots: list[str], failed: dict[str, Any]
    ) -> None:
        """Every slot of a generation that resumed from a verified checkpoint failed: the checkpoint
        is suspect, not the nodes (one slot failing is a node's trouble). The step is quarantined so
        the next attempt resumes from the previous verified one (issue #34)."""
        resume = record.detail.get("resume")
        step = resume.get("step") if isinstance(resume, dict) else None
        if not isinstance(step, int) or not slots or set(slots) - set(failed):
            return
        why = f"every slot failed resuming from it ({', '.join(sorted(failed))})"
        self._state.checkpoints.quarantine(record.request.target, step, why)
        quarantined = record.detail.setdefault("quarantined", {})
        quarantined[str(step)] = why
        log.warning("checkpoint_quarantined", job=record.request.target, step=step, why=why)

    def _superseded(self, job: str, generation: int) -> bool:
        record = self._state.jobs.get(job)
        return record is not None and (record.generation or 0) > generation

    async def _send(self, record: ActionRecord, generation: int) -> None:
        detail = record.detail
        job = record.request.target
        state = self._state.jobs.get(job)
        slots = [str(n) for n in detail["slots"]]
        head = state.supervisors.get(slots[0]) if state and slots else None
        self._choose_checkpoint(record)
        chosen = detail.get("resume")
        resume: dict[str, Any] = chosen if isinstance(chosen, dict) else {}
        params = {
            "generation": generation,
            "slots": slots,
            "master_addr": head.addr if head is not None and head.addr else slots[0],
            "resume_step": detail.get("resume_step"),
            "out": list(detail.get("out") or []),
            "path": detail["path"],
            # Each node's supervisor run: one of a later run (the job requeued meanwhile) ignores it.
            "runs": {n: s.run for n, s in sorted(state.supervisors.items()) if s.run} if state else {},
        }
        if resume.get("level"):  # the verified checkpoint chosen (issue #34): ftd run tells the ranks
            params["resume_level"] = resume["level"]
            params["resume_path"] = resume.get("path") or ""
        directive = directive_for(
            record,
            "restart",
            suffix=f"restart-g{generation}",
            job=job,
            deadline_s=self.restart_deadline_s,
            params=params,
        )
        nodes = sorted(set(state.supervisors) | set(slots)) if state else slots
        for topic in topics.job_directives_for(nodes):
            await publish_with_retry(self._publish, topic, encode(directive), self.restart_deadline_s)
        log.info("restart_sent", job=job, directive=directive.id, nodes=nodes, **params)

    async def _wait_running(
        self, job: str, generation: int, slots: list[str], sent_at: float
    ) -> dict[str, str]:
        """{} once every slot runs ``generation``; else the slot nodes that will not, with why."""
        deadline = sent_at + self.restart_deadline_s  # wall clock: a resumed wait never extends it
        while True:
            record = self._state.jobs.get(job)
            failed: dict[str, str] = {}
            waiting: list[str] = []
            for index, node in enumerate(slots):
                info = record.supervisors.get(node) if record else None
                trouble = self._node_trouble(node)
                if trouble:
                    failed[node] = trouble
                elif info is not None and info.state in ("failed", "lost"):  # never so when chosen
                    failed[node] = f"its supervisor is {info.state}{_reason(info)}"
                elif not (
                    info is not None
                    and info.role == "active"
                    and info.slot == index
                    and info.generation == generation
                    and info.state in STARTED
                ):
                    waiting.append(node)
            if failed:
                return failed
            if not waiting:
                return {}
            if time.time() >= deadline:
                return {
                    n: f"did not report generation {generation} running within {self.restart_deadline_s:g} s"
                    for n in waiting
                }
            await asyncio.sleep(self.poll_s)

    # --- the resume watch --------------------------------------------------------------------

    async def resume(self, record: ActionRecord, deadline_s: float) -> dict[str, Any]:
        """Until a rank of the new generation reports a step (escalated with what was seen instead)."""
        detail = record.detail
        generation = detail.get("running_generation")
        if detail.get("path") not in IN_ALLOCATION or not isinstance(generation, int) or deadline_s <= 0:
            return {}
        job = record.request.target
        started = float(detail.get("restarted_at") or time.time())
        deadline = started + deadline_s
        while True:
            ranks = self._ranks_of(job, generation)
            steps = [r.step for r in ranks if r.step is not None]
            now = time.time()
            if steps:
                detail.pop("waiting", None)
                out = {"resumed_at": now, "resumed_step": min(steps), "resumed_on": list(detail["slots"])}
                log.info("job_trains_again", job=job, generation=generation, after_s=round(now - started, 2))
                return out
            if self._finished(job, generation, detail["slots"]):
                # It trained to its end before any rank's step report came (a short last stretch):
                # the restart worked -- never "did not train again" after a wait of the deadline.
                detail.pop("waiting", None)
                log.info("job_finished_after_restart", job=job, generation=generation)
                return {"resumed_at": now, "resumed_on": list(detail["slots"]), "finished": True}
            if now >= deadline:
                detail.pop("waiting", None)
                sentence = (
                    f"job {job} did not train again after ftd restarted it in its allocation: generation "
                    f"{generation} runs on {', '.join(detail['slots'])} but {len(ranks)} of its ranks "
                    f"registered and none reported a step {now - started:.0f} s after"
                )
                log.warning("restart_not_resumed", job=job, why=sentence)
                return {"not_resumed": sentence, "state": str(ActionState.ESCALATED)}
            await asyncio.sleep(self.poll_s)

    def _finished(self, job: str, generation: int, slots: list[str]) -> bool:
        """Every slot's supervisor reports ``generation``'s ranks exited 0 (the job's training ended)."""
        record = self._state.jobs.get(job)
        if record is None or not slots:
            return False
        infos = [record.supervisors.get(node) for node in slots]
        return all(
            i is not None and i.generation == generation and i.state == "exited" and i.exit_code == 0
            for i in infos
        )

    def _ranks_of(self, job: str, generation: int) -> list[RankInfo]:
        """The ranks of ``generation``: on each node, those whose run is the one that node's supervisor
        gives them (``<its run>.gen-<g>``: a requeued job's generation 0 is not the old one's)."""
        record = self._state.jobs.get(job)
        if record is None:
            return []
        out: list[RankInfo] = []
        for node, ranks in record.ranks_by_node.items():
            supervisor = record.supervisors.get(node)
            run = generation_run(supervisor.run if supervisor is not None else "", generation)
            out.extend(r for r in ranks if r.run == run)
        return out


def _reason(info: SupervisorInfo) -> str:
    return f": {info.reason}" if info.reason else ""
