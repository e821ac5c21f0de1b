"""collect_diagnostics (coordinator side): every agent hosting a job dumps its ranks' stacks.

Target: a job id (every node with ranks of it is asked) or a node name (that node only);
``params.nodes`` overrides the node list. Each node gets its own ``collect_diagnostics``
:class:`~ftd.events.Directive` on ``ftd/v1/nodes/{node}/directives`` (id ``{action id}-diag-{node}``,
``job`` set, ``params = {"job": ..., "ranks": [...]}``) and answers with one node-level
:class:`~ftd.events.Ack` (``rank = -1``): ``ok``, ``path`` = the directory it wrote on the node
(``{agent.state_dir}/diagnostics/{action id}/``), ``files`` = the files stored there (recorded in the
node's detail, which ``GET /v1/actions/{id}`` shows) and ``reason`` = a one-line summary. The agent side is
:func:`ftd.agent.diagnostics.collect_diagnostics` (``py-spy dump`` per rank pid, ``nvidia-smi -q``).

The action succeeds when every node answered ok; a node that failed or said nothing by
``diagnostics_deadline_s`` makes it *escalated* (what did arrive is still recorded). Directive ids
derive from the action id, so a resumed action re-sends the same directives.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.directive import NodeSend, ask_node, directive_for
from ftd.coordinator.model.state import ClusterState
from ftd.plugin.actions import ActionRecord, ActionState


class CollectDiagnostics:
    def __init__(self, *, send: NodeSend, state: ClusterState, acks: AckBook, deadline_s: float) -> None:
        self._send = send
        self._state = state
        self._acks = acks
        self.deadline_s = deadline_s

    def _targets(self, record: ActionRecord) -> tuple[str | None, dict[str, list[int]]]:
        target = record.request.target
        job_record = self._state.jobs.get(target)
        job = target if job_record is not None else record.request.params.get("job")
        if job_record is not None:
            by_node = {
                n: sorted(r.rank for r in ranks) for n, ranks in job_record.ranks_by_node.items() if ranks
            }
        else:
            by_node = {target: []}
        wanted = record.request.params.get("nodes")
        if wanted:
            by_node = {n: by_node.get(n, []) for n in wanted}
        return job, by_node

    async def _ask(
        self, record: ActionRecord, job: str | None, node: str, ranks: list[int]
    ) -> dict[str, Any]:
        directive = directive_for(
            record,
            "collect_diagnostics",
            suffix=f"diag-{node}",
            job=job,
            node=node,
            deadline_s=self.deadline_s,
            params={"job": job, "ranks": ranks},
        )
        ack = await ask_node(self._send, self._acks, directive, self.deadline_s)
        if ack is None:
            return {"answered": False, "ok": False}
        answer: dict[str, Any] = {"answered": True, "ok": ack.ok, "path": ack.path, "summary": ack.reason}
        if ack.files:  # the stored files (py-spy dumps, nvidia-smi.txt, ...) under ``path`` on the node
            answer["files"] = list(ack.files)
        return answer

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        job, by_node = self._targets(record)
        nodes = sorted(by_node)
        results = await asyncio.gather(*(self._ask(record, job, n, by_node[n]) for n in nodes))
        per_node = dict(zip(nodes, results, strict=True))
        detail: dict[str, Any] = {"job": job, "nodes": per_node}
        missing = [n for n, r in per_node.items() if not r["answered"]]
        failed = [n for n, r in per_node.items() if r["answered"] and not r["ok"]]
        if missing or failed:
            detail.update(missing=missing, failed=failed, state=str(ActionState.ESCALATED))
        return detail
