"""Return to service: a node that was reset comes back only after its preflight passes (issue #12).

Off by default; opted in per rule (``coordinator.return_to_service.rules``: the names of the rules
whose GPU resets take the node out of service and back). For a ``gpu_reset`` decided by such a rule
on node N, :class:`ReturnToService` (an :meth:`~ftd.coordinator.decide.engine.Engine.observe` observer, so
the engine and the reset executor stay as they are) does, each step an ordinary action through the
policy gate and the ledger:

1. ``drain_node`` N at once (reason ``ftd: return-to-service: GPU reset ...``): no new job lands on
   the node while it is reset (the rule's plan still saves and moves the running job first);
2. once the reset is done (``gpu_reset`` succeeded, or escalated to a reboot that cleared it) and
   the drain finished: ``preflight`` on N (:class:`~ftd.coordinator.actions.preflight.Preflight`:
   the agent runs :mod:`ftd.agent.preflight` on a ``preflight`` node directive and answers the verdict);
3. preflight passed -> ``resume_node`` N; failed (or no answer by the deadline) -> ``drain_node`` N
   for RMA, the history in the reason (``ftd: RMA: preflight failed after GPU reset: <why>; history:
   <the reset's reason>; ...``), with ``params.severity = critical`` so the drain cooldown of step 1
   does not hold it back. When the site requires burn-in (``coordinator.return_to_service.require_burn_in``,
   issue #36), a passing preflight is followed by ``burn_in`` on N
   (:class:`~ftd.coordinator.actions.burn_in.BurnIn`): passed -> ``resume_node``; failed, incomplete
   (a step skipped), refused or silent -> the drain for RMA (``RMA: burn-in failed after ...``).
   With ``coordinator.fabric.return_gate`` (issue #35) a ``pair_test`` of N against an idle peer
   (:class:`~ftd.coordinator.actions.pair_test.PairTest`) follows and must pass too.

A node a rule drains as a *suspect* (``drain_node`` with ``params.suspect``: the ``hang`` rule's
culprit of a hang, issue #33) takes the same way back without a reset: once its drain is done,
``preflight``, then ``resume_node`` or the drain for RMA.

A reset that did not work is left to the reset's own escalation (reboot, or drain for RMA): nothing
comes back without a passing preflight. A preflight the policy gate holds back (or a dry run) gives
no verdict: the node stays drained, for a human.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine
from dataclasses import dataclass, field
from typing import Any

from ftd.coordinator.actions.burn_in import BURN_IN
from ftd.coordinator.actions.pair_test import PAIR_TEST
from ftd.coordinator.actions.preflight import PREFLIGHT
from ftd.coordinator.model.state import ClusterState
from ftd.logs import get_logger
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState

log = get_logger(__name__)

RULE = "return_to_service"
#: The checks of a return to service, by their name in reasons and logs, and their action kinds.
_KINDS = {"preflight": PREFLIGHT, "burn-in": BURN_IN, "pair test": PAIR_TEST}
_STEPS = {kind: step for step, kind in _KINDS.items()}
_WHY = {"preflight": "preflight", "burn-in": "burn-in required", "pair test": "pair test with an idle peer"}


@dataclass
class _Node:
    reset_id: str
    reset_reason: str
    rule: str
    drain_id: str | None = None
    drain_done: bool = False
    reset_done: str | None = None  # "GPU reset" / "reboot" once the reset worked
    preflight_id: str | None = None
    burn_in_id: str | None = None
    pair_test_id: str | None = None
    history: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)  # the checks passed so far, in order


class ReturnToService:
    """The observer that sequences drain -> reset -> preflight -> resume or RMA (module docstring)."""

    def __init__(
        self,
        submit: Callable[[ActionRequest], Awaitable[ActionRecord]],
        *,
        rules: Collection[str],
        state: ClusterState | None = None,
        require_burn_in: bool = False,
        pair_gate: bool = False,
    ) -> None:
        self._submit = submit
        self.require_burn_in = require_burn_in
        self.pair_gate = (
            pair_gate  # a passing pair test after the other checks (coordinator.fabric.return_gate)
        )
        self.rules = frozenset(rules)
        self._state = state
        self._nodes: dict[str, _Node] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # steps submitted after the current decision

    def observe(self, what: str, payload: Any) -> None:
        if what != "action" or not isinstance(payload, ActionRecord):
            return
        record = payload
        kind, node = record.request.kind, record.request.target
        if kind == ActionKind.GPU_RESET and record.request.rule in self.rules:
            self._reset(node, record)
        elif (
            kind == ActionKind.DRAIN_NODE
            and record.request.params.get("suspect") is True
            and record.request.rule in self.rules
            and node not in self._nodes
            and record.state in (ActionState.PENDING, ActionState.RUNNING)
        ):
            self._suspect(node, record)
        elif kind == ActionKind.DRAIN_NODE and node in self._nodes:
            track = self._nodes[node]
            if record.id == track.drain_id and record.state.finished:
                track.drain_done = True
                self._maybe_preflight(node)
        elif kind == PREFLIGHT and node in self._nodes and record.state.finished:
            track = self._nodes[node]
            if record.id == track.preflight_id:
                self._verdict(node, track, record)
        elif kind in (BURN_IN, PAIR_TEST) and node in self._nodes and record.state.finished:
            track = self._nodes[node]
            if record.id == getattr(track, f"{kind}_id"):
                self._verdict(node, track, record, step=_STEPS[kind])

    def _soon(self, step: Coroutine[Any, Any, None]) -> None:
        """Run ``step`` once the engine's current decision is over (observers run inside it)."""
        task = asyncio.get_running_loop().create_task(step, name="return-to-service")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Wait for the steps submitted so far (tests, replays)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _later(self, request: ActionRequest) -> None:
        """Submit after the engine's current step (observers run inside it)."""

        async def go() -> None:
            record = await self._submit(request)
            log.info(
                "return_to_service_step",
                kind=request.kind,
                node=request.target,
                action_id=record.id,
                state=str(record.state),
            )
            self.observe("action", record)  # a suppressed step finishes at once

        self._soon(go())

    def _reset(self, node: str, record: ActionRecord) -> None:
        track = self._nodes.get(node)
        if record.state in (ActionState.PENDING, ActionState.RUNNING):
            if track is not None and track.reset_id == record.id:
                return
            track = self._nodes[node] = _Node(record.id, record.request.reason, record.request.rule)
            track.history.append(record.request.reason)
            drain = ActionRequest(
                kind=ActionKind.DRAIN_NODE,
                target=node,
                reason=f"return-to-service: GPU reset ({record.request.reason}); back after preflight",
                params={"severity": "warning", "return_to_service": record.id},
                rule=RULE,
            )
            track.drain_id = f"pending:{record.id}"
            self._later_drain(node, drain)
            return
        if track is None or track.reset_id != record.id or not record.state.finished:
            return
        if record.state == ActionState.SUCCEEDED:
            track.reset_done = "GPU reset"
        elif record.detail.get("reboot_cleared"):
            track.reset_done = "reboot"
        else:  # the reset's own escalation (reboot pending, drain for RMA) keeps the node out
            log.info("return_to_service_abandoned", node=node, reset=record.id, state=str(record.state))
            del self._nodes[node]
            return
        track.history.append(f"{track.reset_done} done")
        self._maybe_preflight(node)

    def _suspect(self, node: str, record: ActionRecord) -> None:
        """A rule drained ``node`` as a suspect (a hang's culprit): no reset, back after a preflight."""
        track = self._nodes[node] = _Node(record.id, record.request.reason, record.request.rule)
        track.history.append(record.request.reason)
        track.drain_id = record.id
        track.reset_done = "suspect drain"

    def _later_drain(self, node: str, request: ActionRequest) -> None:
        async def go() -> None:
            record = await self._submit(request)
            track = self._nodes.get(node)
            if track is None:
                return
            track.drain_id = record.id
            log.info("return_to_service_drain", node=node, action_id=record.id, state=str(record.state))
            if record.state.finished:  # suppressed by the gate (budget, dry run): go on without it
                track.drain_done = True
                self._maybe_preflight(node)

        self._soon(go())

    def _maybe_preflight(self, node: str) -> None:
        track = self._nodes.get(node)
        if track is None or not track.drain_done or track.reset_done is None or track.preflight_id:
            return
        self._check(node, track, "preflight", f"{track.reset_reason}")

    def _next_step(self, step: str) -> str | None:
        """The check after ``step`` passed: the burn-in where the site requires it, then the pair test
        where the pair gate is on; None: the node resumes."""
        order = [
            "preflight",
            *(["burn-in"] if self.require_burn_in else []),
            *(["pair test"] if self.pair_gate else []),
        ]
        at = order.index(step) if step in order else len(order) - 1
        return order[at + 1] if at + 1 < len(order) else None

    def _check(self, node: str, track: _Node, step: str, why: str) -> None:
        """Submit the node's ``preflight``, ``burn_in`` or ``pair_test``; its verdict comes back through
        :meth:`observe` (or at once when the gate decided it)."""
        kind = _KINDS[step]
        setattr(track, f"{kind}_id", "pending")
        request = ActionRequest(
            kind=kind,
            target=node,
            reason=f"return to service after {track.reset_done}: {why}",
            params={"after": track.reset_done, "reset_action": track.reset_id},
            rule=RULE,
        )

        async def go() -> None:
            record = await self._submit(request)
            setattr(track, f"{kind}_id", record.id)
            log.info(
                "return_to_service_check", check=kind, node=node, action_id=record.id, state=str(record.state)
            )
            if record.state.finished:
                self._verdict(node, track, record, step=step)

        self._soon(go())

    def _verdict(self, node: str, track: _Node, record: ActionRecord, step: str = "preflight") -> None:
        """The preflight's (then, when the site requires it, the burn-in's) verdict: resume, the
        burn-in next, or the drain for RMA."""
        self._nodes.pop(node, None)
        if record.state in (ActionState.SUPPRESSED, ActionState.DRY_RUN):
            # No verdict (the gate held the step back, or a dry run): the node stays as it is.
            log.info("return_to_service_no_verdict", node=node, step=step, state=str(record.state))
            return
        if record.state == ActionState.SUCCEEDED:
            track.passed.append(step)
            following = self._next_step(step)
            if following is not None:
                self._nodes[node] = track  # still in return to service: the next check decides
                self._check(node, track, following, _WHY[following])
                return
            self._later(
                ActionRequest(
                    kind=ActionKind.RESUME_NODE,
                    target=node,
                    reason=f"{' and '.join(track.passed)} passed after {track.reset_done}",
                    params={"return_to_service": track.reset_id},
                    rule=RULE,
                )
            )
            return
        why = str(record.detail.get(_KINDS[step]) or record.detail.get("error") or record.state)
        history = "; ".join([*track.history, *self._faults(node)])
        self._later(
            ActionRequest(
                kind=ActionKind.DRAIN_NODE,
                target=node,
                reason=f"RMA: {step} failed after {track.reset_done}: {why}; history: {history}",
                params={"severity": "critical", "rma": True, "return_to_service": track.reset_id},
                rule=RULE,
            )
        )

    def _faults(self, node: str) -> list[str]:
        if self._state is None:
            return []
        faults = list(self._state.node_history(node))[-3:]
        out = []
        for f in faults:
            code = "" if f.code is None else f" {f.code}"
            out.append(f"{f.kind}{code} at {time.strftime('%H:%M:%S', time.gmtime(f.ts))}")
        return out


__all__ = ["PREFLIGHT", "ReturnToService"]
