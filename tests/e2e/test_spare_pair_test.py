"""A hot spare is pair-tested against the job's nodes before it takes a slot (issue #35), on real parts.

Real Slurm (4 slurmd), Mosquitto, an agent per node with its pair-test server on its own loopback
address (127.0.1.N, the same port on every node, as on a real fleet), the coordinator with
``coordinator.fabric.test_spares``, and a 3-rank gloo DDP job under ``ftd run --spares 1``:

- while the job trains, its nodes refuse a pair test (a real client process is told ``training``);
- an Xid 79 on node-2: the job stops, and only then is the spare node-4 tested against its new
  neighbours node-3 and node-1 (their supervisors say ``stopped``, the spare's ``idle``); both pass
  against the operator's profile, node-4 takes node-2's slot and the job trains again;
- the same with a profile no loopback pair can reach: the spare's tests are slow, so it is unfit and
  the job goes to the scheduler excluding node-2 -- the untested or slow spare never joins.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftd.bench.recovery import FAULT_NODE, XID79, recovered, steady
from ftd.bench.recovery_stack import JobSpec, RecoveryStack, recovery_stack, wait_for
from ftd.bench.slurm_cluster import free_port
from tests.e2e.multinode_slurm import MultiNodeSlurm
from tests.realparts import Mosquitto

pytestmark = [pytest.mark.real, pytest.mark.slow]

pytest.importorskip("torch")

SWAPPED = ["node-1", "node-4", "node-3"]


def address(node: str) -> str:
    return f"127.0.1.{int(node.rsplit('-', 1)[1])}"


def catalog(tmp: Path, expected_gbps: float) -> Path:
    """An operator's hardware catalog with one profile for this host's loopback pairs. The fleet
    baseline barely counts (0.01): loopback moves 5-60 Gbit/s here depending on load, and this test
    is about when and whom the spare is tested against, not about this host's spread."""
    path = tmp / "catalog.toml"
    path.write_text(
        f"""[profiles.loopback-test]
description = "agents on one host, pair tests over loopback"
gpu_names = ["no such GPU"]

[pair.loopback-test]
expected_gbps = {expected_gbps}
fraction = 0.8
baseline_fraction = 0.01
max_rtt_ms = 1000.0
rtt_baseline_factor = 10000.0
"""
    )
    return path


@pytest.fixture
def built(
    cluster: MultiNodeSlurm, mosquitto: Mosquitto, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[RecoveryStack, int, Path]]:
    cluster.reset()
    key = tmp_path / "pair.key"
    key.write_text("e2e-pair-test-key\n")
    key.chmod(0o600)
    port = free_port()
    expected = float(request.param)

    def agent_keys(node: str) -> str:
        return f"""addresses = ["{address(node)}"]

[agent.pair_tests]
host = "{address(node)}"
port = {port}
key_file = "{key}"
max_bytes = 4194304
timeout_s = 5.0
"""

    coordinator_tables = f"""
[coordinator.fabric]
test_spares = true
port = {port}
deadline_s = 20.0
auto_bisect = false

[hardware]
profile = "loopback-test"
catalog = "{catalog(tmp_path, expected)}"
"""
    with recovery_stack(
        cluster,
        mosquitto.port,
        tmp_path / "stack",
        coordinator_keys={"save_deadline_s": 30.0, "stop_deadline_s": 30.0, "restart_deadline_s": 60.0},
        coordinator_extra=coordinator_tables,
        agent_keys=agent_keys,
    ) as stack:
        try:
            yield stack, port, key
        finally:
            print(stack.logs())


def pair_test_from(node: str, peer: str, port: int, key: Path) -> dict[str, Any]:
    """A real pair-test client process, as ``node``, against ``peer``'s agent."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ftd.agent.pair_tests",
            "run",
            "--node",
            node,
            "--peer-node",
            peer,
            "--peer",
            f"{address(peer)}:{port}",
            "--key-file",
            str(key),
            "--max-bytes",
            str(1 << 20),
            "--timeout",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("built", [1.0], indirect=True)
def test_the_spare_is_tested_against_its_new_neighbours_only_once_the_job_stopped(
    built: tuple[RecoveryStack, int, Path],
) -> None:
    stack, port, key = built
    job = stack.submit(JobSpec(name="spare-test", nodes=3, spares=1))
    steady(stack, job, 3, 120)
    # Training nodes take part in no test; the idle spare serves one.
    assert "training (job" in pair_test_from("node-4", "node-1", port, key)["error"]
    idle = pair_test_from("node-1", "node-4", port, key)
    assert idle["error"] == "" and idle["a_to_b_gbps"] > 0, "the idle spare (no rank runs there) serves one"
    fault_at = stack.kernel(FAULT_NODE, XID79)
    wait_for(lambda: recovered(stack, job, fault_at, 3), 120, "the job to train again")
    wait_for(lambda: stack.restart_action(job)["state"] == "succeeded", 60, "checkpoint_restart to succeed")
    detail = stack.restart_action(job)["detail"]
    assert detail["path"] == "spare" and detail["slots"] == SWAPPED, detail
    tested = detail["spare_tests"]["node-4"]
    print("spare tests:", json.dumps(tested))
    assert tested["fit"] is True, tested
    peers = [r["result"]["b"] for r in tested["results"]]
    assert peers == ["node-3", "node-1"], tested  # the slots after and before the spare's
    for outcome in tested["results"]:
        result = outcome["result"]
        assert outcome["status"] == "pass" and result["error"] == "", outcome
        assert result["a"] == "node-4" and result["a_to_b_gbps"] > 0.8 and result["b_to_a_gbps"] > 0.8
    # The test's pair_test events reached the coordinator's pair book.
    events = [e for e in stack.events("pair_test") if e["node"] == "node-4"]
    assert {e["data"]["b"] for e in events if not e["data"]["error"]} == {"node-1", "node-3"}, events


@pytest.mark.parametrize("built", [100000.0], indirect=True)
def test_a_spare_slow_against_the_jobs_nodes_never_joins_and_the_job_is_requeued(
    built: tuple[RecoveryStack, int, Path],
) -> None:
    stack, _, _ = built
    job = stack.submit(JobSpec(name="slow-spare", nodes=3, spares=1))
    steady(stack, job, 3, 120)
    stack.kernel(FAULT_NODE, XID79)
    wait_for(
        lambda: stack.restart_action(job)["state"] not in ("pending", "running"),
        120,
        "checkpoint_restart to end",
    )
    action = stack.restart_action(job)
    detail = action["detail"]
    tested = detail["spare_tests"]["node-4"]
    assert tested["fit"] is False and "pair test with node-3 slow" in tested["why"], tested
    assert detail["unfit"]["node-4"] == tested["why"], detail
    assert detail.get("requeued") is not None and FAULT_NODE in detail["requeued"]["exclude"], detail
    assert action["state"] == "escalated", action
    # no generation 1 ever started: node-4 never ran a rank of the job
    assert not [r for r in stack.records(job, "step") if r["generation"] >= 1]
