"""Release a finished job's hot spares (``ftd run``, issue #24): when its training has ended, the
supervisors that hold no slot (spares, nodes swapped out) are told to exit 0.

What: :func:`spares_to_release` (pure) reads a job's supervisors as the coordinator sees them: the
training ended when an active slot supervisor of the newest generation reports ``exited`` with code
0 (its ranks all exited 0 on their own: the training command finished) and no slot supervisor of
that generation still starts or runs ranks; then every spare or out supervisor still there (not
``exited``, not ``lost``) is released. :class:`SpareRelease` sends one ``release`` directive per job
and generation to those nodes' job directive topics, with each node's supervisor run (a supervisor
of a later run of the job ignores it).

Why: a spare's supervisor never ends on its own -- it waits for a slot. Under ``srun`` the job step
ends only when every task has, and a Kubernetes indexed Job completes only when every pod has, so
without this a finished job would hold its allocation until its time limit (the earlier launch
recipe's ``srun --wait=N`` ended the step N s after *any* task ended, which also ended a recovered
job N s after a supervisor was killed). Only the coordinator sees every node of the job. Nothing here
touches a node that trains: a release reaches supervisors only, and one holding a slot ignores it.
A coordinator restarted after the training ended sends it again from the retained presence: the
supervisors already gone do not care, one still waiting exits.
"""

from __future__ import annotations

import time
from typing import Any

from ftd.bus import topics
from ftd.coordinator.actions.directive import Publish, publish_with_retry
from ftd.events import Directive, encode
from ftd.logs import get_logger
from ftd.plugin.view import JobRecord

log = get_logger(__name__)

__all__ = ["SpareRelease", "spares_to_release"]

RUNNING = frozenset({"idle", "starting", "running", "stopped"})
"""Slot supervisor states that mean the generation may still train (or restart)."""
GONE = frozenset({"exited", "lost"})
RELEASE_DEADLINE_S = 30.0  # the directive's deadline at the agent
RELEASE_SEND_S = 5.0  # how long a send may retry while the bus is down (it holds up the presence)


def spares_to_release(record: JobRecord) -> tuple[int, list[str]] | None:
    """(generation, nodes) of the spare and out supervisors to release because the job's training
    ended in that generation; None while it may still train (see the module docstring)."""
    active = [s for s in record.supervisors.values() if s.role == "active"]
    if not active:
        return None
    generation = max(s.generation for s in active)
    current = [s for s in active if s.generation == generation]
    finished = any(s.state == "exited" and s.exit_code == 0 for s in current)
    if not finished or any(s.state in RUNNING for s in current):
        return None
    nodes = sorted(
        n for n, s in record.supervisors.items() if s.role in ("spare", "out") and s.state not in GONE
    )
    return (generation, nodes) if nodes else None


class SpareRelease:
    """Sends each finished job's ``release`` once per generation (see the module docstring)."""

    def __init__(self, publish: Publish) -> None:
        self._publish = publish
        self._sent: dict[str, dict[int, set[str]]] = {}  # job -> generation -> nodes released

    async def check(self, job: str, record: JobRecord | None) -> list[str]:
        """Release what :func:`spares_to_release` says for ``job``; returns the nodes told now."""
        if record is None or not record.supervisors:
            self._sent.pop(job, None)  # the job is gone: forget it
            return []
        due = spares_to_release(record)
        if due is None:
            return []
        generation, nodes = due
        told = self._sent.setdefault(job, {}).setdefault(generation, set())
        new = [n for n in nodes if n not in told]
        if not new:
            return []
        told.update(new)
        runs = {n: s.run for n, s in sorted(record.supervisors.items()) if s.run and n in new}
        params: dict[str, Any] = {"generation": generation, "runs": runs}
        directive = Directive(
            id=f"release-{job}-g{generation}-{len(told)}",
            ts=time.time(),
            action="release",
            job=job,
            reason=f"job {job}'s training ended in generation {generation}: its spares are released",
            deadline_s=RELEASE_DEADLINE_S,
            params=params,
        )
        try:
            for topic in topics.job_directives_for(new):
                await publish_with_retry(self._publish, topic, encode(directive), RELEASE_SEND_S)
        except Exception as exc:  # the bus is down: the next presence of the job tries again
            told.difference_update(new)
            log.warning("spares_release_not_sent", job=job, nodes=new, error=str(exc)[:300])
            return []
        log.info("spares_released", job=job, generation=generation, nodes=new, directive=directive.id)
        return new
