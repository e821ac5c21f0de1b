"""The Kubernetes seam reads a job's announced ends (issue #37): KubernetesScheduler.job_interruptions
against the strict fake API server (tests/fakes/kube_api.py, the one the scheduler contract runs on):
a pod being deleted -> k8s_pod_deletion due at its deletionTimestamp; a DisruptionTarget condition ->
k8s_disruption; pods of other jobs and healthy pods -> nothing. pod_interruptions itself is a pure
reader that never raises on any pod JSON."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.coordinator.actions.kubernetes import KubernetesScheduler, pod_interruptions
from tests.fakes.kube_api import FakeKubeApi
from tests.properties import examples

pytest.importorskip("kubernetes_asyncio")

JOB = {"ftd.dev/job": "job7"}
T0 = dt.datetime(2026, 12, 4, 20, 0, 0, tzinfo=dt.UTC)


def rfc3339(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
async def sched(tmp_path: Path) -> AsyncIterator[tuple[KubernetesScheduler, FakeKubeApi]]:
    api = FakeKubeApi()
    api.add_node("node-1")
    api.add_node("node-2")
    api.add_pod("train", "job7-0", "node-1", labels=JOB)  # healthy
    api.add_pod(
        "train",
        "job7-1",
        "node-1",
        labels=JOB,
        deletion_timestamp=rfc3339(T0 + dt.timedelta(seconds=45)),
        deletion_grace_s=45,
    )
    api.add_pod(
        "train",
        "job7-2",
        "node-2",
        labels=JOB,
        grace_s=90,
        conditions=[
            {"type": "Ready", "status": "True", "lastTransitionTime": rfc3339(T0)},
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "PreemptionByScheduler",
                "lastTransitionTime": rfc3339(T0),
            },
        ],
    )
    api.add_pod("train", "other-0", "node-2", labels={"ftd.dev/job": "other"}, deletion_timestamp=rfc3339(T0))
    await api.start()
    token = tmp_path / "token"
    token.write_text("test-token\n")
    s = KubernetesScheduler(host=api.url, token_file=str(token), namespace="train", timeout_s=5)
    try:
        yield s, api
    finally:
        await s.close()
        await api.stop()


async def test_deleting_and_disrupted_pods_are_interruptions_of_their_job(
    sched: tuple[KubernetesScheduler, FakeKubeApi],
) -> None:
    s, api = sched
    found = {i.source: i for i in await s.job_interruptions("job7")}
    assert set(found) == {"k8s_pod_deletion", "k8s_disruption"}
    deletion = found["k8s_pod_deletion"]
    assert deletion.deadline == (T0 + dt.timedelta(seconds=45)).timestamp()
    assert deletion.notice_at == T0.timestamp()
    assert (deletion.job, deletion.ref) == ("job7", "uid-train-job7-1:deletion")
    disruption = found["k8s_disruption"]
    assert disruption.deadline == T0.timestamp() + 90  # its terminationGracePeriodSeconds
    assert disruption.ref == "uid-train-job7-2:disruption"
    assert "PreemptionByScheduler" in disruption.detail
    # only the job's pods were listed, by its label
    gets = [r for r in api.calls("GET") if r.path.endswith("/pods")]
    assert gets and all("ftd.dev/job=job7" in str(r.query) for r in gets)


async def test_unknown_job_or_bad_id_has_none(sched: tuple[KubernetesScheduler, FakeKubeApi]) -> None:
    s, _ = sched
    assert await s.job_interruptions("nojob") == []
    assert await s.job_interruptions("bad id!") == []


def test_a_disruption_with_a_deletion_is_due_at_the_deletion() -> None:
    pod = {
        "metadata": {
            "uid": "u1",
            "name": "p",
            "deletionTimestamp": rfc3339(T0),
            "deletionGracePeriodSeconds": 30,
        },
        "status": {
            "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]
        },
    }
    found = {i.source: i for i in pod_interruptions(pod, "j")}
    assert found["k8s_disruption"].deadline == T0.timestamp()
    assert found["k8s_disruption"].notice_at == T0.timestamp() - 30
    # a condition stamped after the deletion time (clock skew between components): still no later
    # than its deadline
    conds = pod["status"]["conditions"]  # type: ignore[index]
    conds[0]["lastTransitionTime"] = rfc3339(T0 + dt.timedelta(seconds=5))
    late = {i.source: i for i in pod_interruptions(pod, "j")}["k8s_disruption"]
    assert late.notice_at <= late.deadline == T0.timestamp()
    # a condition that is False announces nothing
    pod["metadata"] = {"uid": "u1"}
    pod["status"]["conditions"][0]["status"] = "False"  # type: ignore[index]
    assert pod_interruptions(pod, "j") == []


_any: Any = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=10,
)
_pods = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries(
            {},
            optional={
                "uid": st.text(max_size=8) | _any,
                "deletionTimestamp": st.datetimes(timezones=st.just(dt.UTC)).map(lambda t: t.isoformat())
                | _any,
                "deletionGracePeriodSeconds": st.integers(-5, 10**7) | _any,
            },
        )
        | _any,
        "spec": st.fixed_dictionaries({}, optional={"terminationGracePeriodSeconds": _any}) | _any,
        "status": st.fixed_dictionaries(
            {},
            optional={
                "conditions": st.lists(
                    st.fixed_dictionaries(
                        {"type": st.just("DisruptionTarget") | _any, "status": st.just("True") | _any},
                        optional={"lastTransitionTime": st.just(rfc3339(T0)) | _any},
                    ),
                    max_size=3,
                )
                | _any
            },
        )
        | _any,
    },
)


@settings(max_examples=examples(300), deadline=None)
@given(pod=_pods)
def test_any_pod_json_gives_interruptions_or_none_never_raises(pod: dict[str, Any]) -> None:
    for found in pod_interruptions(pod, "j"):
        assert found.job == "j"
        assert found.ref.endswith((":deletion", ":disruption"))
        assert found.deadline >= found.notice_at


async def test_the_coordinators_poller_announces_each_pod_interruption_once(
    sched: tuple[KubernetesScheduler, FakeKubeApi],
) -> None:
    from ftd.coordinator.intake.scheduler_interruptions import InterruptionPolicy, SchedulerInterruptions
    from ftd.events import Event

    s, _ = sched
    emitted: list[Event] = []

    async def emit(event: Event) -> None:
        emitted.append(event)

    poller = SchedulerInterruptions(
        s, emit, policy=InterruptionPolicy(), interval_s=1.0, clock=lambda: T0.timestamp()
    )
    poller.watch("job7", "node-1")
    assert await poller.poll_once() == 2
    assert sorted(e.data["source"] for e in emitted) == ["k8s_disruption", "k8s_pod_deletion"]
    assert {e.data["job"] for e in emitted} == {"job7"}
    assert await poller.poll_once() == 0  # the same pods seen again: nothing new


async def test_the_pods_grace_is_the_shortest_of_the_jobs_pods(
    sched: tuple[KubernetesScheduler, FakeKubeApi],
) -> None:
    """Issue #37 item 5 on Kubernetes: the grace audit reads the job's pods' termination grace; a pod
    that sets none has the API server's 30 s."""
    from ftd.coordinator.actions.scheduler import JobInfo
    from ftd.coordinator.intake.grace_watch import PodGraceWatch

    s, _ = sched
    assert await s.pod_grace("job7") == 30.0  # job7-0 and job7-1 set none (30 s), job7-2 90 s
    assert await s.pod_grace("nobody") is None
    measured: dict[str, float] = {}
    watch = PodGraceWatch(s.pod_grace, save_s=20.0, measured=measured.get)
    info = JobInfo("job7", "RUNNING", ("node-1",), (), 0)
    assert await watch.job_seen(info) == []  # 20 s fits 30 s
    measured["job7"] = 75.0
    [finding] = await watch.job_seen(info)
    assert finding.setting == "pod spec.terminationGracePeriodSeconds" and "at least 85" in finding.message
