"""Issue #31 item 2, "one door": a kernel-log segfault of a training rank reaches the coordinator
carrying the rank's job, and the ``host`` rule takes the application-fault path for that job.

Real parts: Mosquitto, ``ftd agent`` and ``ftd coordinator`` as subprocesses, and the ranks are real
processes registered with the agent through the trainer client (:mod:`tests.e2e.segv_rank`) that
segfault for real. The agent reads the kernel log from a file (``kmsg_path``) the test appends the
kernel's ``segfault at`` line to, naming the rank's pid and ``libnccl``.

Before the fix, kernel-log events went from the kmsg watcher straight into storm control and skipped
the agent's enrichment, so the event carried no job and the rule recorded it only. Two cases:

* the line arrives while the rank is still registered (the kernel prints it as the fault is taken);
* the line is read after the agent saw the dead rank's connection close (a reader that falls behind,
  or a kmsg poll that comes after the socket's EOF): the agent still knows whose pid it was.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.daemons import REPO
from tests.e2e.one_node import Node, one_node
from tests.e2e.stack import wait_until
from tests.realparts import Mosquitto

pytestmark = [pytest.mark.real, pytest.mark.slow]

NCCL_SEGFAULT = (
    "[ 8123.004518] python[{pid}]: segfault at 0 ip 00007f3a2c1d2e3f sp 00007ffd4b5a6c70 error 4"
    " in libnccl.so.2.18.3[7f3a2c000000+1d2e000]"
)


@pytest.fixture
def node(mosquitto: Mosquitto, tmp_path: Path) -> Iterator[Node]:
    with one_node(mosquitto, tmp_path) as built:
        yield built


def segfaults(node: Node) -> list[dict[str, Any]]:
    return node.ledger_events("segfault")


@contextlib.contextmanager
def rank(node: Node, job: str, rank_no: int) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A rank of ``job`` registered with the agent; yields the process and its crash switch."""
    crash = node.workdir / f"crash-{job}-{rank_no}"
    env = {
        **os.environ,
        "FTD_SOCKET": node.socket,
        "FTD_TEST_JOB": job,
        "FTD_TEST_RANK": str(rank_no),
        "FTD_TEST_CRASH": str(crash),
        "PYTHONPATH": str(REPO),
    }
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "e2e" / "segv_rank.py")],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == f"registered {proc.pid}"
        yield proc, crash
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def decided_for(node: Node, job: str) -> list[dict[str, Any]]:
    return [d for d in node.decisions() if d.get("rule") == "host" and d.get("target") == job]


def test_a_kernel_segfault_in_a_ranks_libnccl_takes_the_application_fault_path(node: Node) -> None:
    # 1. The line is read while the rank is registered: the event carries its job and rank.
    with rank(node, "segv-live", 3) as (proc, _):
        wait_until(lambda: node.agent_records("local_api_rank_registered"), 20, "rank 3 to register")
        node.kernel_line(NCCL_SEGFAULT.format(pid=proc.pid))
        wait_until(lambda: segfaults(node), 30, "the segfault event in the ledger")
        [event] = segfaults(node)
        assert event["data"]["pid"] == proc.pid
        assert event["data"]["library"] == "libnccl.so.2.18.3"
        assert (event["data"].get("job"), event["data"].get("rank")) == ("segv-live", 3), event
        wait_until(lambda: decided_for(node, "segv-live"), 30, "the host rule's decision for the job")
        [decision] = decided_for(node, "segv-live")
        assert decision["kind"] == "checkpoint_restart", decision
        assert "segfault in libnccl.so.2.18.3" in decision["reason"], decision
        assert [d for d in node.decisions() if d.get("kind") == "drain"] == []  # never the node

    # 2. The rank really segfaults, the agent sees its connection close, and only then reads the line.
    with rank(node, "segv-gone", 1) as (proc, crash):
        crash.touch()
        assert proc.wait(20) == -11  # SIGSEGV
        wait_until(
            lambda: any(r.get("pid") == proc.pid for r in node.agent_records("local_api_rank_left")),
            20,
            "the agent to see the dead rank's connection close",
        )
        node.kernel_line(NCCL_SEGFAULT.format(pid=proc.pid))
        wait_until(lambda: len(segfaults(node)) == 2, 30, "the second segfault event in the ledger")
        [event] = [e for e in segfaults(node) if e["data"]["pid"] == proc.pid]
        assert (event["data"].get("job"), event["data"].get("rank")) == ("segv-gone", 1), event
        wait_until(lambda: decided_for(node, "segv-gone"), 30, "the host rule's decision for the job")
        [decision] = decided_for(node, "segv-gone")
        assert decision["kind"] == "checkpoint_restart", decision
    assert len(segfaults(node)) == 2
