"""``ftd actions list|show|approve|reject``, ``ftd status --problems|--node``, ``ftd events list|tail``
and finding the coordinator, each against a real coordinator API (the in-process coordinator with its
aiohttp server on a free local port; the CLI runs in a thread, over HTTP, as an operator's would)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ftd.cli import main
from ftd.commands import action_view as view
from ftd.commands import api_client
from ftd.commands.actions import STATES
from ftd.config import ApiConfig
from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.coordinator.api import Api
from ftd.coordinator.daemon import Coordinator
from ftd.coordinator.model.plan import Plan, Step
from ftd.events import Ack, Kind, NodeStatus, make_event
from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState
from tests.realparts import free_port
from tests.unit.test_api import TOKEN, make_coordinator, populate


@dataclass
class Served:
    coordinator: Coordinator
    url: str
    config: Path  # coordinator.api port and token_file of this API


def _record(id: str, kind: str, target: str, state: ActionState, **detail: object) -> ActionRecord:
    request = ActionRequest(kind=kind, target=target, reason=f"why {id}", rule="xid_catalog", event_id="e1")
    return ActionRecord(id=id, request=request, state=state, detail=dict(detail), created=time.time())


@pytest.fixture
async def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Served]:
    monkeypatch.delenv(api_client.CONFIG_ENV, raising=False)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setattr(api_client, "DEFAULT_CONFIGS", (str(tmp_path / "absent.toml"),))
    scheduler = FakeScheduler()
    for node in ("node-1", "node-2", "node-3", "node-4"):
        scheduler.add_node(node)
    scheduler.add_job("42", ["node-1"])
    coordinator = make_coordinator(scheduler, approval=("drain_node", "gpu_reset"))
    await populate(coordinator)  # node-1 online with job 42 (ranks 0, 1), node-2 offline; events e1, e2
    state = coordinator.state
    for node in ("node-3", "node-4"):
        state.apply_status(NodeStatus(node=node, state="online", ts=1000.0))
    state.apply_conditions("node-3", ["xid 79: GPU fell off the bus"])
    ledger = coordinator.ledger
    await ledger.save_action(
        _record("act-run", "checkpoint_restart", "42", ActionState.RUNNING, phase="stop", plan="plan-1")
    )
    await ledger.save_action(_record("act-reset", "gpu_reset", "node-1", ActionState.PENDING, plan="plan-1"))
    await ledger.save_action(
        _record(
            "act-fail", "drain_node", "node-4", ActionState.FAILED, error="SchedulerError: scontrol exit 1"
        )
    )
    await ledger.save_action(_record("act-log", "notify", "node-3", ActionState.LOGGED, channel="log"))
    await ledger.save_action(_record("act-ok", "drain_node", "node-2", ActionState.SUCCEEDED))
    steps = [
        Step(action="act-run", kind="checkpoint_restart", target="42", role="job"),
        Step(action="act-reset", kind="gpu_reset", target="node-1", role="node"),
    ]
    await ledger.save_plan(Plan(id="plan-1", event_id="e1", steps=steps))
    # act-run's save is out: one of job 42's two ranks has acked it so far (the ledger does not know yet)
    coordinator.acks.record(Ack(directive_id="act-run-save", job="42", rank=0, node="node-1", ok=True))
    await coordinator.bus.start()
    port = free_port()
    api = Api(coordinator, ApiConfig(port=port), token=TOKEN)
    await api.start()
    token = tmp_path / "api-token"
    token.write_text(TOKEN + "\n")
    config = tmp_path / "coordinator.toml"
    # the credential's name, as in the shipped config: outside the unit it is the file beside the config
    config.write_text(f'[coordinator.api]\nport = {port}\ntoken_file = "{token.name}"\n')
    try:
        yield Served(coordinator, f"http://127.0.0.1:{port}", config)
    finally:
        await api.stop()
        await coordinator.engine.close()
        await coordinator.bus.stop()


async def ftd(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``ftd ARGV`` in a thread (it blocks on HTTP while this loop serves the API)."""
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _row(text: str, first: str) -> list[str]:
    return next(line for line in text.splitlines() if line.startswith(first + " ")).split()


