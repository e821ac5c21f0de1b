"""The spine, end to end, with real parts only.

Real Mosquitto and a real Slurm (munged + slurmctld + slurmd) started by the test; ``ftd agent`` and
``ftd coordinator`` as subprocesses with config files; a ``--requeue`` Slurm batch job whose script
runs a training loop with the ftd client. A real-format Xid line appended to the node's kernel-log
source must end with the trainer saving, acking and stopping, the node drained in Slurm with ftd's
reason, and the job requeued with the node excluded.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from tests.e2e.stack import XID79, Stack, make_stack, stack, trainer_records, wait_until

__all__ = ["XID79", "Stack", "make_stack", "stack", "trainer_records", "wait_until"]  # re-exported

pytestmark = [pytest.mark.real, pytest.mark.slow]

XID43 = "[ 5021.437112] NVRM: Xid (PCI:0000:3b:00): 43, pid=31337, name=python, Ch 00000008"


def test_xid79_saves_stops_drains_and_requeues_without_the_node(stack: Stack) -> None:
    job, log = stack.submit_trainer()
    stack.slurm.wait_job_state(job, "RUNNING", 30)
    stack.wait_registered(job)

    stack.append_kernel_line(XID79)

    wait_until(lambda: any(r["what"] == "stopped" for r in trainer_records(log)), 30, "the trainer to stop")
    records = trainer_records(log)
    saved = [r for r in records if r["what"] == "saved"]
    stopped = [r for r in records if r["what"] == "stopped"]
    assert len(saved) == 1 and Path(str(saved[0]["path"])).read_text() == str(saved[0]["step"])
    assert stopped[0]["step"] >= saved[0]["step"]  # type: ignore[operator]
    assert [r["what"] for r in records].index("saved") < [r["what"] for r in records].index("stopped")

    # The node is drained with ftd's reason, visible to operators in `sinfo -R`.
    wait_until(lambda: "DRAIN" in stack.slurm.node("node-1").get("State", ""), 20, "node-1 drained")
    reasons = stack.slurm.run("sinfo", "-R", "-h", "-o", "%N|%E").stdout
    assert "node-1|ftd: xid 79 gpu 0000:3b:00.0" in reasons

    # The job is requeued, excluded from the bad node, and therefore pending (node-1 is the only
    # node with a slurmd, and it is drained anyway).
    def requeued() -> bool:
        info = stack.slurm.job(job)
        return info.get("JobState") == "PENDING" and int(info.get("Restarts", "0")) >= 1

    wait_until(requeued, 30, "the job to be requeued")

    # The ledger shows the decision trail: the event once, both actions succeeded.
    assert [e["data"]["code"] for e in stack.ledger_events("xid")] == [79]  # type: ignore[index]

    def action_states() -> dict[str, str]:
        with sqlite3.connect(stack.ledger) as db:
            return dict(db.execute("SELECT kind, state FROM actions"))

    # The ledger is written right after the scheduler call returns: wait for it, do not race it.
    expected = {"drain_node": "succeeded", "checkpoint_restart": "succeeded"}
    wait_until(lambda: action_states() == expected, 10, f"ledger states {expected}")
    # Only now: the requeue holds the job (PENDING already), then sets the exclusion, then releases.
    info = stack.slurm.job(job)
    assert "node-1" in info.get("ExcNodeList", "")


def test_non_fatal_xid43_is_recorded_but_drains_nothing(stack: Stack) -> None:
    job, log = stack.submit_trainer()
    stack.slurm.wait_job_state(job, "RUNNING", 30)
    stack.wait_registered(job)

    stack.append_kernel_line(XID43)

    # Positive control: the event made it all the way into the coordinator's ledger...
    wait_until(lambda: bool(stack.ledger_events("xid")), 15, "the Xid 43 event in the ledger")
    assert stack.ledger_events("xid")[0]["data"]["code"] == 43  # type: ignore[index]
    time.sleep(1.0)  # ...and nothing followed from it.
    assert "DRAIN" not in stack.slurm.node("node-1").get("State", "")
    assert stack.slurm.job(job).get("JobState") == "RUNNING"
    assert not any(r["what"] in ("saved", "stopped") for r in trainer_records(log))
    with sqlite3.connect(stack.ledger) as db:
        assert db.execute("SELECT COUNT(*) FROM actions").fetchone()[0] == 0
