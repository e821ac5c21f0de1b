"""KubernetesScheduler (kubernetes_asyncio) against a strict in-process fake API server.

The Slurm contract's drain/resume/requeue/unknown-name shape, adapted to Kubernetes (drain evicts,
exclusion is node-wide), plus the exact requests: merge-patch bodies and content types, eviction
bodies, the bearer token, and the refusals (409 retry, 429 PDB, 404).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ftd.config import parse_config
from ftd.coordinator.actions.drain import DrainNode, ResumeNode
from ftd.coordinator.actions.kubernetes import KubernetesScheduler, reason_slug
from ftd.coordinator.actions.scheduler import Scheduler, SchedulerError
from ftd.coordinator.model.state import ClusterState
from ftd.coordinator.wiring import make_scheduler
from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState
from tests.fakes.kube_api import FakeKubeApi

pytest.importorskip("kubernetes_asyncio")

NODE_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeApi]:
    fake = FakeKubeApi()
    for i in range(1, 5):
        fake.add_node(f"node-{i}", taints=[dict(NODE_TAINT)] if i == 2 else None)
    fake.add_pod("train", "job7-0", "node-2", labels={"ftd.dev/job": "job7"})
    fake.add_pod("train", "job7-1", "node-3", labels={"ftd.dev/job": "job7"}, restarts=2)
    fake.add_pod("kube-system", "gpu-plugin-x", "node-2", owner_kind="DaemonSet")
    fake.add_pod("kube-system", "static-etcd", "node-2", mirror=True)
    fake.add_pod("batch", "done-0", "node-2", phase="Succeeded")
    fake.add_pod("web", "api-0", "node-2", owner_kind="ReplicaSet")
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


@pytest.fixture
async def sched(api: FakeKubeApi, tmp_path: Path) -> AsyncIterator[KubernetesScheduler]:
    token = tmp_path / "token"
    token.write_text("test-token\n")
    s = KubernetesScheduler(host=api.url, token_file=str(token), namespace="train", timeout_s=5)
    try:
        yield s
    finally:
        await s.close()


async def test_is_a_scheduler(sched: KubernetesScheduler) -> None:
    assert isinstance(sched, Scheduler) and sched.name == "kubernetes"


async def test_drain_cordons_taints_evicts_then_resume(api: FakeKubeApi, sched: KubernetesScheduler) -> None:
    assert not (await sched.node_info("node-2")).drained
    await sched.drain("node-2", 'xid 79 on GPU 3\nfallen off the bus "now"')

    patches = api.calls("PATCH")
    assert len(patches) == 1
    p = patches[0]
    assert p.path == "/api/v1/nodes/node-2" and p.content_type == "application/merge-patch+json"
    reason = "ftd: xid 79 on GPU 3 fallen off the bus 'now'"
    assert p.body == {
        "metadata": {
            "resourceVersion": p.body["metadata"]["resourceVersion"],
            "annotations": {
                "ftd.dev/drained-by": "ftd",
                "ftd.dev/drain-reason": reason,
                "ftd.dev/cordoned-by-ftd": "true",
            },
        },
        "spec": {
            "unschedulable": True,
            "taints": [
                NODE_TAINT,  # another's taint kept as it was
                {
                    "key": "ftd.dev/fault",
                    "value": "xid-79-on-gpu-3-fallen-off-the-bus-now",
                    "effect": "NoSchedule",
                },
            ],
        },
    }
    # Evictions: only the ReplicaSet pod and the training pod; DaemonSet, mirror, finished pods skipped.
    evictions = api.calls("POST")
    assert sorted(r.path for r in evictions) == [
        "/api/v1/namespaces/train/pods/job7-0/eviction",
        "/api/v1/namespaces/web/pods/api-0/eviction",
    ]
    for r in evictions:
        assert r.content_type == "application/json"
        ns, name = r.path.split("/")[4], r.path.split("/")[6]
        assert r.body == {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
        }
    assert any(
        r.path == "/api/v1/pods" and r.query == {"fieldSelector": "spec.nodeName=node-2"}
        for r in api.calls("GET")
    )
    assert ("kube-system", "gpu-plugin-x") in api.pods and ("kube-system", "static-etcd") in api.pods
    assert ("web", "api-0") not in api.pods
    assert sorted(sched.last_drain["evicted"]) == ["train/job7-0", "web/api-0"]

    info = await sched.node_info("node-2")
    assert info.drained and "SchedulingDisabled" in info.flags and info.reason == reason
    assert not (await sched.node_info("node-3")).drained

    await sched.drain("node-2", "ftd: second reason")  # re-drain replaces reason and taint value
    node = api.nodes["node-2"]
    assert node["metadata"]["annotations"]["ftd.dev/drain-reason"] == "ftd: second reason"
    assert [t for t in node["spec"]["taints"] if t["key"] == "ftd.dev/fault"] == [
        {"key": "ftd.dev/fault", "value": "second-reason", "effect": "NoSchedule"}
    ]

    await sched.resume("node-2")
    node = api.nodes["node-2"]
    assert "unschedulable" not in node["spec"]
    assert node["spec"]["taints"] == [NODE_TAINT]
    assert not any(k.startswith("ftd.dev/") for k in node["metadata"]["annotations"])
    info = await sched.node_info("node-2")
    assert not info.drained and info.reason is None
    last = api.calls("PATCH")[-1]
    assert last.content_type == "application/merge-patch+json"
    assert last.body["spec"] == {"taints": [NODE_TAINT], "unschedulable": None}

    n = len(api.requests)
    await sched.resume("node-2")  # not drained: a no-op (one read, no patch)
    assert [r.method for r in api.requests[n:]] == ["GET"]


async def test_pdb_blocked_eviction_is_reported_not_fatal(
    api: FakeKubeApi, sched: KubernetesScheduler
) -> None:
    api.pdb_protected.add(("web", "api-0"))
    await sched.drain("node-2", "ecc")
    assert sched.last_drain["blocked"] == ["web/api-0"]
    assert ("web", "api-0") in api.pods
    assert (await sched.node_info("node-2")).drained


async def test_conflict_is_retried_with_fresh_resource_version(
    api: FakeKubeApi, sched: KubernetesScheduler
) -> None:
    sched.evict = False
    api.conflict_next_patch = 2
    await sched.drain("node-1", "xid 48")
    patches = api.calls("PATCH")
    assert len(patches) == 3
    versions = [p.body["metadata"]["resourceVersion"] for p in patches]
    assert len(set(versions)) == 3  # each retry re-read the node
    assert api.nodes["node-1"]["spec"]["unschedulable"] is True


async def test_operator_cordon_is_never_undone(api: FakeKubeApi, sched: KubernetesScheduler) -> None:
    api.add_node("node-9", unschedulable=True)
    info = await sched.node_info("node-9")
    assert info.drained and info.reason is None
    with pytest.raises(SchedulerError, match="not by ftd"):
        await sched.resume("node-9")
    # ftd drains it too (adds its taint), then resumes: its own taint goes, the operator's cordon stays.
    sched.evict = False
    await sched.drain("node-9", "xid 79")
    assert api.nodes["node-9"]["metadata"]["annotations"]["ftd.dev/cordoned-by-ftd"] == "false"
    await sched.resume("node-9")
    assert api.nodes["node-9"]["spec"]["unschedulable"] is True
    assert "taints" not in api.nodes["node-9"]["spec"]


async def test_requeue_deletes_job_pods_and_excludes_nodes(
    api: FakeKubeApi, sched: KubernetesScheduler
) -> None:
    before = await sched.job_info("job7")
    assert before.state == "RUNNING" and before.nodes == ("node-2", "node-3") and before.restarts == 2
    assert before.excluded == ()
    sched.evict = False
    await sched.requeue("job7", exclude=["node-2"])
    deletes = api.calls("DELETE")
    assert sorted(r.path for r in deletes) == [
        "/api/v1/namespaces/train/pods/job7-0",
        "/api/v1/namespaces/train/pods/job7-1",
    ]
    for r in deletes:
        assert r.content_type == "application/json"
        assert r.body == {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
    node = api.nodes["node-2"]
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["annotations"]["ftd.dev/drain-reason"] == "ftd: excluded from job job7"
    # The controller recreates the pods (pending, unscheduled); the exclusion shows in job_info.
    api.add_pod("train", "job7-0b", "", labels={"ftd.dev/job": "job7"}, phase="Pending")
    info = await sched.job_info("job7")
    assert info.state == "PENDING" and info.excluded == ("node-2",)
    assert any(r.query == {"fieldSelector": "spec.unschedulable=true"} for r in api.calls("GET"))


@pytest.mark.parametrize(
    "label",
    ["training.kubeflow.org/job-name", "jobset.sigs.k8s.io/jobset-name", "batch.kubernetes.io/job-name"],
)
async def test_training_operator_jobs_are_found_by_their_controllers_label(
    api: FakeKubeApi, sched: KubernetesScheduler, label: str
) -> None:
    """A PyTorchJob, a JobSet or a batch Job needs no ftd label: its pods carry the job's name."""
    api.add_pod("train", "llama-master-0", "node-3", labels={label: "llama"})
    api.add_pod("train", "llama-worker-0", "node-4", labels={label: "llama"})
    api.add_pod("train", "other-0", "node-1", labels={label: "other"})
    info = await sched.job_info("llama")
    assert info.state == "RUNNING" and info.nodes == ("node-3", "node-4")
    assert await sched.job_nodes("llama") == ("node-3", "node-4")
    await sched.requeue("llama")
    assert sorted(r.path for r in api.calls("DELETE")) == [
        "/api/v1/namespaces/train/pods/llama-master-0",
        "/api/v1/namespaces/train/pods/llama-worker-0",
    ]
    # ftd's own label is asked first: a job labelled both ways is one job, found once.
    assert api.calls("GET")[0].query["labelSelector"] == "ftd.dev/job=llama"


