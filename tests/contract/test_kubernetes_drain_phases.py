"""drain_node on Kubernetes in its two phases (fake API server): the *drain* phase cordons and taints
with no eviction, so a job's pods keep running while they save; the *evict* phase evicts (PDBs, daemon
sets and mirror pods as ``drain`` treats them). ftd's plan runs the eviction after the job's stop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ftd.coordinator.actions.drain import DrainNode
from ftd.coordinator.actions.kubernetes import KubernetesScheduler
from ftd.coordinator.model.state import ClusterState
from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState
from tests.fakes.kube_api import FakeKubeApi

pytest.importorskip("kubernetes_asyncio")


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeApi]:
    fake = FakeKubeApi()
    fake.add_node("node-2")
    fake.add_pod("train", "job7-0", "node-2", labels={"ftd.dev/job": "job7"})
    fake.add_pod("kube-system", "gpu-plugin-x", "node-2", owner_kind="DaemonSet")
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


async def test_the_drain_phase_cordons_without_evicting_and_the_evict_phase_evicts(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("test-token\n")
    sched = KubernetesScheduler(host=api.url, token_file=str(token), namespace="train", timeout_s=5)
    try:
        state = ClusterState()
        drain = DrainNode(sched, state)
        request = ActionRequest(kind="drain_node", target="node-2", reason="xid 79 on GPU 0")
        record = ActionRecord(id="a1", request=request, state=ActionState.RUNNING)

        detail = await drain.run_phase(record, "drain")
        assert detail["reason"] == "ftd: xid 79 on GPU 0"
        assert api.nodes["node-2"]["spec"]["unschedulable"] is True
        assert api.nodes["node-2"]["spec"]["taints"][0]["key"] == "ftd.dev/fault"
        assert api.calls("POST") == []  # nothing evicted: the job's pod still saves
        assert ("train", "job7-0") in api.pods and state.nodes["node-2"].drained_by_ftd

        evicted = await drain.run_phase(record, "evict")
        assert evicted["evicted"]["evicted"] == ["train/job7-0"]
        assert [c.path for c in api.calls("POST")] == ["/api/v1/namespaces/train/pods/job7-0/eviction"]
        assert ("train", "job7-0") not in api.pods
        assert ("kube-system", "gpu-plugin-x") in api.pods  # daemon sets stay, as with kubectl drain
    finally:
        await sched.close()
