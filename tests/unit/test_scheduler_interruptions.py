"""Slurm's announced interruptions (issue #37): the pure decision from a job record, the timestamp
parser, and the poller's once-per-interruption emission against the fake scheduler."""

from __future__ import annotations

import time

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.coordinator.actions.scheduler import FakeScheduler, JobInfo, Reservation
from ftd.coordinator.actions.slurm import parse_timestamp
from ftd.coordinator.intake.scheduler_interruptions import (
    InterruptionPolicy,
    SchedulerInterruptions,
    interruptions_of,
    maintenance_of,
)
from ftd.events import Event, Interruption, Kind
from tests.properties import examples

NOW = 1_800_000_000.0
POLICY = InterruptionPolicy(time_limit_window_s=600.0, preempt_grace_s=20.0, kill_wait_s=30.0)


def _job(**kw: object) -> JobInfo:
    base: dict[str, object] = {
        "job": "7",
        "state": "RUNNING",
        "nodes": ("n1",),
        "excluded": (),
        "restarts": 0,
    }
    base.update(kw)
    return JobInfo(**base)  # type: ignore[arg-type]


def test_preempted_job_deadline_is_its_rewritten_end_time() -> None:
    # Slurm 22.05 sets EndTime = PreemptTime + GraceTime (here 45 s, not the configured 20).
    [it] = interruptions_of(_job(preempt_time=NOW - 5, end_time=NOW + 40), NOW, POLICY)
    assert it.source == "slurm_preempt"  # and not also a time limit, though EndTime is near
    assert it.deadline == NOW + 40 and it.notice_at == NOW - 5 and it.job == "7"


def test_preempted_job_without_end_time_uses_the_configured_grace() -> None:
    [it] = interruptions_of(_job(preempt_time=NOW - 5), NOW, POLICY)
    assert it.deadline == NOW - 5 + 20.0


def test_time_limit_inside_the_window_only() -> None:
    assert interruptions_of(_job(end_time=NOW + 601), NOW, POLICY) == []
    [it] = interruptions_of(_job(end_time=NOW + 600), NOW, POLICY)
    assert it.source == "slurm_time_limit" and it.deadline == NOW + 630.0


def test_nothing_for_a_job_that_is_not_running() -> None:
    for state in ("PENDING", "COMPLETED", "COMPLETING", "CANCELLED"):
        assert interruptions_of(_job(state=state, preempt_time=NOW, end_time=NOW + 1), NOW, POLICY) == []


@settings(max_examples=examples(300))
@given(
    preempt=st.none() | st.floats(0, 4e9, allow_nan=False),
    end=st.none() | st.floats(0, 4e9, allow_nan=False),
    now=st.floats(0, 4e9, allow_nan=False),
    later=st.floats(0, 3600, allow_nan=False),
)
def test_refs_are_stable_and_deadlines_never_before_the_announced_time(
    preempt: float | None, end: float | None, now: float, later: float
) -> None:
    info = _job(preempt_time=preempt, end_time=end)
    first = interruptions_of(info, now, POLICY)
    for it in first:
        anchor = preempt if it.source == "slurm_preempt" else end
        assert anchor is not None and it.deadline >= anchor
        msgspec.convert(msgspec.structs.asdict(it), Interruption)  # the contract's shape
    assert [it.source for it in first].count("slurm_preempt") == (preempt is not None)
    # Seen again later: the same refs (one interruption), a time limit never un-announced.
    again = {it.ref for it in interruptions_of(info, now + later, POLICY)}
    assert {it.ref for it in first} <= again
    assert len({it.ref for it in first}) == len(first)


def test_parse_timestamp_reads_scontrol_times_and_refuses_the_rest() -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(NOW))
    assert parse_timestamp(stamp) == NOW
    for bad in ("None", "Unknown", "", "2026-13-40T99:99:99", "2026-12-04 20:10:00", "12:00"):
        assert parse_timestamp(bad) is None, bad


@given(st.text(max_size=40))
@settings(max_examples=examples(300))
def test_parse_timestamp_never_raises(text: str) -> None:
    parse_timestamp(text)


