"""A real preemption reaches a real ``ftd coordinator`` as one interruption (issue #37), end to end:
Slurm 22.05 with preemption (:func:`tests.realparts.preemption_conf`, GraceTime 20 s), real Mosquitto,
the coordinator process polling every second. The job's presence is published as its agent would (the
coordinator watches the jobs it sees ranks of); a job of the higher-priority partition then preempts
it, and the coordinator logs ``interruption_announced`` with source ``slurm_preempt`` and the deadline
Slurm itself shows (the rewritten ``EndTime``) within its poll interval, once."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftd.bus import topics
from ftd.coordinator.actions.slurm import parse_timestamp
from ftd.events import JobPresence, RankInfo, encode
from tests.e2e.daemons import Daemon
from tests.e2e.test_reconcile_slurm import coordinator_config
from tests.realparts import Mosquitto, SlurmCluster, free_port, preemption_conf

pytestmark = [pytest.mark.real, pytest.mark.slow]

GRACE_S = 20


@pytest.fixture
def preempt_cluster(tmp_path: Path) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(tmp_path / "slurm", nodes=1, extra_conf=preemption_conf(GRACE_S)).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _announced(coordinator: Daemon) -> list[dict[str, object]]:
    lines = (json.loads(line) for line in coordinator.log().splitlines() if line.startswith("{"))
    return [rec for rec in lines if rec.get("event") == "interruption_announced"]


def test_a_real_preemption_is_announced_by_the_coordinator_with_slurms_deadline(
    preempt_cluster: SlurmCluster, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    config = coordinator_config(mosquitto, preempt_cluster, tmp_path / "ledger.sqlite", free_port())
    config = config.replace(
        "[coordinator.policy]\n",
        "[coordinator.slurm.interruptions]\ninterval_s = 1.0\nkill_wait_s = 2.0\n\n[coordinator.policy]\n",
    )
    coordinator = Daemon("coordinator", config, tmp_path).start()
    try:
        coordinator.wait_log("bus_connected")
        job = preempt_cluster.sbatch(None, "-p", "low", "--requeue", "--time=60", wrap="sleep 600")
        preempt_cluster.wait_job_state(job, "RUNNING")
        presence = JobPresence(
            job=job, node="node-1", ranks=[RankInfo(rank=0, pid=1, step=1, last_beat=1.0)], ts=time.time()
        )
        subprocess.run(
            [
                "mosquitto_pub",
                "-p",
                str(mosquitto.port),
                "-r",
                "-q",
                "1",
                "-t",
                topics.node_job("node-1", job),
                "-s",
            ],
            input=encode(presence),
            check=True,
            timeout=10,
        )
        time.sleep(3)  # a few polls of a job an hour from its limit: nothing to announce
        assert _announced(coordinator) == []
        preempt_cluster.sbatch(None, "-p", "high", wrap="sleep 600")
        coordinator.wait_log('"interruption_announced"', timeout=15)  # within the 1 s poll, at load
        record = preempt_cluster.job(job)
        time.sleep(2.5)  # more polls: the same preemption, not a second interruption
        [line] = _announced(coordinator)
    finally:
        coordinator.stop()
    assert line["source"] == "slurm_preempt" and line["job"] == job
    assert record["JobState"] == "RUNNING"
    preempted, end = parse_timestamp(record["PreemptTime"]), parse_timestamp(record["EndTime"])
    assert preempted is not None and end == preempted + GRACE_S
    assert line["deadline"] == end
