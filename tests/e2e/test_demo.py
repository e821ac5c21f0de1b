"""`ftd demo` as a user runs it: a subprocess whose last line is the JSON summary."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.daemons import REPO

pytestmark = pytest.mark.slow


def run_demo(*args: str) -> tuple[str, dict[str, object], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "ftd.cli", "demo", "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    return proc.stdout, json.loads(lines[-1]), proc.stderr


def test_xid79_demo_saves_drains_and_restarts_elsewhere() -> None:
    out, summary, err = run_demo("--scenario", "xid79")
    assert summary["scenario"] == "xid79"
    assert summary["acks"] == 2
    actions = {(a["kind"], a["target"]): a["state"] for a in summary["actions"]}  # type: ignore[union-attr]
    assert actions == {("checkpoint_restart", "1001"): "succeeded", ("drain_node", "node-2"): "succeeded"}
    assert summary["drained"] == ["node-2"]
    assert "node-2" not in summary["restarted_on"]  # type: ignore[operator]
    # ftd requeued the job itself: its ranks on the new node are believed at once, no false alarm.
    assert summary["placement_violations"] == 0 and '"placement_violation"' not in out, out[-3000:]
    assert isinstance(summary["detect_ms"], float) and summary["detect_ms"] > 0
    # The timeline is readable: both ranks saved at the same step.
    saves = [line.split("step ")[1].split(",")[0] for line in out.splitlines() if "saved checkpoint" in line]
    assert len(saves) == 2 and len(set(saves)) == 1
    # Simulated nodes share one host and have no fabric: no pair-test server, and no warning per agent
    # that its key is missing (four of them opened every demo a newcomer ran).
    assert "pair_tests_not_served" not in err, err[-3000:]


def test_xid43_demo_is_recorded_and_nothing_else() -> None:
    _, summary, _ = run_demo("--scenario", "xid43", "--nodes", "3")
    assert summary["actions"] == [] and summary["drained"] == [] and summary["acks"] == 0
    assert summary["detect_ms"] is not None  # positive control: it was detected
