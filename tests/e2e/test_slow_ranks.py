"""Slow ranks end to end (issue #33 item 3): found from step timing, attributed to the right node,
acted on with the cost model; a job-wide slowdown is not a node's fault.

Real parts: Mosquitto, three ``ftd agent`` processes (node-1..3, one socket each) and ``ftd
coordinator`` as subprocesses, and a real DDP job of three ranks (gloo, CPU; :mod:`tests.e2e.slow_rank`),
one rank per node, each registered with its node's agent through the trainer client and timed by the
torch helper's DDP hook. A rank is slowed by a sleep per step (the slow switch file) doubling its
work. The coordinator runs with ``scheduler = "none"`` (nothing to requeue: the test is about what is
found and decided).

- one rank at half speed: ``rank_slow`` names its node (scope ``node``, its rank) within 60 s of the
  slowdown, after a clean minute of training that raised nothing; the cost model decides a
  ``checkpoint_restart`` excluding that node (expected loss over an hour >> the 10 s swap cost);
- every rank slowed together: ``rank_slow`` says the job (``not_node``), and nothing excludes or
  drains a node.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.daemons import REPO, Daemon
from tests.e2e.shipped_stack import _log_records
from tests.e2e.stack import wait_until
from tests.realparts import Mosquitto, free_port

# Room for the start, the baselines, the clean stretch and the trials (FTD_SLOW_* make them longer).
_BUDGET_S = (
    360 + float(os.environ.get("FTD_SLOW_CLEAN_S", "60")) + 150 * int(os.environ.get("FTD_SLOW_TRIALS", "2"))
)
pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.timeout(_BUDGET_S)]

NODES = ("node-1", "node-2", "node-3")
JOB = "slow-1"
WORK_S = 0.05  # a rank's own work per step (a sleep), doubled by the slow switch
CLEAN_S = 60.0  # clean training after the baselines are set, before the slowdown: no alarm
DETECT_S = 60.0  # the target: found within a minute of the slowdown


@dataclass
class Cluster:
    agents: list[Daemon]
    coordinator: Daemon
    sockets: list[str]
    ledger: Path
    workdir: Path
    ranks: list[subprocess.Popen[str]] = field(default_factory=list)

    def alive(self) -> None:
        """Fail at once when a rank died (its error is in the test's output)."""
        dead = [(i, p.returncode) for i, p in enumerate(self.ranks) if p.poll() is not None]
        assert not dead, f"ranks exited: {dead}"

    def rank_slow(self) -> list[dict[str, Any]]:
        with sqlite3.connect(self.ledger) as db:
            rows = db.execute("SELECT body FROM events WHERE kind = 'rank_slow' ORDER BY ts").fetchall()
        return [json.loads(body) for (body,) in rows]

    def decisions(self) -> list[dict[str, Any]]:
        return _log_records(self.coordinator.log(), "action_decided")


@pytest.fixture
def cluster(mosquitto: Mosquitto, tmp_path: Path) -> Iterator[Cluster]:
    run_dir = Path(tempfile.mkdtemp(prefix="ftd-slow-", dir="/tmp"))  # unix socket paths must be short
    ledger = tmp_path / "ledger.sqlite"
    bus = f'[bus]\nhost = "127.0.0.1"\nport = {mosquitto.port}\nkeepalive_s = 2\nreconnect_max_s = 1.0\n'
    logs = '[log]\nlevel = "info"\njson = true\n'
    agents, sockets = [], []
    for node in NODES:
        kmsg = tmp_path / f"kmsg-{node}"
        kmsg.touch()
        sockets.append(str(run_dir / f"{node}.sock"))
        agents.append(
            Daemon(
                f"agent-{node}",
                f"""{bus}
[agent]
node = "{node}"
kmsg_path = "{kmsg}"
kmsg_from_start = true
state_dir = "{tmp_path / f"state-{node}"}"
socket_path = "{sockets[-1]}"

[agent.nvml]
enabled = false

{logs}""",
                tmp_path,
            )
        )
    coordinator = Daemon(
        "coordinator",
        f"""{bus}
[coordinator]
ledger_path = "{ledger}"
scheduler = "none"

[coordinator.api]
enabled = false

[coordinator.slow_ranks]
warmup_samples = 20

{logs}""",
        tmp_path,
    )
    coordinator.start()
    for agent in agents:
        agent.start()
    try:
        for agent in agents:
            agent.wait_log("agent_started", timeout=60)
        coordinator.wait_log("node_status", timeout=60)
        yield Cluster(agents, coordinator, sockets, ledger, tmp_path)
    finally:
        for daemon in (*agents, coordinator):
            daemon.stop()
        for daemon in (*agents, coordinator):
            print(f"----- {daemon.name} log (tail)\n{daemon.log()[-3000:]}")


@contextlib.contextmanager
def ddp_job(cluster: Cluster) -> Iterator[list[Path]]:
    """Three ranks, rank i on node i+1; yields each rank's slow switch (a path to create)."""
    out = cluster.workdir / "job"
    out.mkdir()
    port = free_port()
    switches = [out / f"slow-r{r}" for r in range(len(NODES))]
    procs = []
    for r, socket in enumerate(cluster.sockets):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(r),
            "WORLD_SIZE": str(len(NODES)),
            "FTD_SOCKET": socket,
            "FTD_TEST_JOB": JOB,
            "FTD_TEST_WORK_S": str(WORK_S),
            "FTD_TEST_SLOW_S": str(WORK_S),
            "FTD_TEST_SLOW_FILE": str(switches[r]),
            "OUT_DIR": str(out),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(REPO / "tests" / "e2e" / "slow_rank.py")],
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    cluster.ranks = procs
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "registered"
        yield switches
    finally:
        (out / "stop").touch()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def wait_warm(cluster: Cluster) -> None:
    """Until the coordinator has every rank's baseline (its slow_ranks_warm log line)."""

    def warm() -> bool:
        cluster.alive()
        return any(r.get("job") == JOB for r in _log_records(cluster.coordinator.log(), "slow_ranks_warm"))

    wait_until(
        warm,
        240,
        "the job's step timing baselines",
    )
    [warm] = [r for r in _log_records(cluster.coordinator.log(), "slow_ranks_warm") if r.get("job") == JOB]
    assert warm["ranks"] == len(NODES) and warm["measured"] is True, warm


