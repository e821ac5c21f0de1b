"""Node directives: what the agent does when the coordinator addresses the node itself.

What: :class:`NodeActions`, the handlers of the directives on ``ftd/v1/nodes/{node}/directives``,
by ``action``: ``gpu_reset`` goes to :class:`~ftd.agent.gpu_reset.GpuResetter`, whose answer is
both a ``gpu_health`` event and an :class:`~ftd.events.Ack` on ``ftd/v1/nodes/{node}/acks``;
``collect_diagnostics`` runs :func:`~ftd.agent.diagnostics.collect_diagnostics` (py-spy dumps of the
job's ranks on this node under ``{state_dir}/diagnostics/{action id}/``), answered with the result's
Ack; ``collect_hang_evidence`` runs :func:`~ftd.agent.hang_evidence.collect_hang_evidence` (every
rank of the job on this node at once: process state, stacks, flight recorder, NCCL RAS), answered with
one Ack whose ``data["evidence"]`` is the node's evidence; ``preflight`` runs the node's preflight
checks (the coordinator's return to service) and is
answered with the verdict, recorded as a ``gpu_health`` event (``signal = "preflight"``); a
re-delivered preflight directive gets the first verdict again, not a second run. ``burn_in`` runs the
node's burn-in (:mod:`ftd.agent.preflight.burn_in`; refused while a job runs here), publishes its
report as a ``burn_in`` event and answers with the verdict (``data["report"]``); ``rma_bundle``
collects the diagnostic bundle of a node drained for repair (:mod:`ftd.agent.rma.bundle`), publishes
an ``rma_bundle`` event with its path and answers with it (``path``, ``data["bundle"]``). Both
answer a re-delivered directive from their record.
``pair_test`` runs one pair test against another agent (:mod:`ftd.agent.pair_tests.service`,
handed in by the wiring), recorded as a ``pair_test`` event and answered with the result.

Why apart: each handler is a slow side task with its own answer; the agent only decodes the
directive, looks up :meth:`NodeActions.handler` and runs it as a side task.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

from ftd.agent.diagnostics import collect_diagnostics
from ftd.agent.gpu_reset import GpuResetter
from ftd.agent.hang_evidence import AskFlight, collect_hang_evidence, evidence_ack
from ftd.agent.rma.bundle import Bundle
from ftd.agent.spool import Outbox, Outgoing
from ftd.bus import topics
from ftd.events import NODE_RANK, Ack, Directive, Event, Kind, RankInfo, Severity, encode, make_event
from ftd.logs import get_logger
from ftd.platform.burn_in import BurnInReport

log = get_logger(__name__)

__all__ = ["NodeActions"]

Handler = Callable[[Directive], Coroutine[Any, Any, None]]


class NodeActions:
    """The node directive handlers of one agent (its outbox, its ranks, its preflight)."""

    def __init__(
        self,
        node: str,
        *,
        outbox: Outbox,
        emit: Callable[[Event], Awaitable[None]],
        gpu_resetter: GpuResetter,
        jobs: Callable[[], dict[str, list[RankInfo]]],
        preflight_now: Callable[[Mapping[str, Any]], Awaitable[dict[str, Any]]],
        diagnostics_dir: Path,
        ask_flight: AskFlight | None = None,
        burn_in_now: Callable[[Mapping[str, Any]], Awaitable[BurnInReport]] | None = None,
        rma_bundle_now: Callable[[Mapping[str, Any]], Awaitable[Bundle]] | None = None,
        pair_test: Callable[[Directive], Awaitable[tuple[Event, Ack]]] | None = None,
    ) -> None:
        self.node = node
        self._outbox = outbox
        self._emit = emit
        self.gpu_resetter = gpu_resetter
        self._jobs = jobs
        self._preflight_now = preflight_now
        self._diagnostics_dir = diagnostics_dir
        self._ask_flight = ask_flight  # a rank's own flight-recorder dump (the local API)
        self._preflight_answers: dict[str, tuple[bool, str]] = {}  # directive id -> (ok, reason)
        self._burn_in_now = burn_in_now
        self._rma_bundle_now = rma_bundle_now
        self._answers: dict[str, Ack] = {}  # burn_in / rma_bundle: directive id -> its answer
        self._handlers: dict[str, Handler] = {
            "gpu_reset": self.gpu_reset,
            "collect_diagnostics": self.collect_diagnostics,
            "preflight": self.preflight,
            "collect_hang_evidence": self.collect_hang_evidence,
            "burn_in": self.burn_in,
            "rma_bundle": self.rma_bundle,
        }
        self._pair_test = pair_test  # ftd.agent.pair_tests.service (a sibling: handed in by wiring)
        if pair_test is not None:
            self._handlers["pair_test"] = self.pair_test

    def handler(self, action: str) -> Handler | None:
        """The handler of a node directive's ``action`` (None: not supported)."""
        return self._handlers.get(action)

    def _answer(self, ack: Ack) -> None:
        self._outbox.put(Outgoing(topics.node_acks(self.node), encode(ack), priority=3))

    async def gpu_reset(self, directive: Directive) -> None:
        result = await self.gpu_resetter.reset(directive)
        event, ack = self.gpu_resetter.report(directive, result)
        await self._emit(event)
        self._answer(ack)

    async def pair_test(self, directive: Directive) -> None:
        """Run the pair test asked (issue #35), record it (a ``pair_test`` event) and answer with it."""
        assert self._pair_test is not None
        event, ack = await self._pair_test(directive)
        await self._emit(event)
        self._answer(ack)

    async def preflight(self, directive: Directive) -> None:
        """The coordinator's return to service asks: run the preflight checks, answer with the verdict
        (an Ack, rank NODE_RANK) and record it (a ``gpu_health`` event, ``signal = "preflight"``)."""
        answer = self._preflight_answers.get(directive.id)
        if answer is None:  # a re-delivered directive gets the first verdict, not a second run
            report = await self._preflight_now(directive.params)  # a pair_peer runs a pair test too
            answer = self._preflight_answers[directive.id] = (bool(report["ok"]), str(report["reason"]))
            while len(self._preflight_answers) > 256:
                self._preflight_answers.pop(next(iter(self._preflight_answers)))
            await self._emit(
                make_event(
                    self.node,
                    Kind.GPU_HEALTH,
                    severity=Severity.INFO if answer[0] else Severity.ERROR,
                    source="preflight",
                    data={
                        "signal": "preflight",
                        "result": "passed" if answer[0] else "failed",
                        "reason": answer[1],
                        "directive_id": directive.id,
                        "action_id": directive.action_id,
                    },
                )
            )
        ok, reason = answer
        log.info("preflight_answered", directive_id=directive.id, ok=ok, reason=reason)
        self._answer(self._node_ack(directive, ok, reason))

    async def collect_diagnostics(self, directive: Directive) -> None:
        jobs = self._jobs()
        job = directive.job or directive.params.get("job")
        # The job's ranks; every rank registered on this node when the directive names no job.
        ranks = jobs.get(str(job), []) if job else [r for job_ranks in jobs.values() for r in job_ranks]
        result = await collect_diagnostics(directive, ranks, self._diagnostics_dir)
        log.info(
            "diagnostics_collected",
            directive_id=directive.id,
            ok=result.ok,
            path=result.path,
            summary=result.summary,
        )
        self._answer(result.to_ack(directive, self.node))

    async def collect_hang_evidence(self, directive: Directive) -> None:
        """Everything this node can say about a hung job (issue #33), in one Ack (``data["evidence"]``)."""
        job = directive.job or directive.params.get("job")
        ranks = self._jobs().get(str(job), []) if job else []
        evidence = await collect_hang_evidence(
            directive, ranks, self._diagnostics_dir, node=self.node, ask_flight=self._ask_flight
        )
        ack = evidence_ack(directive, self.node, evidence)
        log.info(
            "hang_evidence_collected",
            directive_id=directive.id,
            job=job,
            ranks=len(evidence.ranks),
            collected_s=evidence.collected_s,
            summary=ack.reason,
        )
        self._answer(ack)

    def _node_ack(self, directive: Directive, ok: bool, reason: str, **extra: Any) -> Ack:
        return Ack(
            directive_id=directive.id,
            job=directive.job or "",
            rank=NODE_RANK,
            node=self.node,
            ok=ok,
            reason=reason,
            ts=time.time(),
            **extra,
        )

    async def _once(self, directive: Directive, work: Callable[[], Awaitable[Ack]]) -> None:
        """Answer ``directive`` with ``work``'s Ack, or, re-delivered, with the Ack it got the first time."""
        ack = self._answers.get(directive.id)
        if ack is None:
            ack = self._answers[directive.id] = await work()
            while len(self._answers) > 256:
                self._answers.pop(next(iter(self._answers)))
        self._answer(ack)

    async def burn_in(self, directive: Directive) -> None:
        """Run the burn-in (refused while a job runs here), publish its report, answer the verdict."""
        await self._once(directive, lambda: self._burn_in(directive))

    async def _burn_in(self, directive: Directive) -> Ack:
        if self._burn_in_now is None:
            return self._node_ack(directive, False, "burn-in is not served by this agent")
        report = await self._burn_in_now(directive.params)
        body = report.to_dict()
        await self._emit(
            make_event(
                self.node,
                Kind.BURN_IN,
                severity=Severity.INFO if report.ok else Severity.ERROR,
                source="burn_in",
                data={**body, "directive_id": directive.id, "action_id": directive.action_id},
            )
        )
        log.info("burn_in_answered", directive_id=directive.id, verdict=report.verdict, reason=report.reason)
        return self._node_ack(directive, report.ok, report.reason, data={"report": body})

    async def rma_bundle(self, directive: Directive) -> None:
        """Collect the node's diagnostic bundle for repair, publish its path, answer with it."""
        await self._once(directive, lambda: self._rma_bundle(directive))

    async def _rma_bundle(self, directive: Directive) -> Ack:
        if self._rma_bundle_now is None:
            return self._node_ack(directive, False, "rma bundles are not served by this agent")
        try:
            bundle = await self._rma_bundle_now(directive.params)
        except OSError as exc:  # state_dir full or unwritable: say so, the drain stands anyway
            return self._node_ack(directive, False, f"bundle not written: {type(exc).__name__}: {exc}"[:300])
        await self._emit(
            make_event(
                self.node,
                Kind.RMA_BUNDLE,
                severity=Severity.INFO,
                source="rma",
                data={
                    "path": bundle.path,
                    "bytes": bundle.bytes,
                    "files": sorted(bundle.files),
                    "missing": bundle.missing,
                    "reason": str(directive.params.get("reason", ""))[:500],
                    "directive_id": directive.id,
                    "action_id": directive.action_id,
                },
            )
        )
        log.info("rma_bundle_collected", directive_id=directive.id, path=bundle.path, summary=bundle.summary)
        files = sorted(bundle.files)
        data = {"bundle": bundle.to_dict()}
        return self._node_ack(directive, True, bundle.summary, path=bundle.path, files=files, data=data)
