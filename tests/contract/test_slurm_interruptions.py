"""Slurm's announced interruptions (issue #37) against the fake and a real Slurm 22.05 with
preemption enabled (:func:`ftd.bench.slurm_cluster.preemption_conf`): the poller emits one
``slurm_preempt`` / ``slurm_time_limit`` interruption with the deadline Slurm itself will enforce."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from ftd.bench.slurm_cluster import preemption_conf
from ftd.coordinator.actions.scheduler import FakeScheduler, JobInfo, Scheduler
from ftd.coordinator.actions.slurm import SlurmScheduler, parse_timestamp
from ftd.coordinator.intake.grace_watch import GraceWatch
from ftd.coordinator.intake.scheduler_interruptions import InterruptionPolicy, SchedulerInterruptions
from ftd.events import Event, Interruption, Kind
from tests.realparts import SlurmCluster

GRACE_S = 20
POLL_S = 0.5
POLICY = InterruptionPolicy(time_limit_window_s=600.0, kill_wait_s=2.0)  # KillWait=2 in the test cluster


@pytest.fixture(scope="module")
def preempt_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(
        tmp_path_factory.mktemp("slurm-preempt"), nodes=1, extra_conf=preemption_conf(GRACE_S)
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@dataclass
class Side:
    sched: Scheduler
    cluster: SlurmCluster | None = None

    async def low_job(self, minutes: int) -> str:
        """A running job of the preemptible partition with a ``minutes`` time limit."""
        if self.cluster is None:
            assert isinstance(self.sched, FakeScheduler)
            self.sched.add_job("11", ["node-1"], time_limit_s=minutes * 60.0)
            return "11"
        job = await asyncio.to_thread(
            self.cluster.sbatch, None, "-p", "low", "--requeue", f"--time={minutes}", wrap="sleep 600"
        )
        await asyncio.to_thread(self.cluster.wait_job_state, job, "RUNNING")
        return job

    async def preempt(self, job: str) -> None:
        """Start a job of the high partition on the same node: Slurm chooses ``job`` for preemption."""
        if self.cluster is None:
            assert isinstance(self.sched, FakeScheduler)
            self.sched.preempt_job(job, GRACE_S)
            return
        await asyncio.to_thread(self.cluster.sbatch, None, "-p", "high", wrap="sleep 600")

    async def reserve_for_maintenance(self, name: str) -> None:
        """node-1 reserved for maintenance from a minute from now, for 10 minutes (running jobs kept:
        ``ignore_jobs``, or Slurm refuses a reservation over a running job)."""
        if self.cluster is None:
            assert isinstance(self.sched, FakeScheduler)
            self.sched.add_reservation(name, ["node-1"], start_in_s=60, duration_s=600)
            return
        await asyncio.to_thread(
            self.cluster.run,
            "scontrol",
            "create",
            "reservation",
            f"reservationname={name}",
            "starttime=now+60",
            "duration=10",
            "nodes=node-1",
            "flags=maint,ignore_jobs",
            "users=root",
        )

    async def unreserve(self, name: str) -> None:
        if self.cluster is not None:
            await asyncio.to_thread(
                self.cluster.run, "scontrol", "delete", f"reservationname={name}", check=False
            )

    async def record(self, job: str) -> dict[str, str]:
        if self.cluster is None:
            return {}
        return await asyncio.to_thread(self.cluster.job, job)


@pytest.fixture(params=["fake", pytest.param("slurm", marks=pytest.mark.real)])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    if request.param == "fake":
        yield Side(FakeScheduler())
        return
    cluster: SlurmCluster = request.getfixturevalue("preempt_cluster")
    cluster.reset()
    try:
        yield Side(SlurmScheduler(slurm_conf=str(cluster.conf_path), timeout_s=30.0), cluster)
    finally:
        cluster.reset()


async def _first(poller: SchedulerInterruptions, seen: list[Event], within_s: float) -> Interruption:
    """Poll every POLL_S until an interruption is emitted (at most ``within_s``)."""
    deadline = time.monotonic() + within_s
    while not seen:
        assert time.monotonic() < deadline, "no interruption emitted"
        await poller.poll_once()
        if not seen:
            await asyncio.sleep(POLL_S)
    [event] = seen
    assert event.kind == Kind.INTERRUPTION and event.node == "node-1"
    return msgspec.convert(event.data, Interruption)


async def test_a_time_limit_inside_the_window_is_announced_once(side: Side) -> None:
    seen: list[Event] = []

    async def emit(event: Event) -> None:
        seen.append(event)

    job = await side.low_job(minutes=5)  # 300 s left: inside the 600 s window
    poller = SchedulerInterruptions(side.sched, emit, policy=POLICY, interval_s=POLL_S)
    poller.watch(job, "node-1")
    it = await _first(poller, seen, within_s=5)
    assert it.source == "slurm_time_limit" and it.job == job
    assert 290 <= it.deadline - 2.0 - time.time() <= 302  # EndTime (+ KillWait) about 5 min ahead
    rec = await side.record(job)
    if rec:  # the real Slurm's own EndTime, to the second
        end = parse_timestamp(rec["EndTime"])
        assert end is not None and it.deadline == end + 2.0
    await poller.poll_once()
    assert len(seen) == 1  # seen again: the same interruption, not a second one


async def test_a_preempted_job_is_announced_with_its_grace_end_as_deadline(side: Side) -> None:
    seen: list[Event] = []

    async def emit(event: Event) -> None:
        seen.append(event)

    job = await side.low_job(minutes=60)  # far from its limit: nothing to announce
    poller = SchedulerInterruptions(side.sched, emit, policy=POLICY, interval_s=POLL_S)
    poller.watch(job, "node-1")
    assert await poller.poll_once() == 0
    asked = time.time()
    await side.preempt(job)
    it = await _first(poller, seen, within_s=10)
    assert it.source == "slurm_preempt" and it.job == job
    assert asked - 1.5 <= it.notice_at <= time.time()  # PreemptTime: when the high job came
    assert it.deadline == pytest.approx(it.notice_at + GRACE_S, abs=1.0)  # + the partition's GraceTime
    rec = await side.record(job)
    if rec:
        assert rec["JobState"] == "RUNNING"  # still running through its grace: time to save
        assert it.deadline == parse_timestamp(rec["EndTime"])
    for _ in range(3):
        await poller.poll_once()
    assert len(seen) == 1


async def test_a_maintenance_reservation_over_the_jobs_node_is_announced_with_its_start(side: Side) -> None:
    seen: list[Event] = []

    async def emit(event: Event) -> None:
        seen.append(event)

    job = await side.low_job(minutes=60)
    poller = SchedulerInterruptions(side.sched, emit, policy=POLICY, interval_s=POLL_S)
    poller.watch(job, "node-1")
    assert await poller.poll_once() == 0
    asked = time.time()
    await side.reserve_for_maintenance("ftdmaint")
    try:
        it = await _first(poller, seen, within_s=5)
        await poller.poll_once()
    finally:
        await side.unreserve("ftdmaint")
    assert it.source == "slurm_maintenance" and it.job == job and "ftdmaint" in it.ref
    assert asked + 58 <= it.deadline <= time.time() + 61  # StartTime: now+60, whole seconds
    assert len(seen) == 1


async def test_every_job_watches_a_job_no_agent_reported_and_announces_its_maintenance(side: Side) -> None:
    """``every_job``: a job without the client (never watch()ed: no agent reported its ranks) is found
    in the scheduler's listing of running jobs and announced like the others."""
    seen: list[Event] = []

    async def emit(event: Event) -> None:
        seen.append(event)

    job = await side.low_job(minutes=60)
    plain = SchedulerInterruptions(side.sched, emit, policy=POLICY, interval_s=POLL_S)
    poller = SchedulerInterruptions(side.sched, emit, policy=POLICY, interval_s=POLL_S, every_job=True)
    assert await poller.poll_once() == 0 and job in poller.watched
    await side.reserve_for_maintenance("ftdmaint2")
    try:
        assert await plain.poll_once() == 0 and plain.watched == ()  # without every_job: never seen
        it = await _first(poller, seen, within_s=5)
    finally:
        await side.unreserve("ftdmaint2")
    assert it.source == "slurm_maintenance" and it.job == job