def test_one_rank_at_half_speed_names_its_node_and_the_cost_model_swaps_it(cluster: Cluster) -> None:
    """A clean stretch (``FTD_SLOW_CLEAN_S``, 60 s) raises nothing; then ``FTD_SLOW_TRIALS`` (2)
    trials each slow one rank (in turn) to half speed until it is found, then let it recover. Every
    trial must find it within 60 s and name its node, allowing one miss in twenty (the target)."""
    clean_s = float(os.environ.get("FTD_SLOW_CLEAN_S", CLEAN_S))
    trials = int(os.environ.get("FTD_SLOW_TRIALS", "2"))
    with ddp_job(cluster) as switches:
        wait_warm(cluster)
        clean_until = time.monotonic() + clean_s
        while time.monotonic() < clean_until:  # a clean stretch: nothing may be found
            assert cluster.rank_slow() == [], cluster.rank_slow()
            cluster.alive()
            time.sleep(1)
        results: list[tuple[int, str | None, float]] = []  # (slowed rank, node named, seconds)
        for trial in range(trials):
            slowed = (trial + 1) % len(NODES)
            before = len(cluster.rank_slow())
            over = len(_log_records(cluster.coordinator.log(), "rank_slow_over"))
            switches[slowed].touch()
            t_slow = time.time()

            def found(before: int = before) -> bool:
                cluster.alive()
                return len(cluster.rank_slow()) > before

            try:
                wait_until(found, DETECT_S, f"rank_slow after rank {slowed} was slowed")
            except AssertionError:
                results.append((slowed, None, DETECT_S))
            else:
                event = cluster.rank_slow()[before]
                results.append((slowed, event["node"], time.time() - t_slow))
                print(
                    f"\ntrial {trial}: rank {slowed} slowed, found after {results[-1][2]:.1f} s: "
                    f"{event['node']} {event['data']}"
                )
                if trial == 0:
                    data = event["data"]
                    assert data["scope"] == "node" and data["ranks"] == [slowed], event
                    assert (
                        event["source"] == "coordinator" and data["job"] == JOB and data["measured"] is True
                    )
                    assert 1.3 < data["slowdown"] < 3.5, data
                    assert data["expected_loss_s"] > data["swap_cost_s"], data
                    wait_until(
                        lambda: any(d.get("kind") == "checkpoint_restart" for d in cluster.decisions()),
                        30,
                        "the cost model's swap decision",
                    )
                    swap = next(d for d in cluster.decisions() if d.get("kind") == "checkpoint_restart")
                    assert swap.get("target") == JOB and swap.get("rule") == "straggler", swap
                    assert not [d for d in cluster.decisions() if d.get("kind") == "drain_node"]
            switches[slowed].unlink()
            if trial + 1 < trials:  # the episode ends before the next trial starts
                wait_until(
                    lambda over=over: len(_log_records(cluster.coordinator.log(), "rank_slow_over")) > over,
                    120,
                    "the slow episode to end once the rank is back",
                )
        right = [r for r in results if r[1] == NODES[r[0]]]
        times = sorted(r[2] for r in right)
        print(f"\n{len(right)}/{trials} trials named the right node; seconds: {[round(t, 1) for t in times]}")
        assert len(right) >= trials - trials // 20, results


def test_every_rank_slowed_together_is_the_job_and_no_node_is_excluded(cluster: Cluster) -> None:
    with ddp_job(cluster) as switches:
        wait_warm(cluster)
        for switch in switches:
            switch.touch()
        t_slow = time.time()
        wait_until(lambda: bool(cluster.rank_slow()), DETECT_S, "rank_slow after the whole job slowed")
        print(f"\nrank_slow after {time.time() - t_slow:.1f} s: {cluster.rank_slow()[0]['data']}")
        time.sleep(10)  # what else it might decide once found (nothing: asserted below)
        found = cluster.rank_slow()
        assert [(e["data"]["scope"], e["data"].get("not_node")) for e in found] == [("job", True)], found
        kinds = {d.get("kind") for d in cluster.decisions()}
        assert kinds <= {"notify"}, cluster.decisions()
