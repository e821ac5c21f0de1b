"""The grace audit (issue #37 item 5): Slurm's KillWait and partitions' GraceTime, read from captured
``scontrol`` output, against a job's save time and the launcher's stop grace."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.coordinator.actions.scheduler import JobInfo, SchedulerError
from ftd.coordinator.actions.slurm import grace_of
from ftd.coordinator.decide.grace_audit import SlurmGrace, audit_grace
from ftd.coordinator.intake.grace_watch import GraceWatch
from tests.properties import examples

# Captured by hand from Slurm 22.05 (ftd.bench.slurm_cluster.preemption_conf, KillWait=2), trimmed.
SHOW_CONFIG = """Configuration data as of 2026-12-04T20:13:30
AccountingStorageType   = accounting_storage/none
KillWait                = 2 sec
PreemptMode             = REQUEUE
PreemptType             = preempt/partition_prio
PreemptExemptTime       = 00:00:00
"""
SHOW_PARTITION = (
    "PartitionName=debug AllowGroups=ALL Default=YES GraceTime=0 Hidden=NO PriorityTier=1 "
    "PreemptMode=REQUEUE State=UP\n"
    "PartitionName=low AllowGroups=ALL Default=NO GraceTime=20 Hidden=NO PriorityTier=1 "
    "PreemptMode=REQUEUE State=UP\n"
    "PartitionName=high AllowGroups=ALL Default=NO GraceTime=0 Hidden=NO PriorityTier=10 "
    "PreemptMode=OFF State=UP\n"
)


def test_reads_kill_wait_and_each_partitions_grace() -> None:
    grace = grace_of(SHOW_CONFIG, SHOW_PARTITION)
    assert grace.kill_wait_s == 2.0
    assert dict(grace.partitions) == {
        "debug": (0.0, "REQUEUE"),
        "low": (20.0, "REQUEUE"),
        "high": (0.0, "OFF"),
    }


def test_unreadable_values_are_left_out() -> None:
    grace = grace_of("KillWait = soon\n", "PartitionName=x GraceTime=later PreemptMode=OFF\n")
    assert grace.kill_wait_s is None and dict(grace.partitions) == {}


def test_names_each_setting_too_short_for_the_save() -> None:
    found = audit_grace(grace_of(SHOW_CONFIG, SHOW_PARTITION), save_s=30.0, stop_grace_s=10.0)
    settings_named = [f.setting for f in found]
    assert settings_named == [
        "slurm.conf KillWait / sbatch --signal",
        "slurm.conf PartitionName=debug GraceTime",
        "slurm.conf PartitionName=low GraceTime",
        "ftd run --stop-grace",
        "ftd run --stop-grace / slurm.conf KillWait",
    ]
    assert "GraceTime=20s" in found[2].message and "at least 31" in found[2].message


def test_enough_grace_everywhere_is_silent() -> None:
    grace = SlurmGrace(kill_wait_s=120.0, partitions={"low": (90.0, "REQUEUE"), "high": (0.0, "OFF")})
    assert audit_grace(grace, save_s=60.0, stop_grace_s=90.0) == []


@settings(max_examples=examples(300))
@given(
    kill_wait=st.none() | st.floats(0, 3600),
    grace=st.floats(0, 3600),
    mode=st.sampled_from(["OFF", "REQUEUE", "CANCEL", "SUSPEND"]),
    save=st.floats(0.1, 3600),
)
def test_a_finding_exactly_when_a_preemptible_grace_is_short(
    kill_wait: float | None, grace: float, mode: str, save: float
) -> None:
    found = audit_grace(SlurmGrace(kill_wait_s=kill_wait, partitions={"p": (grace, mode)}), save_s=save)
    partition_findings = [f for f in found if "PartitionName=p" in f.setting]
    assert bool(partition_findings) == (mode != "OFF" and grace < save)
    assert any("KillWait" in f.setting for f in found) == (kill_wait is not None and kill_wait < save)


async def test_each_job_is_audited_once_against_its_own_partition() -> None:
    reads: list[int] = []

    async def read() -> SlurmGrace:
        reads.append(1)
        return grace_of(SHOW_CONFIG, SHOW_PARTITION)

    watch = GraceWatch(read, save_s=30.0)
    low = JobInfo("7", "RUNNING", ("node-1",), (), 0, partition="low")
    high = JobInfo("8", "RUNNING", ("node-1",), (), 0, partition="high")
    assert [f.setting for f in await watch.job_seen(low)] == [
        "slurm.conf KillWait / sbatch --signal",
        "slurm.conf PartitionName=low GraceTime",
    ]
    assert await watch.job_seen(low) == []  # once per job
    assert [f.setting for f in await watch.job_seen(high)] == ["slurm.conf KillWait / sbatch --signal"]
    assert reads == [1]  # the settings read once, not per job


async def test_settings_that_cannot_be_read_audit_nothing_and_never_raise() -> None:
    async def read() -> SlurmGrace:
        raise SchedulerError("scontrol timed out")

    watch = GraceWatch(read, save_s=30.0)
    assert await watch.job_seen(JobInfo("7", "RUNNING", ("n1",), (), 0, partition="low")) == []


async def test_a_job_is_audited_once_more_when_its_own_saves_are_measured() -> None:
    """Issue #37 item 5: the configured save time fits the partition's grace, the job's measured p95
    does not -- the job is named once its saves are measured, and only once more."""

    async def read() -> SlurmGrace:
        return grace_of(SHOW_CONFIG, SHOW_PARTITION)

    measured: dict[str, float] = {}
    watch = GraceWatch(read, save_s=1.0, measured=measured.get)
    low = JobInfo("7", "RUNNING", ("node-1",), (), 0, partition="low")
    assert await watch.job_seen(low) == []  # 1 s fits KillWait and GraceTime
    assert await watch.job_seen(low) == []
    measured["7"] = 45.0
    assert [f.setting for f in await watch.job_seen(low)] == [
        "slurm.conf KillWait / sbatch --signal",
        "slurm.conf PartitionName=low GraceTime",
    ]
    measured["7"] = 90.0
    assert await watch.job_seen(low) == []  # audited against a measurement already


def test_a_grace_time_of_non_ascii_digits_is_not_read() -> None:
    # "\u00b2" is a digit to str.isdigit() but not a number to float(): skipped, never a crash
    grace = grace_of("KillWait = 30 sec\n", "PartitionName=x GraceTime=\u00b2 PreemptMode=OFF\n")
    assert grace.partitions == {}
