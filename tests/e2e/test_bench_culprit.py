"""``ftd bench culprit`` end to end (issue #33 item 5), one run of each case here through the bench's own
code (:func:`ftd.bench.culprit.measure_case`): real Slurm with four ``slurmd`` nodes on this host, real
Mosquitto, an ``ftd agent`` per node, ``ftd coordinator``, and a real DDP job (gloo, CPU) under ``srun
... ftd run --nodes 3 --spares 1``.

- ``stopped``: a random rank SIGSTOPped; the verdict names its node (confident culprit), that node and
  only it is excluded (one swap onto the spare), and the job trains again from a checkpoint;
- ``clean``: nothing injected; no verdict, no diagnosis, no exclusion, no swap, no restart.
- ``slowed``: a random rank sleeps as long again as its step took; ``rank_slow`` names its node;
- ``throttled``: a random rank of a CPU-bound job is moved into a cgroup with a CPU quota of half a
  core, or half what it used when less (v1 or v2, whichever this host has); ``rank_slow`` names its
  node and the cgroup is gone after.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftd.bench.cpu_throttle import find_cpu_controller
from ftd.bench.culprit import AGENT_EXTRA, RANKS, TIME_LIMIT_MIN, measure_case, summarize
from ftd.bench.recovery_stack import RecoveryStack, recovery_stack
from tests.e2e.multinode_slurm import MultiNodeSlurm
from tests.realparts import Mosquitto

pytestmark = [pytest.mark.real, pytest.mark.slow]
pytest.importorskip("torch")


SLURM_NODES = RANKS + 1  # the cluster fixture (tests/e2e/conftest.py): a spare beside the job


@pytest.fixture
def stack(cluster: MultiNodeSlurm, mosquitto: Mosquitto, tmp_path: Path) -> Iterator[RecoveryStack]:
    cluster.reset()
    with recovery_stack(cluster, mosquitto.port, tmp_path / "stack", agent_extra=AGENT_EXTRA) as built:
        try:
            yield built
        finally:
            print(built.logs())


# make bench-tests; tests/e2e/test_hang_culprit.py names a stopped rank on the same stack in make test
@pytest.mark.bench
def test_a_stopped_rank_is_named_and_only_its_node_excluded(stack: RecoveryStack, tmp_path: Path) -> None:
    victim = random.Random().randrange(RANKS)
    (tmp_path / "faults").mkdir()
    got = measure_case(stack, "stopped", victim, tmp_path / "faults")
    print(got)
    assert "error" not in got, got
    assert got["symptom"] is not None and got["detect_s"] is not None
    verdict = got["verdict"]
    assert verdict is not None, got
    assert verdict["verdict"] == "culprit" and verdict["confident"] is True
    assert verdict["culprit_nodes"] == [got["victim_node"]] and verdict["culprit_ranks"] == [victim]
    assert got["excluded_nodes"] == [got["victim_node"]] and got["exclusions"] == 1
    assert got["swaps"] == 1
    assert isinstance(got["resumed_from"], int) and isinstance(got["steps_lost"], int)
    assert got["right"] is True
    assert summarize([got])["wrong"] == 0


def test_a_clean_run_is_left_alone(stack: RecoveryStack, tmp_path: Path) -> None:
    (tmp_path / "faults").mkdir()
    got = measure_case(stack, "clean", 0, tmp_path / "faults")
    print(got)
    assert "error" not in got, got
    assert got["verdict"] is None and got["symptom"] is None and got["diagnoses"] == 0
    assert got["exclusions"] == 0 and got["swaps"] == 0 and got["restarts"] == 0
    assert got["right"] is True


@pytest.mark.bench  # minutes: make bench-tests, not make test
def test_a_slowed_rank_is_found_and_weighed_against_the_jobs_real_time_limit(
    stack: RecoveryStack, tmp_path: Path
) -> None:
    victim = random.Random().randrange(RANKS)
    (tmp_path / "faults").mkdir()
    got = measure_case(stack, "slowed", victim, tmp_path / "faults")
    print(got)
    assert "error" not in got, got
    slow = got["rank_slow"]
    assert slow["node"] == got["victim_node"] and got["right"] is True, got
    # the cost model weighed the time Slurm says the job has left (sbatch --time), not the assumption
    assert slow["remaining_from"] == "scheduler", slow
    assert 0 < slow["remaining_s"] <= TIME_LIMIT_MIN * 60, slow


@pytest.mark.bench  # minutes: make bench-tests, not make test
def test_a_rank_throttled_by_its_cgroup_cpu_quota_is_found(stack: RecoveryStack, tmp_path: Path) -> None:
    victim = random.Random().randrange(RANKS)
    (tmp_path / "faults").mkdir()
    got = measure_case(stack, "throttled", victim, tmp_path / "faults")
    print(got)
    assert "error" not in got, got
    throttle = got["throttle"]
    assert 0 < throttle["cores"] <= 0.5 and throttle["throttled_s"] > 0, got  # the quota held it back
    slow = got["rank_slow"]
    assert slow["node"] == got["victim_node"] and got["right"] is True, got
    leftover = [p.name for p in find_cpu_controller()[1].glob("ftd-bench-throttle-*")]
    assert leftover == [], leftover  # the cgroup was removed after the case
