"""checkpoint_restart: save every rank at the same step, stop them, requeue without the bad nodes.

Phases, each recorded in the action's detail:

1. **save** — a ``save`` directive on ``ftd/v1/jobs/{job}/directives``; every agent hosting the job
   relays it to its ranks; wait for every known rank to ack (``save_deadline_s``). A rank that nacks
   or stays silent makes the action *escalated*: the job still has to move, so we go on, and the
   detail names the ranks whose checkpoint is missing.
2. **stop** — a ``stop`` directive; wait (``stop_deadline_s``) until the job's ranks have left their
   agents (the retained job presence empties), so the scheduler does not kill a rank mid-write.
3. **requeue** — through the scheduler, excluding ``params.exclude`` (the faulty nodes).

With ``params["stop"] = False`` (the default for action kind ``checkpoint``) only phase 1 runs: the
job saves and keeps training (a filesystem filling up: save while there is still room).

Directive ids derive from the action id, so a resumed action re-sends the *same* directives and
agents and trainers ignore the repeats.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ftd.bus import topics
from ftd.coordinator.acks import AckBook
from ftd.coordinator.actions._directive import Publish, publish_with_retry
from ftd.coordinator.actions.scheduler import Scheduler
from ftd.coordinator.state import ClusterState
from ftd.events import Directive, DirectiveAction, encode
from ftd.logs import get_logger
from ftd.plugin.actions import ActionKind, ActionRecord, ActionState

log = get_logger(__name__)


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
    ) -> None:
        self._publish = publish
        self._state = state
        self._acks = acks
        self._scheduler = scheduler
        self.save_deadline_s = save_deadline_s
        self.stop_deadline_s = stop_deadline_s

    async def _send(self, record: ActionRecord, action: DirectiveAction, deadline_s: float) -> str:
        job = record.request.target
        directive = Directive(
            id=f"{record.id}-{action}",
            ts=time.time(),
            action=action,
            job=job,
            reason=record.request.reason,
            deadline_s=deadline_s,
            action_id=record.id,
        )
        await publish_with_retry(self._publish, topics.job_directives(job), encode(directive), deadline_s)
        return directive.id

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        job = record.request.target
        job_record = self._state.jobs.get(job)
        ranks = sorted(job_record.ranks) if job_record else []
        detail: dict[str, Any] = {"job": job, "ranks": ranks, "nodes": job_record.nodes if job_record else []}
        escalated = False
        stop = bool(record.request.params.get("stop", record.request.kind != ActionKind.CHECKPOINT))
        if not stop and not ranks:
            detail["stop"] = False
            detail["note"] = "no ranks of this job are registered with any agent: nothing to save"
            return detail

        if ranks:
            save_id = await self._send(record, "save", self.save_deadline_s)
            outcome = await self._acks.wait(save_id, ranks, self.save_deadline_s)
            detail["saved"] = {
                str(r): {"step": a.step, "path": a.path} for r, a in sorted(outcome.acked.items())
            }
            steps = {a.step for a in outcome.acked.values()}
            detail["save_step"] = (
                steps.pop() if len(steps) == 1 else sorted(s for s in steps if s is not None)
            )
            if not stop:
                detail["stop"] = False
                if not outcome.complete:
                    detail["state"] = str(ActionState.ESCALATED)
                    detail["save_missing"] = sorted(outcome.missing)
                return detail  # save only: no stop, no requeue
            if not outcome.complete:
                escalated = True
                detail["save_missing"] = sorted(outcome.missing)
                detail["save_failed"] = {str(r): a.reason for r, a in outcome.nacked.items()}
                log.warning(
                    "save_incomplete_stopping_anyway",
                    job=job,
                    missing=sorted(outcome.missing),
                    nacked=sorted(outcome.nacked),
                )
            await self._send(record, "stop", self.stop_deadline_s)
            detail["stopped"] = await self._wait_job_gone(job)
            escalated = escalated or not detail["stopped"]
        else:
            detail["note"] = "no ranks of this job are registered with any agent: nothing to save"

        exclude = list(record.request.params.get("exclude") or [])
        if self._scheduler is not None:
            await self._scheduler.requeue(job, exclude=exclude)
            detail["requeued"] = {"scheduler": self._scheduler.name, "exclude": exclude}
        else:
            detail["requeued"] = None
        if escalated:
            detail["state"] = str(ActionState.ESCALATED)
        return detail

    async def _wait_job_gone(self, job: str) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.stop_deadline_s
        while job in self._state.jobs:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True
