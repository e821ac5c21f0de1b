"""Application faults and pressure never drain a healthy node; an Xid 79 does (issue #10, real Slurm).

Real Mosquitto, real Slurm (slurmctld + slurmd for node-1), ``ftd agent`` and ``ftd coordinator``
subprocesses (:mod:`tests.e2e.stack`) with every built-in rule, and the e2e trainer as a
``--requeue`` batch job on node-1. Faults arrive the way they really do: Xid lines written to the
agent's kernel log (one Xid 13 on three GPUs, the same Xid 13 again, an Xid 31) and, through
``ftd inject`` with the node's own config, two CUDA OOM log lines, two critical filesystem
crossings (bytes, then inodes) and critical host memory pressure plus a trainer RSS leak.

Before the fix ``repeat_offender`` counted any two events of severity >= error with the same
``(kind, code)`` and drained node-1 on the second Xid 13 (or OOM line, or fs event). Here: no
``drain_node`` in the ledger and ``scontrol show node`` never says DRAIN, while the application
faults still restart the job in place (not vacuous); then an Xid 79 drains node-1.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.daemons import REPO
from tests.e2e.stack import XID79, Stack, make_stack, wait_until
from tests.realparts import Mosquitto, SlurmCluster

pytestmark = [pytest.mark.real]

XID13 = (
    "[ 812.1{n}] NVRM: Xid (PCI:0000:{bus}:00): 13, pid=4242, name=python, Graphics SM Warp Exception on "
    "(GPC 0, TPC 0, SM 0): Out Of Range Address"
)
XID31 = (
    "[ 813.500000] NVRM: Xid (PCI:0000:3b:00): 31, pid=4242, name=python, Ch 00000008, intr 00000000. "
    "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f_12340000. Fault is of type FAULT_PDE"
)
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity"


@pytest.fixture
def node1(slurm: SlurmCluster, mosquitto: Mosquitto, tmp_path: Path) -> Iterator[Stack]:
    with make_stack(slurm, mosquitto, tmp_path) as built:
        yield built


def inject(stack: Stack, kind: str, severity: str, data: dict[str, Any]) -> str:
    """``ftd inject`` as node-1 (the agent's own config); returns the event id."""
    config = stack.workdir / "agent-node-1.toml"
    argv = [sys.executable, "-m", "ftd.cli", "inject", kind, "--config", str(config), "--severity", severity]
    out = subprocess.run(
        [*argv, "--data", json.dumps(data)], cwd=REPO, capture_output=True, text=True, check=True, timeout=30
    )
    return out.stdout.strip().splitlines()[-1]


def ledger_rows(stack: Stack, sql: str, *args: object) -> list[tuple[Any, ...]]:
    with sqlite3.connect(stack.ledger) as db:
        return db.execute(sql, args).fetchall()


def actions(stack: Stack, kind: str) -> list[dict[str, Any]]:
    rows = ledger_rows(
        stack, "SELECT target, state, request FROM actions WHERE kind = ? ORDER BY created", kind
    )
    return [{"target": t, "state": s, **json.loads(r)} for t, s, r in rows]


def drained(stack: Stack) -> bool:
    return "DRAIN" in stack.slurm.node("node-1").get("State", "")


def test_application_faults_and_pressure_never_drain_while_xid_79_does(node1: Stack) -> None:
    stack = node1
    started = time.monotonic()
    job, _log = stack.submit_trainer()
    stack.slurm.wait_job_state(job, "RUNNING", 30)
    stack.wait_registered(job, timeout=30)

    for n, bus in enumerate(("1b", "3b", "5b")):  # one out-of-bounds kernel, seen on three GPUs
        stack.append_kernel_line(XID13.format(n=n, bus=bus))
    stack.append_kernel_line(XID13.format(n=7, bus="1b"))  # the same application fault again
    stack.append_kernel_line(XID31)
    injected = [
        # Two ranks' OOM lines (inject goes through the agent's storm control, as a real line does: the
        # same line twice within its window would be folded into one event and a count).
        inject(stack, "log_pattern", "error", {"pattern": "cuda_oom", "text": OOM, "job": job, "rank": 0}),
        inject(stack, "log_pattern", "error", {"pattern": "cuda_oom", "text": OOM, "job": job, "rank": 1}),
        inject(
            stack,
            "fs_fill",
            "critical",
            {
                "path": "/scratch",
                "reason": "threshold",
                "level": "critical",
                "resource": "bytes",
                "used_pct": 97,
            },
        ),
        inject(
            stack,
            "fs_fill",
            "critical",
            {
                "path": "/tmp",
                "reason": "threshold",
                "level": "critical",
                "resource": "inodes",
                "inodes_used_pct": 98,
            },
        ),
        inject(
            stack, "mem_pressure", "critical", {"leak": False, "level": "critical", "mem_available_pct": 2.0}
        ),
        inject(
            stack,
            "mem_pressure",
            "critical",
            {"leak": True, "job": job, "rank": 0, "pid": 4242, "rss_mb": 9000.0, "growth_mb_per_min": 900.0},
        ),
    ]

    def all_decided() -> bool:
        ids = {r[0] for r in ledger_rows(stack, "SELECT id FROM events WHERE node = 'node-1'")}
        xids = ledger_rows(stack, "SELECT COUNT(*) FROM events WHERE node = 'node-1' AND kind = 'xid'")[0][0]
        return set(injected) <= ids and xids == 5

    wait_until(all_decided, 20, "the coordinator to record every fault")
    time.sleep(1.0)  # decisions are made in the same call that records the event; let running ones go on

    assert actions(stack, "drain_node") == []
    assert not drained(stack), stack.slurm.node("node-1")
    restarts = actions(stack, "checkpoint_restart")
    by_rule = {(a["rule"], a["params"].get("signature")) for a in restarts}
    assert ("xid_catalog", "xid 13") in by_rule, restarts  # acted on, in place: not vacuous
    assert all(
        a["params"].get("exclude") == [] for a in restarts if a["rule"] in ("xid_catalog", "app_faults")
    )
    xid13 = [a for a in restarts if a["params"].get("signature") == "xid 13"]
    assert len(xid13) == 1, xid13  # three GPUs and a repeat seconds later: one incident, one restart

    stack.append_kernel_line(XID79)  # a GPU off the bus: this one drains
    wait_until(lambda: bool(actions(stack, "drain_node")), 20, "a drain_node decision for the Xid 79")
    wait_until(lambda: drained(stack), 30, "node-1 drained in Slurm")
    [drain] = actions(stack, "drain_node")
    assert drain["rule"] == "xid_catalog" and drain["target"] == "node-1" and "xid 79" in drain["reason"]
    assert stack.slurm.node("node-1")["Reason"].startswith("ftd:")
    assert time.monotonic() - started < 90
