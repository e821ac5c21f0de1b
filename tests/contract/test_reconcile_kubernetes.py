"""Reconciliation on Kubernetes: ftd's cordon+taint is its drain, an operator's untaint+uncordon its
resume, an operator's own cordon or a NotReady node someone else's.

KubernetesScheduler (kubernetes_asyncio) against the strict fake API server of ``tests/fakes``; the
coordinator's engine, policy gate (budget: 1 of 4 nodes) and ledger in-process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ftd.coordinator.actions.drain import DrainNode, ResumeNode
from ftd.coordinator.decide.engine import Engine
from ftd.coordinator.decide.plugins import make_plugin_manager
from ftd.coordinator.decide.policy import PolicyGate
from ftd.coordinator.ledger.sqlite import Ledger, SqliteStore
from ftd.coordinator.model.state import ClusterState
from ftd.coordinator.upkeep.reconcile import Reconciler
from ftd.events import NodeStatus
from ftd.plugin.actions import ActionKind, ActionRequest, ActionState
from tests.fakes.kube_api import FakeKubeApi

pytest.importorskip("kubernetes_asyncio")

NODES = ("node-1", "node-2", "node-3", "node-4")


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeApi]:
    fake = FakeKubeApi()
    for node in NODES:
        fake.add_node(node)
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


async def test_kubernetes_drain_operator_resume_and_cordon(api: FakeKubeApi, tmp_path: Path) -> None:
    from ftd.coordinator.actions.kubernetes import KubernetesScheduler

    token = tmp_path / "token"
    token.write_text(api.token)
    sched = KubernetesScheduler(host=api.url, token_file=str(token), namespace="train", evict=False)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    store = SqliteStore(ledger)
    state = ClusterState()
    for node in NODES:
        state.apply_status(NodeStatus(node=node, state="online", ts=1.0))
    engine = Engine(
        state=state,
        ledger=store,
        gate=PolicyGate(max_drained_fraction=0.25, min_drain_budget=1, cooldown_s=0.0),
        plugins=make_plugin_manager(builtins=False, entry_points=False),
        executors={
            ActionKind.DRAIN_NODE: DrainNode(sched, state),
            ActionKind.RESUME_NODE: ResumeNode(sched, state),
        },
    )
    reconciler = Reconciler(state=state, ledger=store, scheduler=sched, engine=engine)
    await engine.load()
    await reconciler.restore()
    engine.observe(reconciler.observe)

    async def drain(node: str) -> ActionState:
        record = await engine.submit(ActionRequest(kind=ActionKind.DRAIN_NODE, target=node, reason="xid 79"))
        assert await engine.wait_idle(5)
        return record.state

    try:
        assert await drain("node-2") == ActionState.SUCCEEDED
        assert await reconciler.reconcile() == {}  # ftd's annotation + taint: ftd's drain, as recorded

        # kubectl uncordon alone leaves ftd's NoSchedule taint: still drained, still ftd's
        api.nodes["node-2"]["spec"].pop("unschedulable")
        assert await reconciler.reconcile() == {}
        assert await drain("node-3") == ActionState.SUPPRESSED

        # ... and removing the taint too returns it to service (the annotations stay behind)
        api.nodes["node-2"]["spec"]["taints"] = []
        assert await reconciler.reconcile() == {"ftd_drain_released": ["node-2"]}
        assert state.drained_nodes() == {}
        assert await drain("node-3") == ActionState.SUCCEEDED

        api.nodes["node-4"]["spec"]["unschedulable"] = True  # an operator's cordon
        api.nodes["node-1"]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
        changes = await reconciler.reconcile()
        assert changes == {"node_down": ["node-1"], "external_drain": ["node-4"]}
        assert state.unavailable == {"node-1": "NotReady", "node-4": "Ready,SchedulingDisabled"}
        assert set(state.drained_nodes()) == {"node-3"}
    finally:
        await engine.close()
        await sched.close()
        ledger.close()