async def test_poller_emits_each_interruption_once_and_drops_finished_jobs() -> None:
    fake = FakeScheduler()
    fake.add_job("7", ["n1"], time_limit_s=3600)
    seen: list[Event] = []

    async def emit(event: Event) -> None:
        seen.append(event)

    poller = SchedulerInterruptions(fake, emit, policy=POLICY)
    poller.watch("7", "n1")
    assert await poller.poll_once() == 0  # an hour left, nothing announced
    fake.preempt_job("7")
    assert await poller.poll_once() == 1
    assert await poller.poll_once() == 0  # the same preemption again: not a second event
    [event] = seen
    it = msgspec.convert(event.data, Interruption)
    assert event.kind == Kind.INTERRUPTION and event.node == "n1" and it.source == "slurm_preempt"
    assert abs(it.deadline - (time.time() + 20.0)) < 2.0  # EndTime = PreemptTime + GraceTime
    fake.finish_job("7", "PREEMPTED")
    await poller.poll_once()
    assert poller.watched == ()


async def test_poller_counts_failed_lookups_and_keeps_watching() -> None:
    fake = FakeScheduler()
    fake.add_job("8", ["n2"], time_limit_s=60)
    seen: list[Event] = []

    async def emit(event: Event) -> None:
        seen.append(event)

    poller = SchedulerInterruptions(fake, emit, policy=POLICY, max_failures=2)
    poller.watch("8", "n2")
    poller.watch("404", "n2")  # unknown to the scheduler (purged): a failure each poll, no crash
    await poller.poll_once()
    assert poller.failures == 1 and poller.watched == ("8", "404")
    await poller.poll_once()
    assert poller.failures == 2 and list(poller.watched) == ["8"]  # two in a row: given up
    [event] = seen  # the good job was announced once, undisturbed by the bad one
    assert event.data["source"] == "slurm_time_limit" and event.data["job"] == "8"


async def test_without_a_scheduler_nothing_is_watched() -> None:
    async def emit(event: Event) -> None:
        raise AssertionError(event)

    poller = SchedulerInterruptions(None, emit)
    poller.watch("7", "n1")
    assert poller.watched == () and await poller.poll_once() == 0


def _resv(
    name: str, nodes: tuple[str, ...], start: float, end: float | None, maint: bool = True
) -> Reservation:
    return Reservation(name=name, start=start, end=end, nodes=nodes, maintenance=maint)


def test_a_maintenance_reservation_on_the_jobs_nodes_before_its_end_is_announced() -> None:
    info = _job(nodes=("n1", "n2"), end_time=NOW + 3600)
    resvs = [
        _resv("maint1", ("n2", "n9"), NOW + 60, NOW + 660),  # on n2, before the job ends: announced
        _resv("users", ("n1",), NOW + 60, NOW + 660, maint=False),  # not MAINT
        _resv("other", ("n9",), NOW + 60, NOW + 660),  # not the job's nodes
        _resv("later", ("n1",), NOW + 3600, NOW + 4000),  # starts when the job has ended
        _resv("past", ("n1",), NOW - 600, NOW - 1),  # over
    ]
    [it] = maintenance_of(info, resvs, NOW)
    assert it.source == "slurm_maintenance" and it.deadline == NOW + 60 and it.job == "7"
    assert "maint1" in it.ref and "n2" in it.detail
    assert maintenance_of(_job(nodes=("n1",)), [_resv("m", ("n1",), NOW + 9e6, None)], NOW) != []  # no limit
    assert maintenance_of(_job(state="PENDING", nodes=("n2",)), resvs, NOW) == []


async def test_poller_lists_reservations_once_per_poll_and_announces_maintenance_once() -> None:
    fake = FakeScheduler()
    fake.add_job("7", ["n1"], time_limit_s=7200)
    fake.add_job("8", ["n2"], time_limit_s=7200)
    seen: list[Event] = []

    async def emit(event: Event) -> None:
        seen.append(event)

    poller = SchedulerInterruptions(fake, emit, policy=POLICY)
    poller.watch("7", "n1")
    poller.watch("8", "n2")
    fake.add_reservation("maint1", ["n1"], start_in_s=60, duration_s=600)
    assert await poller.poll_once() == 1
    assert await poller.poll_once() == 0
    assert [op for op, _ in fake.calls].count("list_reservations") == 2  # one per poll, not per job
    [event] = seen
    assert event.data["source"] == "slurm_maintenance" and event.data["job"] == "7"
