"""Issue #20, item 5: silence counts from a rank's first heartbeat; start-up has its own timeout.

Real Slurm, the broker as shipped, ``ftd agent`` and ``ftd coordinator`` subprocesses
(:mod:`tests.e2e.shipped_stack`). The agent's heartbeat timeout is 1.5 s; a real torch process
(:mod:`tests.e2e.torch_startup_job`, CPU) registers with ``Client()`` and then takes at least 4 s
(importing torch, building its model) before its first heartbeat. That is start-up, not a hang: no
``rank_heartbeat_lost`` may reach the coordinator (before the fix one did, and the job was
restarted). Then the rank trains, and then really hangs: that is reported, within the heartbeat
timeout, as a ``training``-phase loss with the step it stopped at.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.daemons import REPO
from tests.e2e.shipped_stack import ShippedStack, make_shipped_stack, wait_until
from tests.realparts import SlurmCluster

pytest.importorskip("torch", reason="the start-up test runs a real torch process")

pytestmark = [pytest.mark.real, pytest.mark.slow]

TIMEOUT_S = 1.5
STARTUP_FLOOR_S = 4.0


def records(log: Path, what: str) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("what") == what:
            out.append(rec)
    return out


@pytest.fixture
def stack(slurm: SlurmCluster, tmp_path: Path):  # type: ignore[no-untyped-def]
    extra = f"""
[agent.heartbeat]
timeout_s = {TIMEOUT_S}
check_interval_s = 0.1
"""
    with make_shipped_stack(slurm, tmp_path, agent_extra=extra) as built:
        yield built


def test_torch_startup_longer_than_the_heartbeat_timeout_is_not_a_lost_rank(stack: ShippedStack) -> None:
    log = stack.workdir / "torch.jsonl"
    job = stack.sbatch_python(
        "torch-startup",
        REPO / "tests" / "e2e" / "torch_startup_job.py",
        {
            "FTD_TEST_LOG": str(log),
            "FTD_TEST_STARTUP_S": str(STARTUP_FLOOR_S),
            "FTD_TEST_TRAIN_S": "4",
            "FTD_TEST_HANG_S": "30",
        },
    )
    try:
        wait_until(lambda: records(log, "started"), 120, "the trainer to finish its start-up")
        startup_s = records(log, "started")[0]["startup_s"]
        assert startup_s > TIMEOUT_S  # the point of the test: start-up outlasted the timeout
        assert stack.agent_log_records("local_api_rank_registered"), "the rank never registered"

        wait_until(lambda: records(log, "hang"), 60, "the trainer to train, then hang")
        hang_step = records(log, "hang")[0]["step"]
        assert hang_step > 0
        # The hang is reported (within a few timeouts, generous for a loaded machine) ...
        wait_until(lambda: stack.ledger_events("rank_heartbeat_lost"), 30, "the hang to be reported")
        time.sleep(1.0)
        lost = stack.ledger_events("rank_heartbeat_lost")
        # ... and it is the only loss reported: nothing during the start-up.
        assert len(lost) == 1, lost
        data = lost[0]["data"]
        assert isinstance(data, dict)
        assert data["job"] == job and data["never_beat"] is False and data["phase"] == "training", data
        assert data["step"] == hang_step and data["timeout_s"] == TIMEOUT_S, data
    finally:
        stack.slurm.run("scancel", job, check=False)
