"""diagnose_hang: ask every node of a hung job for its evidence, draw the verdict, hand it to the rules.

Target: a job id. Two phases (:class:`~ftd.coordinator.model.plan.PhasedExecutor`, so
``/v1/action-phases`` lists them and a resumed action does not ask twice):

1. **collect** -- a ``collect_hang_evidence`` :class:`~ftd.events.Directive` to every node with ranks of
   the job, all at once (id ``{action id}-hang-{node}``, ``params = {"job", "ranks"}``, deadline
   ``coordinator.hang_evidence_deadline_s``). Each agent answers with one node-level Ack whose
   ``data["evidence"]`` is a :class:`~ftd.culprit.evidence.NodeEvidence`
   (:mod:`ftd.agent.hang_evidence`). ``detail["node_evidence"]`` keeps what each node said (its
   ranks' state, step, heartbeat age, stacks, flight record, RAS, the raw files it kept and where);
   ``detail["unanswered"]`` the nodes that said nothing by the deadline or answered something that is
   not evidence (``detail["refused"]`` says why).
2. **verdict** -- :func:`ftd.culprit.verdict.fuse` on the :class:`~ftd.culprit.evidence.JobEvidence`
   (the peer blames the state holds for the job, when it holds any). ``detail["verdict"]`` is the
   verdict (kind, confident, why, culprit ranks and nodes, each evidence item with its ``source``),
   ``detail["tree"]`` the merged main-thread stacks rendered as text. Then a coordinator-sourced
   ``hang_verdict`` event goes to the rules (``data``: ``job``, ``verdict``, ``confident``, ``why``,
   ``culprit_nodes``, ``culprit_ranks``, ``action_id``, ``unclear`` = ``coordinator.hang_unclear``, the
   evidence as ``source: sentence`` lines and the tree, bounded), whose ``hang`` rule acts on it and
   notifies. ``detail["verdict_event"]`` is its id (derived from the action id: a resumed action's
   repeat is a duplicate the ledger drops).

The action succeeds when every node answered; otherwise it is *escalated* -- the verdict is still drawn
(an unanswered node is itself evidence) and handed on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.directive import NodeSend, ask_node, directive_for
from ftd.coordinator.model.state import ClusterState
from ftd.culprit.evidence import JobEvidence, NodeEvidence, PeerBlame, Verdict
from ftd.culprit.stacks import render_tree
from ftd.culprit.verdict import fuse
from ftd.events import Event, Kind, Severity
from ftd.logs import get_logger
from ftd.plugin.actions import ActionRecord, ActionState

log = get_logger(__name__)

DEFAULT_DEADLINE_S = 15.0
MAX_TREE_CHARS = 16_000  # of the rendered tree kept in the detail
MAX_EVENT_TREE_CHARS = 4_000  # of the rendered tree in the hang_verdict event (and the notification)
MAX_EVENT_LINES = 32  # evidence lines in the event

EmitEvent = Callable[[Event], Awaitable[object]]


class DiagnoseHang:
    """The ``diagnose_hang`` executor (module docstring)."""

    phases = ("collect", "verdict")

    def __init__(
        self,
        *,
        send: NodeSend,
        state: ClusterState,
        acks: AckBook,
        deadline_s: float = DEFAULT_DEADLINE_S,
        emit: EmitEvent | None = None,
        unclear: str = "restart",
    ) -> None:
        self._send = send
        self._state = state
        self._acks = acks
        self.deadline_s = deadline_s
        self.emit = emit
        self.unclear = unclear

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        detail: dict[str, Any] = {}
        for phase in self.phases:
            detail.update(await self.run_phase(record, phase))
            record.detail.update(detail)
        return detail

    async def run_phase(self, record: ActionRecord, phase: str) -> dict[str, Any]:
        if phase == "collect":
            return await self._collect(record)
        if phase == "verdict":
            return await self._verdict(record)
        return {}

    def _expected(self, job: str) -> dict[str, list[int]]:
        job_record = self._state.jobs.get(job)
        if job_record is None:
            return {}
        return {n: sorted(r.rank for r in ranks) for n, ranks in job_record.ranks_by_node.items() if ranks}

    async def _ask(self, record: ActionRecord, job: str, node: str, ranks: list[int]) -> dict[str, Any]:
        directive = directive_for(
            record,
            "collect_hang_evidence",
            suffix=f"hang-{node}",
            job=job,
            node=node,
            deadline_s=self.deadline_s,
            params={"job": job, "ranks": ranks},
        )
        ack = await ask_node(self._send, self._acks, directive, self.deadline_s)
        if ack is None:
            return {"answered": False, "why": f"no answer within {self.deadline_s:g}s"}
        try:
            evidence = msgspec.convert(ack.data.get("evidence"), NodeEvidence)
        except msgspec.ValidationError as exc:
            return {"answered": False, "why": f"not hang evidence: {str(exc)[:300]}"}
        if evidence.node != node or evidence.job != job:
            return {
                "answered": False,
                "why": f"evidence for {evidence.node}/{evidence.job}, not {node}/{job}",
            }
        return {"answered": True, "evidence": msgspec.to_builtins(evidence), "summary": ack.reason}

    async def _collect(self, record: ActionRecord) -> dict[str, Any]:
        job = record.request.target
        expected = self._expected(job)
        nodes = sorted(expected)
        started = time.monotonic()
        results = await asyncio.gather(*(self._ask(record, job, n, expected[n]) for n in nodes))
        answers = dict(zip(nodes, results, strict=True))
        detail: dict[str, Any] = {
            "job": job,
            "expected": expected,
            "node_evidence": {n: a["evidence"] for n, a in answers.items() if a["answered"]},
            "unanswered": [n for n, a in answers.items() if not a["answered"]],
            "collect_s": round(time.monotonic() - started, 3),
        }
        refused = {n: a["why"] for n, a in answers.items() if not a["answered"]}
        if refused:
            detail["refused"] = refused
        if not nodes:
            detail["note"] = f"no rank of job {job} is registered with any agent: nothing to ask"
        log.info("hang_evidence_gathered", job=job, nodes=nodes, unanswered=detail["unanswered"])
        return detail

    def _peer_blames(self, job: str) -> list[PeerBlame]:
        return self._state.job_peer_blames(job)

    async def _verdict(self, record: ActionRecord) -> dict[str, Any]:
        job = record.request.target
        got = record.detail
        blames = self._peer_blames(job)  # the state is read here, on the loop; the rest is pure
        # Decoding every node's evidence and fusing it is CPU work that grows with the stacks (a rank
        # may send 100,000 frames): a worker thread does it, so the event loop keeps serving the bus
        # and the other actions meanwhile (issue #33: collection never blocks the coordinator's loop).
        verdict, tree, evidence, errors = await asyncio.to_thread(
            _fuse_evidence,
            job,
            dict(got.get("node_evidence") or {}),
            {n: list(r) for n, r in (got.get("expected") or {}).items()},
            list(got.get("unanswered") or []),
            blames,
            record.request.reason[:512],
        )
        summary = msgspec.to_builtins(msgspec.structs.replace(verdict, tree=None))
        detail: dict[str, Any] = {"verdict": summary, "tree": tree[:MAX_TREE_CHARS]}
        if errors:
            detail["evidence_errors"] = errors
        if got.get("unanswered") or not evidence.nodes:
            detail["state"] = str(ActionState.ESCALATED)
        event = self._event(record, verdict, tree, evidence)
        detail["verdict_event"] = event.id
        log.info(
            "hang_verdict",
            job=job,
            verdict=verdict.kind,
            confident=verdict.confident,
            culprit_nodes=verdict.culprit_nodes,
            why=verdict.why,
        )
        if self.emit is not None:
            try:
                await self.emit(event)
            except Exception as exc:  # the verdict is recorded; the rules did not get it: say so
                log.exception("hang_verdict_not_handed_on", job=job)
                detail["verdict_event_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                detail["state"] = str(ActionState.ESCALATED)
        return detail

    def _event(self, record: ActionRecord, verdict: Verdict, tree: str, evidence: JobEvidence) -> Event:
        nodes = (
            verdict.culprit_nodes
            or sorted(evidence.expected)
            or [str(record.request.params.get("node") or "")]
        )
        lines = [
            f"{item.source}: {item.says}" + (f" ({item.node})" if item.node else "")
            for item in verdict.evidence[:MAX_EVENT_LINES]
        ]
        return Event(
            id=f"{record.id}-verdict",
            ts=time.time(),
            node=nodes[0] or "coordinator",
            kind=Kind.HANG_VERDICT,
            severity=Severity.ERROR if verdict.kind == "culprit" and verdict.confident else Severity.WARNING,
            source="coordinator",
            data={
                "job": verdict.job,
                "verdict": verdict.kind,
                "confident": verdict.confident,
                "why": verdict.why,
                "culprit_nodes": list(verdict.culprit_nodes),
                "culprit_ranks": list(verdict.culprit_ranks),
                "unanswered": list(verdict.unanswered),
                "evidence": lines,
                "tree": tree[:MAX_EVENT_TREE_CHARS],
                "action_id": record.id,
                "trigger": record.request.reason[:512],
                "unclear": self.unclear,
            },
        )


def _fuse_evidence(
    job: str,
    raw_nodes: dict[str, Any],
    expected: dict[str, list[int]],
    unanswered: list[str],
    blames: list[PeerBlame],
    trigger: str,
) -> tuple[Verdict, str, JobEvidence, list[str]]:
    """Each node's evidence decoded (what does not decode is an error, not a crash), fused, and the
    merged tree rendered: pure, run in a worker thread."""
    nodes: dict[str, NodeEvidence] = {}
    errors: list[str] = []
    for node, raw in raw_nodes.items():
        try:
            nodes[node] = msgspec.convert(raw, NodeEvidence)
        except msgspec.ValidationError as exc:
            errors.append(f"{node}: {str(exc)[:200]}")
    evidence = JobEvidence(
        job=job,
        expected=expected,
        nodes=nodes,
        unanswered_nodes=unanswered,
        peer_blames=blames,
        trigger=trigger,
    )
    verdict = fuse(evidence)
    tree = render_tree(verdict.tree) if verdict.tree is not None else ""
    return verdict, tree, evidence, errors