async def test_status_problems_shows_only_what_needs_a_look(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    served.coordinator.state.mark_drained("node-2", "ftd: xid 79")
    code, out, _ = await ftd(capsys, "status", "--config", str(served.config), "--problems")
    assert code == 0
    # node-3: online, a condition
    assert "NODES WITH PROBLEMS (2: 1 online, 1 offline, 1 drained by ftd, 0 unavailable)" in out
    nodes = [line.split()[0] for line in out.split("\nJOBS (")[0].splitlines() if line.startswith("node-")]
    assert nodes == ["node-2", "node-3"]
    actions_part = out.split("ACTIONS IN FLIGHT OR FAILED")[1]
    shown = {line.split()[2] for line in actions_part.splitlines()[2:] if line.strip()}
    assert shown == {"act-run", "act-reset", "act-fail"}  # not the succeeded nor the logged one
    assert "running (phase stop, acks 1/2" in actions_part  # live, from the coordinator; and the deadline
    code, out, _ = await ftd(capsys, "status", "--config", str(served.config), "--problems", "--json")
    data = json.loads(out)
    assert [n["name"] for n in data["nodes"]] == ["node-2", "node-3"]
    assert data["jobs"] == []  # job 42 runs on node-1, which is fine


async def test_status_problems_leaves_out_a_failed_drain_its_retry_did(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    """act-fail (drain_node node-4, failed) drained by a later retry: not a problem any more; a failed
    action on another target, or one whose later attempt failed too, still is."""
    ledger = served.coordinator.ledger
    code, out, _ = await ftd(capsys, "status", "--url", served.url, "--problems")
    assert "act-fail" in out.split("ACTIONS IN FLIGHT OR FAILED")[1]
    await ledger.save_action(_record("act-retry-bad", "drain_node", "node-4", ActionState.FAILED))
    code, out, _ = await ftd(capsys, "status", "--url", served.url, "--problems")
    actions_part = out.split("ACTIONS IN FLIGHT OR FAILED")[1]
    assert "act-fail" in actions_part and "act-retry-bad" in actions_part
    await ledger.save_action(_record("act-retry", "drain_node", "node-4", ActionState.SUCCEEDED))
    code, out, _ = await ftd(capsys, "status", "--url", served.url, "--problems")
    assert code == 0
    actions_part = out.split("ACTIONS IN FLIGHT OR FAILED")[1]
    assert "act-fail" not in actions_part and "act-retry-bad" not in actions_part, actions_part
    assert "act-run" in actions_part and "act-reset" in actions_part  # in flight: still shown


async def test_status_node_shows_one_node(served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = await ftd(capsys, "status", "--url", served.url, "--node", "node-1")
    assert code == 0
    assert _row(out, "node-1")[:3] == ["node-1", "online", "no"]
    assert "node-2" not in out.split("\nJOBS (")[0]
    assert _row(out, "42")[:4] == ["42", "saving", "node-1", "2"]
    events = out.split("LATEST EVENTS ON node-1 (1)")[1]
    assert " e1 " in events and "xid" in events
    assert "act-run" in out and "act-reset" in out and "act-fail" not in out
    code, _, err = await ftd(capsys, "status", "--url", served.url, "--node", "node-9")
    assert code == 2 and "node 'node-9' is not known" in err


async def test_status_shows_a_job_ftd_moved_on_the_node_it_left(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    """Job 77, requeued without node-4 and pending: in the jobs table, --problems and node-4's view."""
    served.coordinator.state.moved.note("77", time.time(), ["node-4"], "act-cr")
    for argv in ([], ["--problems"], ["--node", "node-4"]):
        code, out, _ = await ftd(capsys, "status", "--url", served.url, *argv)
        assert code == 0
        row = next(line for line in out.splitlines() if line.startswith("77 "))
        assert "pending after requeue, excluding node-4" in row, (argv, out)
        assert "job 77: pending after requeue, excluding node-4 (action act-cr, since " in out
    code, out, _ = await ftd(capsys, "status", "--url", served.url, "--node", "node-1")
    assert not any(line.startswith("77 ") for line in out.splitlines())


async def test_actions_list_and_show(served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = await ftd(capsys, "actions", "list", "--config", str(served.config))
    assert code == 0
    header = next(line for line in out.splitlines() if line.startswith("ID "))
    assert header.split() == ["ID", "KIND", "TARGET", "PHASE", "STATE", "ACKS", "DEADLINE", "WHY"]
    assert _row(out, "act-run")[:6] == ["act-run", "checkpoint_restart", "42", "stop", "running", "1/2"]
    fail = _row(out, "act-fail")
    assert fail[:5] == ["act-fail", "drain_node", "node-4", "-", "failed"]
    assert "SchedulerError: scontrol exit 1" in " ".join(fail)
    assert _row(out, "act-log")[4] == "logged"
    code, out, _ = await ftd(
        capsys, "actions", "list", "--url", served.url, "--state", "failed,logged", "--json"
    )
    assert sorted(a["id"] for a in json.loads(out)) == ["act-fail", "act-log"]
    # a state no action has: an error that lists the states, not an empty table (issue #32)
    code, out, err = await ftd(capsys, "actions", "list", "--url", served.url, "--state", "failed,bogus")
    assert code == 2 and out == "", out
    assert "unknown state(s) bogus; the states are pending, running, awaiting_approval, succeeded" in err
    assert set(STATES) == {str(s) for s in ActionState}  # the list is every state there is

    code, out, _ = await ftd(capsys, "actions", "show", "--config", str(served.config), "act-run")
    assert code == 0
    assert out.startswith("action act-run: checkpoint_restart 42  state running")
    assert "requested by xid_catalog: why act-run" in out and "phase stop under way" in out
    plan = out.split("PLAN plan-1 (running, event e1)")[1]
    steps = [line.split() for line in plan.splitlines() if line.strip().startswith("act-")]
    assert steps == [
        ["act-run", "<-", "this", "checkpoint_restart", "42", "running"],
        ["act-reset", "gpu_reset", "node-1", "pending"],
    ]
    code, _, err = await ftd(capsys, "actions", "show", "--url", served.url, "act-nope")
    assert code == 1 and "HTTP 404" in err and "no action with id 'act-nope'" in err


async def test_approve_and_reject_with_the_configured_token(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = served.coordinator.engine
    held = [
        await engine.submit(ActionRequest(kind=kind, target=node, reason="bad GPU", rule="api:test"))
        for kind, node in (("drain_node", "node-3"), ("gpu_reset", "node-4"))
    ]
    assert [r.state for r in held] == [ActionState.AWAITING_APPROVAL] * 2
    code, _, err = await ftd(capsys, "actions", "approve", "--url", served.url, held[0].id)
    assert code == 1 and "no API token" in err  # --url alone: no token to send
    code, out, _ = await ftd(
        capsys, "actions", "approve", "--config", str(served.config), held[0].id, "--by", "ana"
    )
    assert code == 0 and out.startswith(f"approved {held[0].id}: drain_node node-3 is now ")
    code, out, _ = await ftd(
        capsys, "actions", "reject", "--config", str(served.config), held[1].id, "--reason", "spare is busy"
    )
    assert code == 0 and out.strip() == f"rejected {held[1].id}: gpu_reset node-4 is now suppressed"
    await engine.wait_idle(5)
    approved = await served.coordinator.ledger.action(held[0].id)
    assert approved is not None and approved.state == ActionState.SUCCEEDED
    code, _, err = await ftd(capsys, "actions", "approve", "--config", str(served.config), held[1].id)
    assert code == 1 and "HTTP 409" in err and "it was already suppressed" in err, err
    code, _, err = await ftd(capsys, "actions", "approve", "--config", str(served.config), held[0].id)
    assert code == 1 and f"{held[0].id} is not awaiting approval: it already succeeded" in err, err
    # who approved, and when, is in the history `actions show` prints (issue #32: it was not)
    code, out, _ = await ftd(capsys, "actions", "show", "--config", str(served.config), held[0].id)
    history = out.split("HISTORY (the ledger's record)")[1].split("DETAIL")[0]
    assert "approved by ana" in history, history
    code, out, _ = await ftd(capsys, "actions", "show", "--config", str(served.config), held[1].id)
    assert "rejected by " in out.split("HISTORY (the ledger's record)")[1].split("DETAIL")[0]


async def test_an_approval_without_by_is_recorded_as_the_login_name(
    served: Served, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API token names no user: the CLI says who runs it, not "operator" (issue #32)."""
    monkeypatch.setenv("LOGNAME", "oncall-kim")  # what getpass reads first, as a login shell sets it
    monkeypatch.delenv("SUDO_USER", raising=False)
    engine = served.coordinator.engine
    held = await engine.submit(ActionRequest(kind="drain_node", target="node-3", reason="bad GPU"))
    code, _, _ = await ftd(capsys, "actions", "approve", "--config", str(served.config), held.id)
    assert code == 0
    record = await served.coordinator.ledger.action(held.id)
    assert record is not None and record.detail["approved_by"] == "oncall-kim"
    # `sudo ftd actions approve` (the token file is root's): the user who ran sudo, not root
    monkeypatch.setenv("LOGNAME", "root")
    monkeypatch.setenv("SUDO_USER", "oncall-lee")
    held = await engine.submit(ActionRequest(kind="gpu_reset", target="node-4", reason="bad GPU"))
    assert held.state == ActionState.AWAITING_APPROVAL, held
    code, _, _ = await ftd(capsys, "actions", "reject", "--config", str(served.config), held.id)
    record = await served.coordinator.ledger.action(held.id)
    assert code == 0 and record is not None and record.detail["rejected_by"] == "oncall-lee"


def test_why_is_a_sentence_never_a_python_dict() -> None:
    """An escalated restart of a pinned job: its why was printed as a dict (issue #32)."""
    refused = {"nodes": ["node-2"], "why": "job 7 is pinned to node-2 and node-2 is out of service"}
    action = {"state": "escalated", "detail": {"exclude_refused": refused, "pinned": refused}}
    assert view.why(action) == refused["why"]
    reset = {"state": "escalated", "detail": {"escalation": "reboot"}}
    assert view.why(reset) == view.ESCALATIONS["reboot"]
    assert view.ESCALATIONS["reboot"].startswith("the reset did not clear the fault")
    odd = {"state": "escalated", "detail": {"why": {"seen_state": "PENDING", "nodes": ["a", "b"]}}}
    assert view.why(odd) == "seen state PENDING; nodes a, b"
    assert "{" not in view.why(odd) and "'" not in view.why(odd)


async def test_events_list_and_tail(served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = await ftd(capsys, "events", "list", "--url", served.url)
    assert code == 0 and [line.split()[-1] for line in out.splitlines()] == ["[e1]", "[e2]"]  # oldest first
    code, out, _ = await ftd(capsys, "events", "list", "--url", served.url, "--kind", "ecc", "--json")
    assert [json.loads(line)["id"] for line in out.splitlines()] == ["e2"]

    ledger = served.coordinator.ledger
    loop = asyncio.get_running_loop()
    started = threading.Event()

    def tail() -> int:
        started.set()
        return main(["events", "tail", "--config", str(served.config), "--interval", "0.2", "--count", "2"])

    capsys.readouterr()
    task = loop.run_in_executor(None, tail)
    await asyncio.to_thread(started.wait, 5)
    await asyncio.sleep(0.5)  # tail printed the backlog and polls
    await ledger.record_event(make_event("node-3", Kind.XID, data={"code": 48}, ts=time.time(), id="e3"))
    await ledger.record_event(make_event("node-4", Kind.ECC, data={"dbe": 2}, ts=time.time() + 1, id="e4"))
    assert await asyncio.wait_for(task, 30) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[-1] for line in lines] == ["[e1]", "[e2]", "[e3]", "[e4]"]
    assert "xid 48" in lines[2]


async def test_which_coordinator(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No --url, no --config: $FTD_CONFIG, then the default path; else a message saying what to pass
    (never a silent read of 127.0.0.1:8787)."""
    code, out, err = await ftd(capsys, "status")
    assert code == 2 and out == ""
    assert "pass --config /etc/ftd/coordinator.toml" in err and "--url" in err and "$FTD_CONFIG" in err
    for command in (["actions", "list"], ["events", "list"], ["events", "tail"]):
        code, _, err = await ftd(capsys, *command)
        assert code == 2 and "which coordinator?" in err, command
    monkeypatch.setenv(api_client.CONFIG_ENV, str(served.config))
    code, out, _ = await ftd(capsys, "status")
    assert code == 0 and f"coordinator {served.url} " in out
    monkeypatch.delenv(api_client.CONFIG_ENV)
    monkeypatch.setattr(api_client, "DEFAULT_CONFIGS", (str(tmp_path / "absent.toml"), str(served.config)))
    code, out, _ = await ftd(capsys, "actions", "list")
    assert code == 0 and f"from {served.url}" in out
