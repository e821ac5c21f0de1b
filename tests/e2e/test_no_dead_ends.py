"""No dead ends (issue #20, item 6), with the real coordinator and agent processes over real Mosquitto.

* ``coordinator.scheduler = "none"`` ("detect and notify only"): an Xid 79 never asks for a drain
  (before the fix: a ``drain_node`` action failed with ``no executor registered for
  <ActionKind.DRAIN_NODE: 'drain_node'>``); the operator gets a notification saying what should be
  done by hand, and an operator's drain through the API is answered with a sentence, not a repr.
* With a real Slurm: an operator's drain that ftd's cooldown holds back goes through with ``force``
  and an audit reason, which the ledger keeps and the action shows.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.daemons import Daemon
from tests.e2e.stack import XID79, Stack, make_stack, wait_until
from tests.realparts import Mosquitto, SlurmCluster, free_port

pytestmark = [pytest.mark.real, pytest.mark.slow]
TOKEN = "no-dead-ends-token-0123456789"


def actions(ledger: Path, kind: str | None = None) -> list[dict[str, Any]]:
    with sqlite3.connect(ledger) as db:
        rows = db.execute("SELECT kind, state, request, detail FROM actions ORDER BY created").fetchall()
    return [
        {"kind": k, "state": s, "request": json.loads(r), "detail": json.loads(d) if d else {}}
        for k, s, r, d in rows
        if kind is None or k == kind
    ]


def post(port: int, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def no_repr(text: str) -> bool:
    return "<ActionKind" not in text and "'drain_node'" not in text


@pytest.fixture
def notify_only(mosquitto: Mosquitto, tmp_path: Path) -> Iterator[tuple[Daemon, Path, int]]:
    run_dir = Path(tempfile.mkdtemp(prefix="ftd-nde-", dir="/tmp"))
    kmsg, ledger, port = tmp_path / "kmsg", tmp_path / "ledger.sqlite", free_port()
    kmsg.touch()
    (tmp_path / "token").write_text(TOKEN + "\n")
    bus = f'[bus]\nhost = "127.0.0.1"\nport = {mosquitto.port}\nkeepalive_s = 2\nreconnect_max_s = 1.0\n'
    coordinator = Daemon(
        "coordinator",
        f"""{bus}
[coordinator]
ledger_path = "{ledger}"
scheduler = "none"

[coordinator.api]
port = {port}
token_file = "{tmp_path / "token"}"

[log]
level = "info"
json = true
""",
        tmp_path,
    )
    agent = Daemon(
        "agent-node-1",
        f"""{bus}
[agent]
node = "node-1"
kmsg_path = "{kmsg}"
kmsg_from_start = true
state_dir = "{tmp_path / "agent-state"}"
socket_path = "{run_dir / "agent.sock"}"

[log]
level = "info"
json = true
""",
        tmp_path,
    )
    coordinator.start()
    agent.start()
    try:
        coordinator.wait_log("node_status")
        agent.wait_log("bus_connected")
        yield coordinator, kmsg, port
    finally:
        agent.stop()
        coordinator.stop()
        for daemon in (agent, coordinator):
            print(f"----- {daemon.name} log (tail)\n{daemon.log()[-4000:]}")


def test_detect_and_notify_only_never_asks_for_a_drain(notify_only: tuple[Daemon, Path, int]) -> None:
    coordinator, kmsg, port = notify_only
    ledger = kmsg.parent / "ledger.sqlite"
    with kmsg.open("a") as f:
        f.write(XID79 + "\n")
    wait_until(lambda: actions(ledger, "notify"), 30, "a notification for the Xid 79")
    assert actions(ledger, "drain_node") == [], actions(ledger, "drain_node")
    [note] = actions(ledger, "notify")
    reason = note["request"]["reason"]
    assert "node-1" in reason and 'scheduler = "none"' in reason and "drain it by hand" in reason, reason
    assert note["request"]["params"]["instead_of"] == "drain_node"
    # no destination configured: the notification is the journal's line, and the action says so
    wait_until(lambda: actions(ledger, "notify")[0]["state"] == "logged", 20, "the notification logged")
    assert "notification" in coordinator.log()
    assert all(no_repr(json.dumps(a)) for a in actions(ledger))
    assert "no executor registered" not in coordinator.log()

    # The operator's own drain: refused with a sentence (there is nothing to drain with).
    status, body = post(port, "/v1/nodes/node-1/drain", {"reason": "bad gpu", "by": "alice"})
    assert status == 200 and body["state"] == "failed", body
    error = body["detail"]["error"]
    assert no_repr(error) and error.startswith("cannot drain node-1: no scheduler is configured"), error
    assert error.endswith("."), error


@pytest.fixture
def api_stack(slurm: SlurmCluster, mosquitto: Mosquitto, tmp_path: Path) -> Iterator[tuple[Stack, int]]:
    port = free_port()
    (tmp_path / "token").write_text(TOKEN + "\n")
    extra = f'\n[coordinator.api]\nport = {port}\ntoken_file = "{tmp_path / "token"}"\n'
    with make_stack(slurm, mosquitto, tmp_path, coordinator_extra=extra) as built:
        yield built, port


def test_an_operators_forced_drain_steps_past_the_cooldown_with_an_audit_reason(
    api_stack: tuple[Stack, int],
) -> None:
    stack, port = api_stack
    status, first = post(port, "/v1/nodes/node-1/drain", {"reason": "first look", "by": "alice"})
    assert status == 202, first
    wait_until(lambda: "DRAIN" in stack.slurm.node("node-1").get("State", ""), 20, "node-1 drained")
    wait_until(lambda: actions(stack.ledger, "drain_node")[0]["state"] == "succeeded", 20, "drain done")
    stack.slurm.run("scontrol", "update", "nodename=node-1", "state=resume")

    # ftd's cooldown (600 s) holds back a second drain of the node...
    status, held = post(port, "/v1/nodes/node-1/drain", {"reason": "again", "by": "alice"})
    assert held["state"] == "suppressed" and "cooldown" in held["detail"]["policy"], held
    # ...force without saying why is refused (the audit needs a reason)...
    status, bad = post(port, "/v1/nodes/node-1/drain", {"reason": "again", "by": "alice", "force": True})
    assert status == 400 and "force_reason" in bad["error"], bad
    # ...and force with an audit reason goes through, the reason kept in the ledger.
    status, forced = post(
        port,
        "/v1/nodes/node-1/drain",
        {"reason": "again", "by": "alice", "force": True, "force_reason": "GPU 3 smells of smoke"},
    )
    assert status == 202, forced
    assert forced["params"]["force_reason"] == "GPU 3 smells of smoke", forced
    assert forced["detail"]["policy"].startswith("force: cooldown"), forced
    wait_until(lambda: "DRAIN" in stack.slurm.node("node-1").get("State", ""), 20, "node-1 drained again")
    last = actions(stack.ledger, "drain_node")[-1]
    assert last["request"]["params"]["force_reason"] == "GPU 3 smells of smoke"
    assert "GPU 3 smells of smoke" in last["detail"]["policy"]
