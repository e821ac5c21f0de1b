"""Issue #20, item 1: a stop meant for one run of a job never reaches the job's next run.

Real Slurm, the broker as shipped (deploy/mosquitto config and ACL), ``ftd agent`` and ``ftd
coordinator`` subprocesses (:mod:`tests.e2e.shipped_stack`), and the README's training loop verbatim
as a ``--requeue`` batch job (:mod:`tests.e2e.readme_loop`: no ``close()``, so nothing acknowledges
the stop). An Xid 13 in the node's kernel log: the coordinator has the job save, stops it and
requeues it in place (same job id, ``Restarts=1``, same node). The new process registers with the
agent while the old run's stop would still be pending there: it must not receive it, and must keep
training from the saved step (before the fix it left its loop at once and Slurm called the job
COMPLETED).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.daemons import REPO
from tests.e2e.shipped_stack import ShippedStack, make_shipped_stack, records, wait_until
from tests.realparts import SlurmCluster

pytestmark = [pytest.mark.real, pytest.mark.slow]

XID13 = (
    "[ 6110.203311] NVRM: Xid (PCI:0000:3b:00): 13, pid=31337, name=python, Graphics SM Warp Exception "
    "on (GPC 0, TPC 0, SM 0): Out Of Range Address"
)


@pytest.fixture
def stack(slurm: SlurmCluster, tmp_path: Path):  # type: ignore[no-untyped-def]
    with make_shipped_stack(slurm, tmp_path) as built:
        yield built


def test_readme_loop_restarted_in_place_does_not_receive_the_old_runs_stop(stack: ShippedStack) -> None:
    log, ckpt = stack.workdir / "readme.jsonl", stack.workdir / "ckpt"
    job = stack.sbatch_python(
        "readme",
        REPO / "tests" / "e2e" / "readme_loop.py",
        {"FTD_TEST_LOG": str(log), "FTD_TEST_CKPT": str(ckpt)},
    )
    try:
        stack.slurm.wait_job_state(job, "RUNNING", 60)
        wait_until(lambda: stack.agent_log_records("local_api_rank_registered"), 60, "the rank to register")
        wait_until(lambda: len(records(log, "training", run=0)) >= 3, 60, "the first run to train")

        stack.append_kernel_line(XID13)

        # The first run saves (at the agreed step) and leaves its loop on the stop.
        wait_until(lambda: records(log, "left_loop", run=0), 60, "the first run to leave its loop")
        saved = records(log, "saved", run=0)
        assert len(saved) == 1, saved
        # ftd requeues it in place: the same job id runs again on node-1.
        wait_until(lambda: records(log, "started", run=1), 90, "the job's second run to start")
        second = records(log, "started", run=1)[0]
        assert second["start"] == saved[0]["step"] + 1, (second, saved)

        # The second run registers (a second registration at the agent) and trains on: it never
        # receives the first run's stop (the bug: it left its loop at once, exit 0, COMPLETED).
        wait_until(
            lambda: len(stack.agent_log_records("local_api_rank_registered")) >= 2,
            60,
            "the second run to register",
        )
        wait_until(
            lambda: len(records(log, "training", run=1)) >= 10 or records(log, "left_loop", run=1),
            60,
            "the second run to train 200 steps (or to leave its loop)",
        )
        assert records(log, "left_loop", run=1) == [], "the second run received the first run's stop"
        info = stack.slurm.job(job)
        assert info.get("JobState") == "RUNNING" and info.get("Restarts") == "1", info
        assert info.get("ExcNodeList", "") in ("", "(null)"), info
    finally:
        stack.slurm.run("scancel", job, check=False)
