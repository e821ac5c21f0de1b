"""ftd run's stop grace from the deadline (issue #37 item 4): scontrol's fields, Slurm's times, the
preemption deadline (PreemptTime + the partition's GraceTime), the EndTime fallback and the bound."""

from __future__ import annotations

import time
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.supervisor.deadline import MAX_GRACE_S, parse_fields, slurm_deadline, slurm_time, stop_grace
from tests.properties import examples

JOB = (
    "JobId=12 JobName=train UserId=root(0) JobState=RUNNING Reason=None Restarts=0 "
    "SubmitTime=2026-12-04T20:00:00 PreemptTime={preempt} EndTime={end} Partition=low NodeList=node-1"
)
PART = "PartitionName=low AllowGroups=ALL PriorityTier=1 GraceTime={grace} State=UP"


def fake(job: str | None, part: str | None = None) -> tuple[list[list[str]], object]:
    calls: list[list[str]] = []

    def scontrol(args: list[str], env: Mapping[str, str]) -> str | None:
        calls.append(args)
        return job if args[1] == "job" else part

    return calls, scontrol


def test_fields_and_times() -> None:
    fields = parse_fields(JOB.format(preempt="2026-12-04T20:01:53", end="Unknown"))
    assert fields["JobId"] == "12" and fields["Partition"] == "low" and fields["EndTime"] == "Unknown"
    assert slurm_time("2026-12-04T20:01:53") == time.mktime((2026, 12, 4, 20, 1, 53, 0, 0, -1))
    assert slurm_time("Unknown") is None and slurm_time("None") is None and slurm_time("") is None


def test_a_preempted_job_ends_at_preempttime_plus_gracetime() -> None:
    calls, scontrol = fake(JOB.format(preempt="2026-12-04T20:01:53", end="Unknown"), PART.format(grace=20))
    got = slurm_deadline({"SLURM_JOB_ID": "12"}, scontrol)  # type: ignore[arg-type]
    assert got is not None
    assert got[0] == slurm_time("2026-12-04T20:01:53") + 20
    assert "GraceTime 20 s" in got[1]
    assert calls == [["show", "job", "-o", "12"], ["show", "partition", "-o", "low"]]


def test_a_job_not_preempted_ends_at_its_endtime() -> None:
    _, scontrol = fake(JOB.format(preempt="None", end="2026-12-04T22:00:00"))
    assert slurm_deadline({"SLURM_JOB_ID": "12"}, scontrol) == (  # type: ignore[arg-type]
        slurm_time("2026-12-04T22:00:00"),
        "Slurm EndTime 2026-12-04T22:00:00",
    )


@pytest.mark.parametrize(
    ("env", "job", "part"),
    [
        ({}, "x", None),  # not under Slurm: scontrol is not even asked
        ({"SLURM_JOB_ID": "12; rm"}, "x", None),
        ({"SLURM_JOB_ID": "12"}, None, None),  # scontrol failed
        ({"SLURM_JOB_ID": "12"}, JOB.format(preempt="None", end="Unknown"), None),  # no time limit
        ({"SLURM_JOB_ID": "12"}, JOB.format(preempt="2026-12-04T20:01:53", end="Unknown"), None),
        ({"SLURM_JOB_ID": "12"}, JOB.format(preempt="2026-12-04T20:01:53", end="Unknown"), "GraceTime=x"),
    ],
)
def test_no_deadline_when_it_is_not_known(env: dict[str, str], job: str | None, part: str | None) -> None:
    _, scontrol = fake(job, part)
    assert slurm_deadline(env, scontrol) is None  # type: ignore[arg-type]


def test_stop_grace_runs_to_the_deadline_within_bounds() -> None:
    assert stop_grace(10.0, 1000.0, (1019.5, "why")) == (19.5, "why")
    assert stop_grace(10.0, 1000.0, (999.0, "past")) == (10.0, "--stop-grace")
    assert stop_grace(10.0, 1000.0, (1000.0 + MAX_GRACE_S + 1, "far")) == (10.0, "--stop-grace")
    assert stop_grace(10.0, 1000.0, None) == (10.0, "--stop-grace")


@pytest.mark.property
@settings(max_examples=examples(300))
@given(st.text(max_size=200))
def test_scontrol_output_never_raises(text: str) -> None:
    fields = parse_fields(text)
    assert all("=" not in k and k for k in fields)
    slurm_time(text)
    _, scontrol = fake(text, text)
    got = slurm_deadline({"SLURM_JOB_ID": "12"}, scontrol)  # type: ignore[arg-type]
    assert got is None or isinstance(got[0], float)


def test_a_preempted_job_with_a_rewritten_endtime_ends_then_whatever_grants_the_grace() -> None:
    """slurmctld sets a preempted job's EndTime to PreemptTime + GraceTime, the partition's or (with
    preempt/qos) the QOS's: that EndTime is the deadline, without asking for the partition. Before, a
    QOS grace over a partition with GraceTime=0 gave a deadline at PreemptTime itself."""
    calls, scontrol = fake(
        JOB.format(preempt="2026-12-04T20:01:53", end="2026-12-04T20:03:23"), PART.format(grace=0)
    )
    got = slurm_deadline({"SLURM_JOB_ID": "12"}, scontrol)  # type: ignore[arg-type]
    assert got == (
        slurm_time("2026-12-04T20:03:23"),
        "Slurm preemption at 2026-12-04T20:01:53 + GraceTime 90 s",
    )
    assert calls == [["show", "job", "-o", "12"]]


def test_a_preempted_job_whose_endtime_is_not_after_the_preemption_uses_the_partition() -> None:
    _, scontrol = fake(
        JOB.format(preempt="2026-12-04T20:01:53", end="2026-12-04T20:01:53"), PART.format(grace=20)
    )
    got = slurm_deadline({"SLURM_JOB_ID": "12"}, scontrol)  # type: ignore[arg-type]
    assert got is not None and got[0] == slurm_time("2026-12-04T20:01:53") + 20
