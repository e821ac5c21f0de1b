"""One contract for every Scheduler: FakeScheduler and SlurmScheduler against a real Slurm 22.05.

The same test body runs against both, so the fake the unit tests rely on cannot drift from what Slurm
really does (drain shows in ``sinfo -R``; requeue with exclusion of a running and of a finished job;
idempotent retries; errors for unknown nodes and jobs).
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ftd.coordinator.actions.scheduler import (
    FakeScheduler,
    JobInfo,
    Scheduler,
    SchedulerError,
    job_holder,
    sanitize_reason,
)
from ftd.coordinator.actions.slurm import HELD_BY_REQUEUE, SlurmScheduler, expand_hostlist, parse_oneliner
from tests.realparts import SlurmCluster


@dataclass
class Backend:
    """A scheduler plus the test-side controls to create jobs and look at it from outside."""

    sched: Scheduler
    cluster: SlurmCluster | None = None

    @property
    def fake(self) -> FakeScheduler:
        assert isinstance(self.sched, FakeScheduler)
        return self.sched

    async def running_job(self, *, requeue: bool = True, minutes: int | None = None) -> str:
        """A running job; ``minutes``: its time limit (``sbatch --time``), None for none."""
        if self.cluster is None:
            job = f"{len(self.fake.jobs) + 100}"
            limit = None if minutes is None else minutes * 60.0
            self.fake.add_job(job, ["node-1"], requeue=requeue, time_limit_s=limit)
            return job
        flags = ["--requeue" if requeue else "--no-requeue"]
        if minutes is not None:
            flags.append(f"--time={minutes}")
        job = await asyncio.to_thread(self.cluster.sbatch, None, *flags, wrap="sleep 300")
        await self.wait_job(job, "RUNNING")
        return job

    async def cancel(self, job: str) -> None:
        if self.cluster is None:
            self.fake.finish_job(job, "CANCELLED")
            return
        await asyncio.to_thread(self.cluster.run, "scancel", job)
        await self.wait_job(job, "CANCELLED")

    async def finished_job(self) -> str:
        if self.cluster is None:
            job = await self.running_job()
            self.fake.finish_job(job)
            return job
        job = await asyncio.to_thread(self.cluster.sbatch, None, "--requeue", wrap="true")
        await self.wait_job(job, "COMPLETED")
        return job

    async def wait_job(self, job: str, state: str, within_s: float = 20.0) -> JobInfo:
        deadline = time.monotonic() + within_s
        while True:
            info = await self.sched.job_info(job)
            if info.state == state or time.monotonic() > deadline:
                assert info.state == state, f"job {job} is {info.state}, expected {state}: {info}"
                return info
            await asyncio.sleep(0.1)

    async def drain_reasons(self) -> dict[str, str]:
        """Drained nodes and their reasons as the scheduler's own operator tool lists them."""
        if self.cluster is None:
            return {n: v.reason or "" for n, v in self.fake.nodes.items() if v.drained}
        out = (await asyncio.to_thread(self.cluster.run, "sinfo", "-R", "-h", "-o", "%N|%E")).stdout
        reasons: dict[str, str] = {}
        for line in out.splitlines():
            nodes, _, reason = line.partition("|")
            for node in expand_hostlist(nodes):
                reasons[node] = reason
        return reasons


@pytest.fixture(params=["fake", pytest.param("slurm", marks=pytest.mark.real)])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "fake":
        fake = FakeScheduler()
        for i in range(1, 5):
            fake.add_node(f"node-{i}")
        yield Backend(fake)
        return
    cluster: SlurmCluster = request.getfixturevalue("slurm")
    yield Backend(SlurmScheduler(slurm_conf=str(cluster.conf_path), timeout_s=30.0), cluster)


# -- the contract -----------------------------------------------------------------------------------


async def test_is_a_scheduler(backend: Backend) -> None:
    assert isinstance(backend.sched, Scheduler)
    assert backend.sched.name in {"fake", "slurm"}


async def test_drain_shows_sanitized_reason_then_resume(backend: Backend) -> None:
    s = backend.sched
    assert not (await s.node_info("node-2")).drained
    await s.drain("node-2", 'xid 79 on GPU 3\nfallen off the bus "now"')
    info = await s.node_info("node-2")
    assert info.drained and "DRAIN" in info.flags
    assert info.reason == "ftd: xid 79 on GPU 3 fallen off the bus 'now'"
    assert (await backend.drain_reasons())["node-2"] == info.reason

    await s.drain("node-2", "ftd: second reason")  # re-drain replaces the reason
    assert (await s.node_info("node-2")).reason == "ftd: second reason"
    assert not (await s.node_info("node-3")).drained  # only the named node

    await s.resume("node-2")
    info = await s.node_info("node-2")
    assert not info.drained and info.reason is None
    assert "node-2" not in await backend.drain_reasons()
    await s.resume("node-2")  # resuming an undrained node is a no-op, not an error


