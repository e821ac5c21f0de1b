"""Issue #20, item 3: the operators.md drill (``ftd inject``) rehearses the real path.

Real Slurm, the broker as shipped (deploy/mosquitto config, ACL, ``use_username_as_clientid``),
``ftd agent`` and ``ftd coordinator`` subprocesses (:mod:`tests.e2e.shipped_stack`) and the README's
training loop as a ``--requeue`` batch job. The drill of docs/operators.md §3 is run as written:
``ftd inject --config <the node's agent config> xid --data '{"code": 13, ...}'``.

Before the fix ``ftd inject`` logged in to the broker as the node: the shipped broker took the
agent's session over, the agent's Last Will said ``offline``, the coordinator acted on
``node_offline`` (node_death: stop, requeue, node excluded) and the save was lost. Now the event goes
through the agent's own socket (the ``inject`` op) and out through its spool: the agent never
leaves, the job saves, acks, is restarted in place and trains again from the saved step.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.daemons import REPO
from tests.e2e.shipped_stack import ShippedStack, make_shipped_stack, records, wait_until
from tests.realparts import SlurmCluster

pytestmark = [pytest.mark.real, pytest.mark.slow]


@pytest.fixture
def stack(slurm: SlurmCluster, tmp_path: Path):  # type: ignore[no-untyped-def]
    with make_shipped_stack(slurm, tmp_path) as built:
        yield built


def decisions(stack: ShippedStack) -> list[dict[str, Any]]:
    return stack.coordinator_records("action_decided")


def inject(stack: ShippedStack, *args: str) -> subprocess.CompletedProcess[str]:
    config = stack.workdir / "agent-node-1.toml"
    return subprocess.run(
        [sys.executable, "-m", "ftd.cli", "inject", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "FTD_SOCKET": stack.socket},
    )


def test_the_drill_saves_acks_and_trains_again_without_taking_the_agents_session(stack: ShippedStack) -> None:
    log, ckpt = stack.workdir / "readme.jsonl", stack.workdir / "ckpt"
    job = stack.sbatch_python(
        "drill",
        REPO / "tests" / "e2e" / "readme_loop.py",
        {"FTD_TEST_LOG": str(log), "FTD_TEST_CKPT": str(ckpt)},
    )
    try:
        stack.slurm.wait_job_state(job, "RUNNING", 60)
        wait_until(lambda: stack.agent_log_records("local_api_rank_registered"), 60, "the rank to register")
        wait_until(lambda: len(records(log, "training", run=0)) >= 3, 60, "the first run to train")
        connected_before = len(stack.agent_log_records("bus_connected"))

        done = inject(stack, "xid", "--data", '{"code": 13, "pci": "0000:3b:00.0"}')
        assert done.returncode == 0, (done.stdout, done.stderr)
        event_id = done.stdout.strip()
        assert event_id, done.stdout

        # saved and acked by the rank, then restarted in place and training from the saved step
        wait_until(lambda: records(log, "saved", run=0), 60, "the first run to save")
        wait_until(lambda: records(log, "started", run=1), 120, "the job's second run to start")
        saved = records(log, "saved", run=0)
        assert len(saved) == 1, saved
        assert records(log, "started", run=1)[0]["start"] == saved[0]["step"] + 1
        wait_until(lambda: len(records(log, "training", run=1)) >= 5, 90, "the second run to train")

        # the event came from the agent itself (its spool), marked as a drill
        injected = [e for e in stack.ledger_events("xid") if e.get("id") == event_id]
        assert len(injected) == 1 and injected[0]["source"] == "inject", injected
        # the agent never lost its session: no Last Will, no node_offline, no node excluded
        assert len(stack.agent_log_records("bus_connected")) == connected_before
        assert stack.ledger_events("node_offline") == []
        assert [r for r in decisions(stack) if r.get("rule") == "node_death"] == []
        info = stack.slurm.job(job)
        assert info.get("JobState") == "RUNNING" and info.get("Restarts") == "1", info
        assert info.get("ExcNodeList", "") in ("", "(null)"), info
    finally:
        stack.slurm.run("scancel", job, check=False)


def test_inject_without_a_running_agent_says_so(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nnode = "node-1"\nsocket_path = "{tmp_path}/absent.sock"\n')
    done = subprocess.run(
        [sys.executable, "-m", "ftd.cli", "inject", "--config", str(config), "xid", "--data", '{"code": 13}'],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != "FTD_SOCKET"},
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith(
        f"ftd inject: no agent answers at {tmp_path}/absent.sock (is ftd-agent running on this node?)"
    ), done.stderr
