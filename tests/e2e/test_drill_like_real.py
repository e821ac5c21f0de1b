"""Issue #32 item 2: a drill rehearses the real thing. ``ftd inject xid`` with code 79 takes the path a
real kernel-log Xid 79 takes (the same severity, condition, actions) and is marked as a drill
everywhere it shows: the event, the node's condition, the actions and notifications it causes.

Real parts: Mosquitto, ``ftd agent`` and ``ftd coordinator`` as subprocesses (no scheduler: the drain
an Xid 79 asks for becomes a notification to do it by hand), the drill through ``ftd inject`` as
operators.md §3 writes it, the real line appended to the agent's kernel log, ``ftd health`` on the
node and ``ftd status`` against the coordinator's API.

Before the fix ``ftd inject`` sent severity ``error`` for every Xid, where the kernel line of an Xid 79
is ``critical`` (the catalogue's): no condition was raised, so the health check, the retry of an
unacted condition and a critical-condition alert were never rehearsed.
"""

from __future__ import annotations

import json
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
from tests.realparts import Mosquitto, free_port

pytestmark = [pytest.mark.real, pytest.mark.slow]

REAL_XID79 = (
    "[ 5021.437112] NVRM: Xid (PCI:0000:86:00): 79, pid=31337, name=python, GPU has fallen off the bus."
)


@pytest.fixture
def node(mosquitto: Mosquitto, tmp_path: Path) -> Iterator[Node]:
    with one_node(mosquitto, tmp_path, api_port=free_port()) as built:
        yield built


def ftd(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ftd.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "FTD_SOCKET": node.socket},
    )


def xid_event(node: Node, pci: str) -> dict[str, Any] | None:
    found = [e for e in node.ledger_events("xid") if e["data"].get("pci") == pci]
    return found[0] if found else None


def test_an_injected_xid79_takes_the_real_lines_path_marked_as_a_drill(node: Node) -> None:
    node.kernel_line(REAL_XID79)
    wait_until(lambda: xid_event(node, "0000:86:00.0"), 30, "the real Xid 79 in the ledger")
    done = ftd(
        node,
        "inject",
        "--config",
        str(node.agent.config_path),
        "xid",
        "--data",
        '{"code": 79, "pci": "0000:3b:00.0"}',
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    wait_until(lambda: xid_event(node, "0000:3b:00.0"), 30, "the drill's Xid 79 in the ledger")
    real, drill = xid_event(node, "0000:86:00.0"), xid_event(node, "0000:3b:00.0")
    assert real is not None and drill is not None

    # the same severity and meaning as the kernel's own line, from the same parser and catalogue
    assert real["severity"] == "critical"
    assert drill["severity"] == real["severity"], (drill, real)
    for key in ("code", "action", "catalog_version"):
        assert drill["data"][key] == real["data"][key], key
    assert drill["data"]["extra"]["name"] == real["data"]["extra"]["name"]
    # ... and marked as a drill, the real one not
    assert drill["source"] == "inject" and drill["data"]["drill"] is True, drill
    assert real["source"] == "kmsg" and "drill" not in real["data"], real

    # the node's condition: ftd health (Slurm's health check) sees both, the drill's marked
    def health() -> dict[str, Any]:
        out = ftd(node, "health", "--socket", node.socket, "--json", "--timeout", "5")
        return dict(json.loads(out.stdout))

    wait_until(lambda: len(health()["conditions"]) == 2, 20, "both Xid 79 conditions")
    reasons = sorted(c["reason"] for c in health()["conditions"])
    assert reasons[0].startswith("xid 79 on 0000:3b:00.0") and reasons[0].endswith("(drill)"), reasons
    assert reasons[1].startswith("xid 79 on 0000:86:00.0") and "drill" not in reasons[1], reasons

    # the coordinator shows the drill's condition marked, and its actions say they are a drill's
    def status() -> dict[str, Any]:
        out = ftd(node, "status", "--url", str(node.api), "--json")
        assert out.returncode == 0, out.stderr
        return dict(json.loads(out.stdout))

    wait_until(lambda: len(status()["nodes"][0].get("conditions") or []) == 2, 20, "the conditions in status")
    shown = status()["nodes"][0]["conditions"]
    assert sum(c.endswith("(drill)") for c in shown) == 1, shown
    wait_until(
        lambda: any(a["request"].get("event_id") == drill["id"] for a in node.actions()),
        20,
        "the drill's actions",
    )
    drills = [a for a in node.actions() if a["request"].get("event_id") == drill["id"]]
    reals = [a for a in node.actions() if a["request"].get("event_id") == real["id"]]
    assert sorted(a["kind"] for a in drills) == sorted(a["kind"] for a in reals), (drills, reals)
    for action in drills:
        assert action["request"]["reason"].startswith("drill: "), action
        assert action["request"]["params"].get("drill") is True, action
    for action in reals:
        assert "drill" not in action["request"]["reason"] and "drill" not in action["request"]["params"]

    # the drill ends as operators.md says: the same inject with severity info ends its condition only
    done = ftd(
        node,
        "inject",
        "--config",
        str(node.agent.config_path),
        "xid",
        "--severity",
        "info",
        "--data",
        '{"code": 79, "pci": "0000:3b:00.0"}',
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    wait_until(lambda: len(health()["conditions"]) == 1, 20, "the drill's condition to end")
    assert health()["conditions"][0]["reason"].startswith("xid 79 on 0000:86:00.0")