async def test_drain_node_with_running_job_keeps_job(backend: Backend) -> None:
    job = await backend.running_job()
    await backend.sched.drain("node-1", "ecc")
    assert (await backend.sched.node_info("node-1")).drained
    assert (await backend.sched.job_info(job)).state == "RUNNING"
    await backend.sched.resume("node-1")
    assert not (await backend.sched.node_info("node-1")).drained


async def test_a_running_jobs_time_left_is_its_limit_minus_its_run_time(backend: Backend) -> None:
    job = await backend.running_job(minutes=10)
    await asyncio.sleep(1.2)
    first = (await backend.sched.job_info(job)).time_left_s
    assert first is not None and 540 <= first < 600, first
    await asyncio.sleep(1.2)
    later = (await backend.sched.job_info(job)).time_left_s
    assert later is not None and later < first  # it counts down
    await backend.sched.requeue(job, exclude=["node-1"])  # kept pending: its only node excluded
    assert (await backend.wait_job(job, "PENDING")).time_left_s is None  # not running: no clock
    await backend.cancel(job)
    unlimited = await backend.running_job()
    assert (await backend.sched.job_info(unlimited)).time_left_s is None  # no limit: not known, not 0


async def test_requeue_running_job_with_exclusion(backend: Backend) -> None:
    job = await backend.running_job()
    before = await backend.sched.job_info(job)
    assert before.nodes == ("node-1",) and before.restarts == 0

    await backend.sched.requeue(job, exclude=["node-1"])
    info = await backend.wait_job(job, "PENDING")
    assert info.restarts == 1
    assert "node-1" in info.excluded
    assert info.reason != HELD_BY_REQUEUE  # never left held

    # A retry (coordinator restarted mid-action) adds the new exclusion, keeps the old, no 2nd restart.
    await backend.sched.requeue(job, exclude=["node-2"])
    info = await backend.sched.job_info(job)
    assert info.state == "PENDING" and info.restarts == 1
    assert {"node-1", "node-2"} <= set(info.excluded)


async def test_requeue_finished_job_with_exclusion(backend: Backend) -> None:
    job = await backend.finished_job()
    await backend.sched.requeue(job, exclude=["node-1"])
    info = await backend.wait_job(job, "PENDING")
    assert info.restarts == 1 and "node-1" in info.excluded
    assert info.reason != HELD_BY_REQUEUE


async def test_requeue_refused_for_no_requeue_job(backend: Backend) -> None:
    job = await backend.running_job(requeue=False)
    with pytest.raises(SchedulerError):
        await backend.sched.requeue(job, exclude=["node-1"])
    assert (await backend.sched.job_info(job)).state == "RUNNING"


async def test_requeue_held_keeps_the_job_pending_until_released(backend: Backend) -> None:
    """The pinned-job hold: requeued held (Restarts + 1), a retry does not count twice, release lets it go."""
    holder = job_holder(backend.sched)
    assert holder is not None
    job = await backend.running_job()
    await holder.requeue_held(job)
    info = await backend.wait_job(job, "PENDING")
    assert info.held and info.restarts == 1, info
    await holder.requeue_held(job)  # a retried requeue: still held, not a second restart
    info = await holder.job_info(job)
    assert info.held and info.restarts == 1 and info.state == "PENDING", info
    await holder.release(job)
    assert not (await holder.job_info(job)).held
    await holder.release(job)  # releasing a job that is not held is a no-op
    assert (await holder.job_info(job)).restarts == 1


async def test_requeue_held_of_a_job_that_never_started_holds_it(backend: Backend) -> None:
    holder = job_holder(backend.sched)
    assert holder is not None
    if backend.cluster is None:
        job = "200"
        backend.fake.add_job(job, [], state="PENDING")
    else:  # not eligible for an hour: the job stays pending
        job = await asyncio.to_thread(backend.cluster.sbatch, None, "--begin=now+3600", wrap="true")
        await backend.wait_job(job, "PENDING")
    await holder.requeue_held(job)
    info = await holder.job_info(job)
    assert info.held and info.state == "PENDING" and info.restarts == 0, info
    await holder.release(job)
    assert not (await holder.job_info(job)).held


async def test_unknown_nodes_and_jobs_raise(backend: Backend) -> None:
    s = backend.sched
    for call in (s.drain("node-99", "x"), s.resume("node-99"), s.node_info("node-99")):
        with pytest.raises(SchedulerError):
            await call
    for job_call in (s.requeue("99999"), s.job_info("99999")):
        with pytest.raises(SchedulerError):
            await job_call
    # A typo in the exclusion list is refused before the job is touched.
    job = await backend.running_job()
    with pytest.raises(SchedulerError, match="node-99"):
        await s.requeue(job, exclude=["node-1", "node-99"])
    info = await s.job_info(job)
    assert info.state == "RUNNING" and info.restarts == 0 and not info.excluded


