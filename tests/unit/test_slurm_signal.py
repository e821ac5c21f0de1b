"""The client-less fallback's choice of scancel flag per partition, and its answers when the job is not
running or scancel fails -- against stand-in ``scontrol``/``scancel`` executables that record their
arguments (the real Slurm runs in tests/e2e/test_clientless_slurm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftd.coordinator.actions.slurm_signal import SlurmSignalFallback


def fakes(tmp_path: Path, *, state: str, partition: str, scancel_rc: int = 0) -> tuple[str, str, Path]:
    log = tmp_path / "calls"
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(
        "#!/bin/sh\n"
        f'echo "scontrol $*" >> {log}\n'
        f'echo "JobId=$4 JobName=x JobState={state} Partition={partition} Restarts=0"\n'
    )
    scancel = tmp_path / "scancel"
    scancel.write_text(f'#!/bin/sh\necho "scancel $*" >> {log}\necho nope >&2\nexit {scancel_rc}\n')
    for tool in (scontrol, scancel):
        tool.chmod(0o755)
    return str(scontrol), str(scancel), log


async def test_per_partition_mode_and_the_grace_period(tmp_path: Path) -> None:
    scontrol, scancel, log = fakes(tmp_path, state="RUNNING", partition="lightning")
    fallback = SlurmSignalFallback(
        scontrol=scontrol,
        scancel=scancel,
        partition_modes={"lightning": "full"},
        grace_s=0.3,
        poll_s=0.05,
    )
    detail = await fallback.save_and_stop("77", stop=True)
    assert detail["state"] == "escalated"
    assert detail["clientless"]["mode"] == "full" and detail["clientless"]["signal_ignored"] is True
    calls = log.read_text().splitlines()
    assert calls[0] == "scontrol show job -o 77"
    assert calls[1] == "scancel --signal=USR1 --full 77"
    assert fallback.mode_for("other") == "batch"


async def test_a_job_not_running_is_not_signalled_and_a_failing_scancel_escalates(tmp_path: Path) -> None:
    scontrol, scancel, log = fakes(tmp_path, state="PENDING", partition="p")
    fallback = SlurmSignalFallback(scontrol=scontrol, scancel=scancel)
    assert await fallback.save_and_stop("5", stop=True) == {
        "clientless": {"job_state": "PENDING", "signalled": False}
    }
    assert "scancel" not in log.read_text()
    (tmp_path / "done").mkdir()
    scontrol, scancel, _ = fakes(tmp_path / "done", state="COMPLETED", partition="p")
    finished = await SlurmSignalFallback(scontrol=scontrol, scancel=scancel).save_and_stop("5", stop=True)
    assert finished == {"clientless": {"job_state": "COMPLETED", "signalled": False, "finished": True}}
    assert "note" in await fallback.save_and_stop("5", stop=False)  # a save-only checkpoint: nothing
    (tmp_path / "x").mkdir()
    scontrol, scancel, _ = fakes(tmp_path / "x", state="RUNNING", partition="p", scancel_rc=1)
    detail = await SlurmSignalFallback(scontrol=scontrol, scancel=scancel).save_and_stop("5", stop=True)
    assert detail["state"] == "escalated" and "exited 1: nope" in detail["clientless"]["error"]


def test_modes_are_checked() -> None:
    with pytest.raises(ValueError, match="clientless mode"):
        SlurmSignalFallback(mode="all")
    with pytest.raises(ValueError, match="partition 'gpu'"):
        SlurmSignalFallback(partition_modes={"gpu": "both"})
