"""A job's time left before its scheduler time limit: Slurm's durations parsed
(:func:`ftd.coordinator.actions.slurm.parse_duration`), and the coordinator's cache of them
(:class:`ftd.coordinator.intake.time_left.JobTimeLeft`) on the scheduler fake."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as hs

from ftd.coordinator.actions.scheduler import FakeScheduler, JobInfo, SchedulerError
from ftd.coordinator.actions.slurm import parse_duration, time_left
from ftd.coordinator.intake.time_left import JobTimeLeft


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("00:10:00", 600.0),
        ("1-02:03:04", 93784.0),
        ("5:07", 307.0),  # minutes:seconds
        ("45", 2700.0),  # minutes
        ("2-3", 183600.0),  # days-hours
        ("2-3:30", 185400.0),  # days-hours:minutes
        ("UNLIMITED", None),
        ("Partition_Limit", None),
        ("NONE", None),
        ("", None),
        ("1:2:3:4", None),
        ("-5", None),
        ("\uff11\uff10", None),  # full-width digits: not Slurm's
    ],
)
def test_slurm_durations(text: str, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


@given(hs.integers(0, 10**6 - 1), hs.integers(0, 23), hs.integers(0, 59), hs.integers(0, 59))
def test_what_scontrol_prints_reads_back(days: int, hours: int, minutes: int, seconds: int) -> None:
    text = (
        f"{days}-{hours:02d}:{minutes:02d}:{seconds:02d}"
        if days
        else f"{hours:02d}:{minutes:02d}:{seconds:02d}"
    )
    assert parse_duration(text) == ((days * 24 + hours) * 60 + minutes) * 60 + seconds


@given(hs.text(max_size=40))
def test_any_text_is_a_duration_or_none(text: str) -> None:
    got = parse_duration(text)
    assert got is None or got >= 0


def test_time_left_of_a_record() -> None:
    running = {"JobState": "RUNNING", "TimeLimit": "00:10:00", "RunTime": "00:01:30"}
    assert time_left(running) == 510.0
    assert time_left({**running, "RunTime": "00:11:00"}) == 0.0  # past its limit, in its KillWait
    assert time_left({**running, "TimeLimit": "UNLIMITED"}) is None
    assert time_left({**running, "JobState": "PENDING"}) is None
    assert time_left({"JobState": "RUNNING"}) is None


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


async def _settle(cache: JobTimeLeft) -> None:
    for _ in range(5):
        await asyncio.sleep(0)
    await asyncio.gather(*cache._asking.values())


def _counted(sched: FakeScheduler, fail: list[SchedulerError] | None = None) -> list[str]:
    """The jobs ``sched.job_info`` is asked about (the fake records only what acts); each error in
    ``fail`` is raised by one lookup."""
    asked: list[str] = []
    real = sched.job_info

    async def job_info(job: str) -> JobInfo:
        asked.append(job)
        if fail:
            raise fail.pop(0)
        return await real(job)

    sched.job_info = job_info  # type: ignore[method-assign]
    return asked


async def test_looked_up_aside_then_counted_down_and_refreshed() -> None:
    sched = FakeScheduler()
    sched.add_job("7", ["node-1"], time_limit_s=600)
    asked = _counted(sched)
    clock = _Clock()
    cache = JobTimeLeft(sched, max_age_s=60, clock=clock)
    assert cache.remaining("7") is None  # never waits on the scheduler
    cache.want("7")
    cache.want("7")  # one lookup in flight per job
    await _settle(cache)
    assert asked == ["7"]
    assert cache.remaining("7") == pytest.approx(600, abs=2)
    clock.t += 30
    assert cache.remaining("7") == pytest.approx(570, abs=2)
    cache.want("7")  # fresh: no new lookup
    await _settle(cache)
    assert asked == ["7"]
    clock.t += 31
    sched.jobs["7"].ends_at += 3600  # the limit was raised (scontrol update TimeLimit)
    cache.want("7")
    await _settle(cache)
    assert asked == ["7", "7"] and cache.remaining("7") == pytest.approx(4200, abs=2)
    clock.t += 10**6
    assert cache.remaining("7") == 0.0


async def test_no_limit_a_failed_lookup_and_no_scheduler_are_unknown() -> None:
    sched = FakeScheduler()
    sched.add_job("8", ["node-1"])  # no time limit
    cache = JobTimeLeft(sched)
    cache.want("8")
    await _settle(cache)
    assert cache.remaining("8") is None
    _counted(sched, [SchedulerError("slurmctld does not answer")])
    sched.add_job("9", ["node-1"], time_limit_s=60)
    cache.want("9")
    await _settle(cache)
    assert cache.remaining("9") is None
    none = JobTimeLeft(None)
    none.want("9")
    assert none.remaining("9") is None and none._asking == {}
    await cache.close()


async def test_memory_is_bounded() -> None:
    sched = FakeScheduler()
    cache = JobTimeLeft(sched, max_jobs=3)
    for job in range(10):
        sched.add_job(str(job), ["node-1"], time_limit_s=60)
        cache.want(str(job))
        await _settle(cache)
    assert list(cache._known) == ["7", "8", "9"]