# -- Slurm only ----------------------------------------------------------------------------------


@pytest.mark.real
async def test_slurm_requeued_job_runs_again(slurm: SlurmCluster) -> None:
    """Without exclusion the requeued job really starts again (so requeue never leaves it held)."""
    b = Backend(SlurmScheduler(slurm_conf=str(slurm.conf_path)), slurm)
    job = await b.running_job()
    await b.sched.requeue(job)
    info = await b.wait_job(job, "RUNNING", within_s=30)  # after cred_expire (5 s in the test cluster)
    assert info.restarts == 1 and info.nodes == ("node-1",)


@pytest.mark.real
async def test_slurm_held_job_starts_only_once_released(slurm: SlurmCluster) -> None:
    """A job requeued held stays pending past the time a plain requeue takes to start again."""
    sched = SlurmScheduler(slurm_conf=str(slurm.conf_path))
    b = Backend(sched, slurm)
    job = await b.running_job()
    await sched.requeue_held(job)
    await asyncio.sleep(10)  # a plain requeue runs again within ~6 s here (cred_expire=5)
    info = await sched.job_info(job)
    assert info.state == "PENDING" and info.held and info.reason == HELD_BY_REQUEUE, info
    await sched.release(job)
    info = await b.wait_job(job, "RUNNING", within_s=30)
    assert info.restarts == 1 and info.nodes == ("node-1",) and not info.held


@pytest.mark.real
async def test_slurm_error_names_command_status_and_stderr(slurm: SlurmCluster) -> None:
    sched = SlurmScheduler(slurm_conf=str(slurm.conf_path))
    with pytest.raises(SchedulerError) as err:
        await sched.drain("node-99", "x")
    assert err.value.returncode == 1
    assert err.value.command[:3] == ("scontrol", "update", "nodename=node-99")
    assert "invalid node name" in err.value.stderr.lower()
    assert "exit status 1" in str(err.value) and "scontrol update" in str(err.value)


async def test_slurm_timeout_kills_scontrol(tmp_path: Path) -> None:
    script = tmp_path / "scontrol"
    pidfile = tmp_path / "pid"
    script.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 30\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    sched = SlurmScheduler(scontrol=str(script), timeout_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(SchedulerError, match="timed out"):
        await sched.node_info("node-1")
    assert time.monotonic() - t0 < 5
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped


async def test_slurm_missing_binary_is_scheduler_error(tmp_path: Path) -> None:
    with pytest.raises(SchedulerError, match=r"cannot run .*nope"):
        await SlurmScheduler(scontrol=str(tmp_path / "nope")).drain("node-1", "x")


async def test_slurm_rejects_argument_injection() -> None:
    sched = SlurmScheduler(scontrol="/bin/false")
    for bad in ("node-1 state=resume", "-h", "a=b", ""):
        with pytest.raises(SchedulerError, match="invalid node"):
            await sched.drain(bad, "x")
    with pytest.raises(SchedulerError, match="invalid Slurm job id"):
        await sched.requeue("12;rm")


# -- helpers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("xid 79", "ftd: xid 79"),
        ("ftd: xid 79", "ftd: xid 79"),
        ('a\n"b"\\c\t d\x00', "ftd: a 'b' c d"),
        ("", "ftd:"),
        ("x" * 500, "ftd: " + "x" * 192 + "..."),
    ],
)
def test_sanitize_reason(raw: str, expected: str) -> None:
    got = sanitize_reason(raw)
    assert got == expected and len(got) <= 200


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("(null)", ()),
        ("node-1", ("node-1",)),
        ("node-[1-3,7]", ("node-1", "node-2", "node-3", "node-7")),
        ("gpu[08-10]x,cpu1", ("gpu08x", "gpu09x", "gpu10x", "cpu1")),
        ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),
    ],
)
def test_expand_hostlist(expr: str, names: tuple[str, ...]) -> None:
    assert expand_hostlist(expr) == names


def test_parse_oneliner_reasons() -> None:
    node = parse_oneliner(
        "NodeName=node-2 State=IDLE+DRAIN Partitions=spare  Reason=ftd: GPU=3 bad [root@2026-11-22T21:17:10]"
    )
    assert node["State"] == "IDLE+DRAIN" and node["Reason"] == "ftd: GPU=3 bad"
    job = parse_oneliner("JobId=5 JobState=PENDING Reason=BeginTime Dependency=(null) Command=/bin/x a b")
    assert job["Reason"] == "BeginTime" and job["Command"] == "/bin/x a b"
