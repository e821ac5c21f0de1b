"""Find the culprit of a hang, then act (issue #33), end to end on real parts.

Real Slurm with four ``slurmd`` nodes on this host, real Mosquitto, an ``ftd agent`` per node (a 3 s
heartbeat timeout) and ``ftd coordinator`` (:mod:`ftd.bench.recovery_stack`), a real DDP job (torch
gloo on CPU, :mod:`ftd.bench.recovery_trainer`) under ``ftd run --nodes 3 --spares 1``: node-1..3
train, node-4 is the hot spare.

- one rank SIGSTOPped on a training node drawn at random: its peers block in DDP's all-reduce, every
  rank stops beating; one ``diagnose_hang`` asks every node at once, and within 30 s of the stop the
  verdict names that node (confident: its rank is ``stopped`` while the others wait inside the
  collective); the job is restarted without a save, only that node is out, the spare takes its slot,
  and the new generation trains;
- every rank blocked opening a FIFO nobody writes (a file system that stopped answering): the verdict
  is ``job_wide``, nothing is excluded, the job is restarted in place and trains again.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftd.bench.recovery import recovered, steady
from ftd.bench.recovery_stack import JobSpec, RecoveryStack, recovery_stack, wait_for
from tests.e2e.multinode_slurm import MultiNodeSlurm
from tests.realparts import Mosquitto

pytestmark = [pytest.mark.real, pytest.mark.slow]

pytest.importorskip("torch")

TRAINING = ["node-1", "node-2", "node-3"]
VERDICT_WITHIN_S = 30.0


@pytest.fixture
def stack(cluster: MultiNodeSlurm, mosquitto: Mosquitto, tmp_path: Path) -> Iterator[RecoveryStack]:
    cluster.reset()
    with recovery_stack(
        cluster,
        mosquitto.port,
        tmp_path / "stack",
        coordinator_keys={
            "save_deadline_s": 10.0,
            "stop_deadline_s": 5.0,
            "restart_deadline_s": 60.0,
            "hang_evidence_deadline_s": 15.0,
        },
        agent_extra="[agent.heartbeat]\ntimeout_s = 3.0\ncheck_interval_s = 0.25\n",
    ) as built:
        try:
            yield built
        finally:
            print(built.logs())


def finished(stack: RecoveryStack, kind: str, job: str) -> dict[str, Any] | None:
    """The action of ``kind`` on ``job`` that ran (duplicates the gate suppressed left out), once over."""
    actions = ran(stack, kind, job)
    if not actions or actions[0]["state"] not in ("succeeded", "escalated", "failed"):
        return None
    return actions[0]


def ran(stack: RecoveryStack, kind: str, job: str) -> list[dict[str, Any]]:
    return [
        a for a in stack.actions() if a["kind"] == kind and a["target"] == job and a["state"] != "suppressed"
    ]


def test_a_stopped_rank_names_its_node_and_the_spare_takes_its_slot(stack: RecoveryStack) -> None:
    job = stack.submit(JobSpec(name="hang-culprit", nodes=3, spares=1))
    steady(stack, job, 3, 180)
    bad = random.choice(TRAINING)
    print(f"SIGSTOP the rank on {bad}")
    [pid] = {int(r["pid"]) for r in stack.records(job, "process_start") if r["node"] == bad}
    stopped_at = time.time()
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: finished(stack, "diagnose_hang", job), 90, "the diagnosis")
        diagnosis = finished(stack, "diagnose_hang", job)
        assert diagnosis is not None
        verdict = diagnosis["detail"]["verdict"]
        print(verdict["why"], "\n", diagnosis["detail"]["tree"])
        assert verdict["kind"] == "culprit" and verdict["confident"], verdict
        assert verdict["culprit_nodes"] == [bad], verdict
        assert (
            sorted(diagnosis["detail"]["node_evidence"]) == TRAINING and not diagnosis["detail"]["unanswered"]
        )
        verdict_s = diagnosis["updated"] - stopped_at
        assert verdict_s < VERDICT_WITHIN_S, verdict_s
        assert len(ran(stack, "diagnose_hang", job)) == 1  # every rank's silence: one diagnosis

        wait_for(lambda: recovered(stack, job, stopped_at, 3), 180, "the job to train again")
        [restart] = ran(stack, "checkpoint_restart", job)
        detail = restart["detail"]
        assert restart["request"]["params"]["exclude"] == [bad] and detail["save_skipped"], restart
        assert detail["path"] == "spare" and detail["out"] == [bad], detail
        slots = list(TRAINING)
        slots[TRAINING.index(bad)] = "node-4"
        assert detail["slots"] == slots, detail
        [drain] = ran(stack, "drain_node", bad)
        assert drain["request"]["params"]["suspect"] is True
        assert all(not ran(stack, "drain_node", n) for n in TRAINING if n != bad)
        print(f"verdict {verdict_s:.1f} s after the SIGSTOP on {bad}; restarted on {slots}")
    finally:
        with contextlib.suppress(ProcessLookupError):  # its supervisor killed it (the new generation)
            os.kill(pid, signal.SIGCONT)


def test_every_rank_blocked_on_a_fifo_is_job_wide_and_nothing_is_excluded(
    stack: RecoveryStack, tmp_path: Path
) -> None:
    fifo = tmp_path / "nobody-writes"
    os.mkfifo(fifo)
    env = {"FTD_RECOVERY_BLOCK_FIFO": str(fifo), "FTD_RECOVERY_BLOCK_AT": "25"}
    job = stack.submit(JobSpec(name="hang-fifo", nodes=3, spares=1, env=env))
    wait_for(lambda: len(stack.records(job, "blocking")) == 3, 240, "every rank to block on the FIFO")
    blocked_at = max(float(r["t"]) for r in stack.records(job, "blocking"))
    wait_for(lambda: finished(stack, "diagnose_hang", job), 90, "the diagnosis")
    diagnosis = finished(stack, "diagnose_hang", job)
    assert diagnosis is not None
    verdict = diagnosis["detail"]["verdict"]
    print(verdict["why"], "\n", diagnosis["detail"]["tree"])
    assert verdict["kind"] == "job_wide" and not verdict["culprit_nodes"], verdict
    assert diagnosis["updated"] - blocked_at < VERDICT_WITHIN_S + 10  # + the heartbeat timeout
    wait_for(lambda: recovered(stack, job, blocked_at, 3), 180, "the job to train again")
    [restart] = ran(stack, "checkpoint_restart", job)
    assert restart["request"]["params"]["exclude"] == [] and restart["detail"]["out"] == [], restart
    assert restart["detail"]["path"] == "in_place" and restart["detail"]["slots"] == TRAINING, restart
    assert not [a for a in stack.actions() if a["kind"] == "drain_node"]