async def test_unknown_nodes_and_jobs_raise(api: FakeKubeApi, sched: KubernetesScheduler) -> None:
    for call in (sched.drain("node-99", "x"), sched.resume("node-99"), sched.node_info("node-99")):
        with pytest.raises(SchedulerError) as err:
            await call
        assert err.value.returncode == 404 and "node-99" in err.value.stderr
    for job_call in (sched.requeue("nojob"), sched.job_info("nojob")):
        with pytest.raises(SchedulerError, match="not found"):
            await job_call
    with pytest.raises(SchedulerError) as err:
        await sched.requeue("job7", exclude=["node-1", "node-99"])  # checked before anything changes
    assert err.value.returncode == 404
    assert not api.calls("DELETE") and not api.calls("PATCH")
    for bad in ("node 1", "-h", "a/b", ""):
        with pytest.raises(SchedulerError, match="invalid"):
            await sched.drain(bad, "x")


async def test_wrong_token_is_a_scheduler_error(api: FakeKubeApi) -> None:
    s = KubernetesScheduler(host=api.url, token="wrong", timeout_s=5)
    try:
        with pytest.raises(SchedulerError) as err:
            await s.node_info("node-1")
        assert err.value.returncode == 401
    finally:
        await s.close()


async def test_fake_is_strict(api: FakeKubeApi, sched: KubernetesScheduler) -> None:
    """The fake refuses what the real API server refuses, so the tests above can fail."""
    api.accept_patch_types = {"application/json-patch+json"}
    with pytest.raises(SchedulerError) as err:
        await sched.drain("node-1", "x")
    assert err.value.returncode == 415
    with pytest.raises(SchedulerError) as err:
        await sched._call("bogus", "read_namespaced_config_map", "x", "train")  # path the fake lacks
    assert err.value.returncode == 404


