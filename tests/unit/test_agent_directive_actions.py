"""gpu_reset and collect_diagnostics executors: node directives out, node-level acks back, deadlines."""

from __future__ import annotations

import asyncio
from typing import Any

from ftd.bus import topics
from ftd.config import Config
from ftd.coordinator.actions import ExecutorContext, build_executors
from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.diagnostics import CollectDiagnostics
from ftd.coordinator.actions.directive import node_sender
from ftd.coordinator.actions.gpu_reset import GpuReset
from ftd.coordinator.model.state import ClusterState
from ftd.events import NODE_RANK, Ack, Directive, JobPresence, RankInfo, decode
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState


class Agents:
    """Stands in for the bus + agents: records directives, answers them through the AckBook."""

    def __init__(self, acks: AckBook, answers: dict[str, tuple[bool, str, str | None]]) -> None:
        self.acks = acks
        self.answers = answers  # node -> (ok, reason, path); a node missing here stays silent
        self.sent: list[tuple[str, Directive]] = []

    async def publish(self, topic: str, payload: bytes) -> None:
        directive = decode(payload, Directive)
        self.sent.append((topic, directive))
        node = topic.split("/")[3]
        if node in self.answers:
            ok, reason, path = self.answers[node]
            ack = Ack(
                directive_id=directive.id,
                job=directive.job or "",
                rank=NODE_RANK,
                node=node,
                ok=ok,
                reason=reason,
                path=path,
            )
            asyncio.get_running_loop().call_later(0.01, self.acks.record, ack)


def _record(kind: str, target: str, id: str = "act-7", **params: Any) -> ActionRecord:
    req = ActionRequest(kind=kind, target=target, reason="xid 79", params=params)
    return ActionRecord(id=id, request=req, state=ActionState.RUNNING)


async def test_gpu_reset_success_and_idempotent_directive_id() -> None:
    acks = AckBook()
    agents = Agents(acks, {"node-1": (True, "reset: healthy after reset", None)})
    ex = GpuReset(send=node_sender(agents.publish), acks=acks, deadline_s=2)
    detail = await ex(_record("gpu_reset", "node-1", pci="0000:3b:00.0", uuid="GPU-abc", index=3))
    [(topic, d)] = agents.sent
    assert topic == topics.node_directives("node-1")
    assert d.action == "gpu_reset" and d.id == "act-7-gpu_reset" and d.action_id == "act-7"
    assert d.params == {"pci": "0000:3b:00.0", "uuid": "GPU-abc", "index": 3} and d.deadline_s == 2
    assert detail["ok"] is True and "state" not in detail
    # A resumed action re-sends the same directive id (the agent dedupes) and accepts the answer.
    await ex(_record("gpu_reset", "node-1", index=3))
    assert agents.sent[1][1].id == d.id


async def test_gpu_reset_refused_and_silent() -> None:
    acks = AckBook()
    agents = Agents(acks, {"node-1": (False, "refused: processes hold the GPU", None)})
    ex = GpuReset(send=node_sender(agents.publish), acks=acks, deadline_s=0.3)
    detail = await ex(_record("gpu_reset", "node-1", index=0))
    assert detail["state"] == "failed" and detail["refused"] is True
    assert detail["agent_reason"] == "refused: processes hold the GPU"
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    detail = await ex(_record("gpu_reset", "node-2", id="act-8", index=0))
    assert detail["state"] == "failed" and detail["answered"] is False
    assert 0.25 <= loop.time() - t0 < 2


async def test_collect_diagnostics_asks_every_node_of_the_job() -> None:
    acks = AckBook()
    state = ClusterState()
    for node, ranks in (("node-1", [0, 1]), ("node-2", [2, 3]), ("node-3", [4])):
        state.apply_presence(
            node,
            "job9",
            JobPresence(job="job9", node=node, ranks=[RankInfo(rank=r, pid=100 + r) for r in ranks]),
        )
    agents = Agents(
        acks,
        {
            "node-1": (True, "py-spy 2/2 ranks; nvidia-smi ok", "/var/lib/ftd/diagnostics/act-7"),
            "node-2": (
                False,
                "py-spy 1/2 ranks; rank 3: Permission denied",
                "/var/lib/ftd/diagnostics/act-7",
            ),
        },
    )
    ex = CollectDiagnostics(send=node_sender(agents.publish), state=state, acks=acks, deadline_s=0.3)
    detail = await ex(_record("collect_diagnostics", "job9"))
    sent = {topic: d for topic, d in agents.sent}
    assert set(sent) == {topics.node_directives(n) for n in ("node-1", "node-2", "node-3")}
    d1 = sent[topics.node_directives("node-1")]
    assert (
        d1.action == "collect_diagnostics"
        and d1.job == "job9"
        and d1.params == {"job": "job9", "ranks": [0, 1]}
    )
    assert d1.id == "act-7-diag-node-1"
    assert detail["nodes"]["node-1"] == {
        "answered": True,
        "ok": True,
        "path": "/var/lib/ftd/diagnostics/act-7",
        "summary": "py-spy 2/2 ranks; nvidia-smi ok",
    }
    assert detail["failed"] == ["node-2"] and detail["missing"] == ["node-3"]
    assert detail["state"] == "escalated"


def test_build_executors_registers_everything() -> None:
    from ftd.config import parse_config
    from ftd.coordinator.actions.scheduler import FakeScheduler

    async def publish(topic: str, payload: bytes) -> None:
        return None

    ctx = ExecutorContext(
        config=Config(),
        state=ClusterState(),
        acks=AckBook(),
        publish=publish,
        send_to_node=node_sender(publish),
        scheduler=FakeScheduler(),
    )
    kinds = set(build_executors(ctx))
    assert kinds == {
        ActionKind.CHECKPOINT_RESTART,
        ActionKind.CHECKPOINT,
        ActionKind.GPU_RESET,
        ActionKind.COLLECT_DIAGNOSTICS,
        ActionKind.DIAGNOSE_HANG,
        ActionKind.DRAIN_NODE,
        ActionKind.RESUME_NODE,
        ActionKind.NOTIFY,  # without a webhook it writes the log
        "preflight",  # return to service (ftd.coordinator.upkeep.return_service)
        "burn_in",  # issue #36: a drained or new node's burn-in
        "rma_bundle",  # issue #36: coordinator.rma.enabled (default): bundles for repair drains
        "pair_test",  # issue #35: the return gate and the bisections (ftd.coordinator.upkeep.fabric_tests)
    }
    config = parse_config('[coordinator.notify]\nwebhook_url = "http://127.0.0.1:9/x"\n')
    ctx = ExecutorContext(
        config=config,
        state=ClusterState(),
        acks=AckBook(),
        publish=publish,
        send_to_node=node_sender(publish),
        scheduler=None,
    )
    assert set(build_executors(ctx)) == {
        ActionKind.CHECKPOINT_RESTART,
        ActionKind.CHECKPOINT,
        ActionKind.GPU_RESET,
        ActionKind.COLLECT_DIAGNOSTICS,
        ActionKind.DIAGNOSE_HANG,
        ActionKind.NOTIFY,
        "preflight",
        "burn_in",
        "rma_bundle",
        "pair_test",
    }