@pytest.mark.real
def test_check_config_grace_audit_reads_the_real_slurm(
    preempt_cluster: SlurmCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ftd check-config --grace`` against the real cluster: KillWait=2 and partition low's GraceTime=20
    are too short for a 30 s save; ``high`` (PreemptMode=OFF) is never preempted, so not named."""
    from ftd.cli import main

    path = tmp_path / "ftd.toml"
    path.write_text(
        f'[coordinator]\nscheduler = "slurm"\nsave_deadline_s = 30\n'
        f'[coordinator.slurm]\nslurm_conf = "{preempt_cluster.conf_path}"\n'
    )
    assert (
        main(
            ["check-config", str(path), "--for", "coordinator", "--no-files", "--grace", "--stop-grace", "10"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "KillWait 2.0s" in out
    warnings = [line for line in out.splitlines() if "WARNING" in line]
    assert any("PartitionName=low GraceTime" in w and "GraceTime=20s" in w for w in warnings), out
    assert not any("PartitionName=high" in w for w in warnings), out
    assert any("ftd run --stop-grace:" in w for w in warnings), out
    assert any("KillWait / sbatch --signal" in w for w in warnings), out


@pytest.mark.real
async def test_the_grace_audit_at_a_jobs_first_look_reads_its_real_partition(
    preempt_cluster: SlurmCluster,
) -> None:
    """The coordinator's wiring: the poller hands each running job's record to the grace watch, which
    names the job's partition (low: GraceTime=20) and KillWait=2 as too short for a 30 s save."""
    preempt_cluster.reset()
    sched = SlurmScheduler(slurm_conf=str(preempt_cluster.conf_path), timeout_s=30.0)
    watch = GraceWatch(sched.grace, save_s=30.0)
    found: list[str] = []

    async def on_running(info: JobInfo) -> None:
        found.extend(f.setting for f in await watch.job_seen(info))

    async def emit(event: Event) -> None:
        pass

    job = await Side(sched, preempt_cluster).low_job(minutes=60)
    try:
        poller = SchedulerInterruptions(sched, emit, policy=POLICY, on_running=on_running)
        poller.watch(job, "node-1")
        await poller.poll_once()
        await poller.poll_once()
    finally:
        preempt_cluster.reset()
    assert found == ["slurm.conf KillWait / sbatch --signal", "slurm.conf PartitionName=low GraceTime"]
