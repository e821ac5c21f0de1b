"""Scheduler.job_nodes, the source of truth of the placement check: real Slurm (scontrol), the fake
Kubernetes API server the Kubernetes contract uses, and the in-process fake.

What the placement policy relies on: the nodes of a *running* job; nothing (empty) for a pending,
finished or unknown job or an id that is not the scheduler's; SchedulerError only when the
scheduler cannot answer (the coordinator then holds the message: fail closed, retried).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ftd.coordinator.actions.scheduler import FakeScheduler, SchedulerError
from ftd.coordinator.actions.slurm import SlurmScheduler, expand_hostlist
from tests.realparts import SlurmCluster, require_binary

pytestmark = pytest.mark.real


async def test_slurm_job_nodes_of_running_pending_unknown_and_invalid_jobs(slurm: SlurmCluster) -> None:
    sched = SlurmScheduler(slurm_conf=str(slurm.conf_path), timeout_s=10)
    running = slurm.sbatch(None, "-w", "node-1", wrap="sleep 300")
    slurm.wait_job_state(running, "RUNNING")
    assert await sched.job_nodes(running) == ("node-1",)
    # node-1 has one CPU: a second job waits for it.
    pending = slurm.sbatch(None, "-w", "node-1", wrap="sleep 300")
    slurm.wait_job_state(pending, "PENDING")
    assert await sched.job_nodes(pending) == ()
    assert await sched.job_nodes("987654") == ()  # no such job
    assert await sched.job_nodes("not-a-job; rm -rf /") == ()  # never reaches scontrol
    slurm.run("scancel", running)
    slurm.wait_job_state(running, "CANCELLED")
    assert await sched.job_nodes(running) == ()  # finished: its NodeList is history


async def test_slurm_running_job_nodes_lists_only_active_jobs(slurm: SlurmCluster) -> None:
    """The placement cache's warm-up: one ``scontrol show job -o`` for every job."""
    sched = SlurmScheduler(slurm_conf=str(slurm.conf_path), timeout_s=10)
    running = slurm.sbatch(None, "-w", "node-1", wrap="sleep 300")
    slurm.wait_job_state(running, "RUNNING")
    pending = slurm.sbatch(None, "-w", "node-1", wrap="sleep 300")
    slurm.wait_job_state(pending, "PENDING")
    assert await sched.running_job_nodes() == {running: ("node-1",)}


async def test_slurm_hostlists_are_expanded_by_scontrol(slurm: SlurmCluster) -> None:
    """Multi-node NodeLists (``node-[1-3,7]``) go through ``scontrol show hostnames``; same answer as
    ftd's own expander on the shapes both know."""
    sched = SlurmScheduler(slurm_conf=str(slurm.conf_path), timeout_s=10)
    for hostlist in ("node-[1-3,7]", "gpu[01-02],node-9", "rack[1-2]-gpu[3-4]", "n[1-2],m[08-10]"):
        _, out, _ = await sched._run("show", "hostnames", hostlist)
        assert tuple(out.split()) == expand_hostlist(hostlist)


async def test_slurm_job_nodes_raises_when_the_controller_does_not_answer(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    require_binary("scontrol", package="slurm-client")
    conf = tmp_path / "slurm.conf"
    dead_port = "SlurmctldPort=1"  # nothing listens there
    conf.write_text(
        "\n".join(
            dead_port if line.startswith("SlurmctldPort=") else line
            for line in slurm.conf_path.read_text().splitlines()
        )
        + "\nMessageTimeout=2\n"
    )
    sched = SlurmScheduler(slurm_conf=str(conf), timeout_s=20)
    with pytest.raises(SchedulerError):
        await sched.job_nodes("1")


async def test_fake_scheduler_job_nodes() -> None:
    fake = FakeScheduler()
    fake.add_job("5", ["node-1", "node-2"])
    assert await fake.job_nodes("5") == ("node-1", "node-2")
    fake.add_job("7", ["node-3"], state="PENDING")
    assert await fake.running_job_nodes() == {"5": ("node-1", "node-2")}
    fake.finish_job("5")
    assert await fake.job_nodes("5") == ()
    assert await fake.job_nodes("6") == ()


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[object]:
    pytest.importorskip("kubernetes_asyncio")
    from ftd.coordinator.actions.kubernetes import KubernetesScheduler
    from tests.fakes.kube_api import FakeKubeApi

    api = FakeKubeApi()
    for i in range(1, 5):
        api.add_node(f"node-{i}")
    api.add_pod("train", "job7-0", "node-2", labels={"ftd.dev/job": "job7"})
    api.add_pod("train", "job7-1", "node-3", labels={"ftd.dev/job": "job7"})
    api.add_pod("train", "job7-old", "node-4", labels={"ftd.dev/job": "job7"}, phase="Succeeded")
    api.add_pod("other", "job7-elsewhere", "node-1", labels={"ftd.dev/job": "job7"})  # another namespace
    await api.start()
    token = tmp_path / "token"
    token.write_text("test-token\n")
    sched = KubernetesScheduler(host=api.url, token_file=str(token), namespace="train", timeout_s=5)
    try:
        yield sched
    finally:
        await sched.close()
        await api.stop()


async def test_kubernetes_job_nodes_are_the_live_pods_node_names(kube: object) -> None:
    from ftd.coordinator.actions.kubernetes import KubernetesScheduler

    assert isinstance(kube, KubernetesScheduler)
    assert await kube.job_nodes("job7") == ("node-2", "node-3")  # not the finished pod's, not another ns
    assert await kube.job_nodes("job8") == ()
    assert await kube.job_nodes("not a label value!") == ()
