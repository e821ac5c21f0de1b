"""``Scheduler.list_nodes``: one contract for FakeScheduler, a real Slurm 22.05 and Kubernetes.

The coordinator's reconciliation (:mod:`ftd.coordinator.upkeep.reconcile`) trusts this listing to tell
ftd's drains (reason prefix ``ftd:``) from an operator's, to see an operator's resume, and to see
nodes down; so the fake the unit tests use must list exactly what Slurm and Kubernetes list. The
same test body runs against the three: the fake, Slurm through ``scontrol`` (real slurmctld), and
Kubernetes through ``kubernetes_asyncio`` against the strict fake API server of ``tests/fakes``.
What "an operator" does is done the way an operator does it on each (``scontrol update``; for
Kubernetes a cordon, or removing ftd's taint and the cordon).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ftd.coordinator.actions.scheduler import FakeScheduler, NodeInfo, Scheduler
from ftd.coordinator.actions.slurm import SlurmScheduler
from tests.realparts import SlurmCluster

NODES = ("node-1", "node-2", "node-3", "node-4")


@dataclass
class Backend:
    """A scheduler, and how an operator changes its nodes behind ftd's back."""

    sched: Scheduler
    kind: str
    cluster: SlurmCluster | None = None
    api: object | None = None  # tests.fakes.kube_api.FakeKubeApi

    async def operator(self, node: str, what: str, reason: str = "maintenance") -> None:
        """``what``: ``drain`` (someone else's drain), ``resume`` (undo any drain), ``down``, ``up``."""
        if self.kind == "fake":
            fake = self.sched
            assert isinstance(fake, FakeScheduler)
            if what == "drain":
                fake.operator_drain(node, reason)
            elif what == "resume":
                await fake.resume(node)
            else:
                fake.set_state(node, "DOWN" if what == "down" else "IDLE")
            return
        if self.kind == "slurm":
            assert self.cluster is not None
            args = {
                "drain": ["state=drain", f"reason={reason}"],
                "resume": ["state=resume"],
                "down": ["state=down", f"reason={reason}"],
                "up": ["state=resume"],
            }[what]
            # check=False: resuming a drained node slurmctld never heard from (UNKNOWN+DRAIN) answers
            # "Invalid node state specified" but does undrain it; the listing says what happened.
            await asyncio.to_thread(
                self.cluster.run, "scontrol", "update", f"nodename={node}", *args, check=False
            )
            return
        from tests.fakes.kube_api import FakeKubeApi

        api = self.api
        assert isinstance(api, FakeKubeApi)
        obj = api.nodes[node]
        if what == "drain":  # kubectl cordon
            obj["spec"]["unschedulable"] = True
        elif what == "resume":  # kubectl uncordon + kubectl taint nodes NODE ftd.dev/fault-
            obj["spec"].pop("unschedulable", None)
            taints = [t for t in obj["spec"].get("taints", []) if t["key"] != "ftd.dev/fault"]
            obj["spec"]["taints"] = taints
        else:
            obj["status"]["conditions"] = [{"type": "Ready", "status": "False" if what == "down" else "True"}]

    async def listed(self) -> dict[str, NodeInfo]:
        infos = await self.sched.list_nodes()
        assert [i.name for i in infos] == sorted(i.name for i in infos), "sorted by name"
        return {i.name: i for i in infos}


@pytest.fixture(params=["fake", pytest.param("slurm", marks=pytest.mark.real), "kubernetes"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "fake":
        fake = FakeScheduler()
        for node in NODES:
            fake.add_node(node)
        yield Backend(fake, "fake")
        return
    if request.param == "slurm":
        cluster: SlurmCluster = request.getfixturevalue("slurm")
        backend = Backend(SlurmScheduler(slurm_conf=str(cluster.conf_path)), "slurm", cluster=cluster)
        try:
            yield backend
        finally:
            for node in NODES:  # the session cluster's reset() resumes drains, not a node set DOWN
                cluster.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        return
    pytest.importorskip("kubernetes_asyncio")
    from ftd.coordinator.actions.kubernetes import KubernetesScheduler
    from tests.fakes.kube_api import FakeKubeApi

    api = FakeKubeApi()
    for node in NODES:
        api.add_node(node)
    await api.start()
    token = tmp_path / "token"
    token.write_text(api.token)
    sched = KubernetesScheduler(host=api.url, token_file=str(token), namespace="train", timeout_s=5)
    try:
        yield Backend(sched, "kubernetes", api=api)
    finally:
        await sched.close()
        await api.stop()


async def test_lists_every_node_none_drained(backend: Backend) -> None:
    nodes = await backend.listed()
    assert set(NODES) <= set(nodes)
    assert not any(nodes[n].drained for n in NODES)
    assert not nodes["node-1"].down and nodes["node-1"].reason is None
    assert nodes["node-2"] == await backend.sched.node_info("node-2")  # the same view as node_info


async def test_ftd_drain_listed_with_prefix_then_operator_resume(backend: Backend) -> None:
    await backend.sched.drain("node-2", "xid 79 on GPU 3")
    nodes = await backend.listed()
    assert nodes["node-2"].drained and nodes["node-2"].reason == "ftd: xid 79 on GPU 3"
    assert [n for n in NODES if nodes[n].drained] == ["node-2"]

    await backend.operator("node-2", "resume")  # the operator returns it to service, not ftd
    nodes = await backend.listed()
    assert not nodes["node-2"].drained
    assert not any(nodes[n].drained for n in NODES)


async def test_operator_drain_is_not_ftds(backend: Backend) -> None:
    await backend.operator("node-3", "drain", reason="maintenance")
    nodes = await backend.listed()
    assert nodes["node-3"].drained and not nodes["node-3"].down
    assert not (nodes["node-3"].reason or "").startswith("ftd:")
    if backend.kind != "kubernetes":  # a cordon carries no reason; Slurm keeps the operator's
        assert nodes["node-3"].reason == "maintenance"
    assert [n for n in NODES if nodes[n].drained] == ["node-3"]


async def test_node_down_is_listed_down(backend: Backend) -> None:
    await backend.operator("node-4", "down", reason="ipmi power off")
    nodes = await backend.listed()
    assert nodes["node-4"].down
    assert not nodes["node-1"].down and not nodes["node-3"].down
    await backend.operator("node-4", "up")  # Slurm: IDLE+NOT_RESPONDING until slurmctld pings it
    nodes = await backend.listed()
    assert not nodes["node-4"].down and not nodes["node-4"].drained, nodes["node-4"]
