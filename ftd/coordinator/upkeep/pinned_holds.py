"""Pinned jobs ftd held: told once, released when the node's condition clears (issue #31, item 3).

What: a ``checkpoint_restart`` that met a job pinned to the node it had to leave
(:mod:`ftd.coordinator.actions.pinned`) keeps its choice in ``detail["pinned"]``. Once the action
has finished:

* its sentence (``pinned.why``: held, stopped, or waiting for the node to return to service) is
  notified once (a ``notify`` action, rule :data:`RULE`): what the operator reads is what happens;
* a *held* job is watched each reconciliation round (:meth:`PinnedHolds.check`, called by
  :class:`~ftd.coordinator.upkeep.reconcile.Reconciler`): once none of the condition kinds it waits
  for (``pinned.waits_for``: node -> the kinds of the node's active critical conditions when it was
  held, as its agent publishes them) is active on any of its nodes, and those nodes' agents are
  online (an offline agent's conditions are not news), ftd releases it through the scheduler
  (``scontrol release``) and it runs again on its node. A hold that waits for nothing known (no
  condition reported, or an agent too old to name their kinds) stays for an operator.
  Someone else releasing or cancelling the job ends the watch as well.
  The release is written into the same action's ``detail["pinned"]["released"]`` (``by``
  ``ftd`` / ``other``, ``at``, ``why``) and saved in the ledger, and notified.

Why in the ledger: a coordinator restarted while a job is held finds the hold again in the recent
actions (:meth:`PinnedHolds.restore`) and releases it when the condition clears; a hold released
before the restart carries ``released`` and is not watched again. A restored hold is first checked
one ``settle_s`` after the start, once the agents' retained conditions have arrived (before them,
no condition at all would read as "cleared").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ftd.coordinator.actions.scheduler import Scheduler, SchedulerError, job_holder
from ftd.coordinator.ledger.store import LedgerStore
from ftd.coordinator.model.state import ClusterState
from ftd.logs import get_logger
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest

if TYPE_CHECKING:
    from ftd.coordinator.decide.engine import Engine

log = get_logger(__name__)

RULE = "pinned_jobs"
LOOKBACK_S = 7 * 86400.0  # holds older than this are not watched again after a restart
UNKNOWN_KIND = "unknown"


def still_active(
    waits_for: Mapping[str, list[str]], current: Mapping[str, list[str]]
) -> dict[str, list[str]]:
    """The kinds a hold waits for that are still active, by node (empty: all cleared). ``current``:
    each node's active condition kinds now. A node waited on for an unknown kind (an older agent)
    counts as clear only once it has no active condition at all."""
    out: dict[str, list[str]] = {}
    for node, kinds in waits_for.items():
        now = current.get(node, [])
        left = sorted(set(now)) if UNKNOWN_KIND in kinds else sorted(set(kinds) & set(now))
        if left:
            out[node] = left
    return out


def _pinned(record: ActionRecord) -> dict[str, Any] | None:
    pinned = record.detail.get("pinned")
    if record.request.kind != ActionKind.CHECKPOINT_RESTART or not isinstance(pinned, dict):
        return None
    return pinned


def _waits_for(pinned: Mapping[str, Any]) -> dict[str, list[str]]:
    raw = pinned.get("waits_for")
    if not isinstance(raw, dict):
        return {}
    return {str(n): [str(k) for k in kinds] for n, kinds in raw.items() if isinstance(kinds, list)}


class PinnedHolds:
    """Notify what happened to pinned jobs; release the held ones when their condition clears."""

    def __init__(
        self,
        *,
        state: ClusterState,
        ledger: LedgerStore,
        scheduler: Scheduler | None,
        engine: Engine,
        settle_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self.ledger = ledger
        self.scheduler = scheduler
        self.engine = engine
        self.settle_s = settle_s
        self.clock = clock
        self.held: dict[str, ActionRecord] = {}  # job -> the action that held it
        self._not_before: dict[str, float] = {}  # job -> first check (restored holds)
        self._notified: set[str] = set()  # action ids whose sentence was notified
        self._tasks: set[asyncio.Task[Any]] = set()

    async def restore(self) -> None:
        """The holds not released yet, from the ledger's recent actions (their notification was sent
        by the coordinator that held them)."""
        for record in await self.ledger.recent(self.clock() - LOOKBACK_S):
            pinned = _pinned(record)
            if pinned is None or not record.state.finished:
                continue
            self._notified.add(record.id)
            if pinned.get("action") == "hold" and "held_at" in pinned and "released" not in pinned:
                self.held[record.request.target] = record
                self._not_before[record.request.target] = self.clock() + self.settle_s
        if self.held:
            log.info("pinned_holds_restored", jobs=sorted(self.held))

    def observe(self, record: ActionRecord) -> None:
        """A finished restart that met a pinned job: notify its sentence once; watch a hold."""
        pinned = _pinned(record)
        if pinned is None or not record.state.finished or record.id in self._notified:
            return
        self._notified.add(record.id)
        job = record.request.target
        if pinned.get("action") == "hold" and "held_at" in pinned:
            self.held[job] = record
        self._notify(record, str(pinned.get("why") or ""), pinned)

    def _notify(self, record: ActionRecord, sentence: str, pinned: Mapping[str, Any]) -> None:
        """Submitted as a task: an observer runs inside a decision and must not call back into it."""
        if not sentence or ActionKind.NOTIFY not in self.engine.executors:
            return
        job = record.request.target
        request = ActionRequest(
            kind=ActionKind.NOTIFY,
            target=job,
            reason=sentence,
            params={"job": job, "action_id": record.id, "pinned": dict(pinned)},
            rule=RULE,
            event_id=record.request.event_id,
        )
        task = asyncio.create_task(self.engine.submit(request), name=f"notify-pinned:{record.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Wait for the notifications submitted so far (tests)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def check(self) -> list[str]:
        """One round: release each held job whose conditions cleared; returns the jobs released."""
        released: list[str] = []
        holder = job_holder(self.scheduler)
        now = self.clock()
        for job, record in sorted(self.held.items()):
            if holder is None or now < self._not_before.get(job, 0.0):
                continue
            pinned = _pinned(record) or {}
            try:
                info = await holder.job_info(job)
            except SchedulerError as exc:
                log.warning("pinned_hold_unknown", job=job, error=str(exc))
                continue  # the scheduler may be down: asked again next round
            if not info.held:
                why = f"no longer held ({info.state}{f', {info.reason}' if info.reason else ''})"
                await self._released(record, pinned, by="other", why=why)
                continue
            waits_for = _waits_for(pinned)
            if not any(waits_for.values()):
                continue  # nothing known to wait for: an operator releases it
            if not all(self.state.nodes.get(n) is not None and self.state.nodes[n].online for n in waits_for):
                continue  # an offline agent's conditions are not news
            left = still_active(waits_for, self.state.condition_kinds)
            if left:
                continue
            try:
                await holder.release(job)
            except SchedulerError as exc:
                log.warning("pinned_release_failed", job=job, error=str(exc))
                continue
            kinds = sorted({k for ks in waits_for.values() for k in ks})
            why = f"{', '.join(kinds)} cleared on {', '.join(sorted(waits_for))}: ftd released job {job}"
            await self._released(record, pinned, by="ftd", why=why)
            self._notify(record, f"job {job} released: {why.split(':')[0]}; it runs there again", pinned)
            released.append(job)
        return released

    async def _released(self, record: ActionRecord, pinned: dict[str, Any], *, by: str, why: str) -> None:
        job = record.request.target
        self.held.pop(job, None)
        self._not_before.pop(job, None)
        pinned["released"] = {"by": by, "at": self.clock(), "why": why}
        record.detail["pinned"] = pinned
        record.updated = self.clock()
        await self.ledger.save_action(record)
        log.info("pinned_job_released", job=job, by=by, why=why, action_id=record.id)