async def test_drain_and_resume_actions_through_kubernetes(
    api: FakeKubeApi, sched: KubernetesScheduler
) -> None:
    sched.evict = False
    state = ClusterState()
    req = ActionRequest(kind="drain_node", target="node-4", reason="xid 79 on GPU 0")
    await DrainNode(sched, state)(ActionRecord(id="a1", request=req, state=ActionState.RUNNING))
    assert api.nodes["node-4"]["metadata"]["annotations"]["ftd.dev/drain-reason"] == "ftd: xid 79 on GPU 0"
    res = ActionRequest(kind="resume_node", target="node-4", reason="healthy")
    await ResumeNode(sched, state)(ActionRecord(id="a2", request=res, state=ActionState.RUNNING))
    assert "unschedulable" not in api.nodes["node-4"]["spec"]


def test_reason_slug() -> None:
    assert reason_slug("ftd: Xid 79 on GPU 3") == "xid-79-on-gpu-3"
    assert reason_slug("ftd:") == "fault"
    slug = reason_slug("ftd: " + "x" * 100 + " y")
    assert len(slug) <= 63 and slug[-1].isalnum()


async def test_config_selects_kubernetes(api: FakeKubeApi, tmp_path: Path) -> None:
    (tmp_path / "t").write_text("test-token")
    config = parse_config(
        f'[coordinator]\nscheduler = "kubernetes"\n[coordinator.kubernetes]\nhost = "{api.url}"\n'
        f'token_file = "{tmp_path / "t"}"\nca_file = "{tmp_path / "none.crt"}"\n'
    )
    s = make_scheduler(config)
    assert isinstance(s, KubernetesScheduler)
    try:
        assert (await s.node_info("node-1")).state == "Ready"
    finally:
        await s.close()
