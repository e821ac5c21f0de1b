"""The on-call API behind the dashboard: ``/v1/nodes`` filtered, sorted and paged on the server,
``/v1/summary`` (counts by state and by rack), ``/v1/plans/{id}``, jobs with their state, and an
action held for approval decided through the API as the page does it.

Exact counts over a small cluster whose every node is in a known state (see :func:`cluster`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ftd.config.schema import NodeLabelsConfig
from ftd.coordinator.api.dashboard import WEB_DIR
from ftd.coordinator.model.plan import Plan, Step, phases_of
from ftd.events import NodeStatus
from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState
from tests.unit.test_api import AUTH, TOKEN, Env, _env, wait_finished


def _record(id_: str, kind: str, target: str, state: ActionState, **params: Any) -> ActionRecord:
    now = time.time()
    request = ActionRequest(kind=kind, target=target, reason=f"{kind} {target}", rule="test", params=params)
    return ActionRecord(id=id_, request=request, state=state, created=now, updated=now)


async def cluster(env: Env) -> None:
    """node-1 healthy with job 42, node-2 offline (the base fixture), and: n-off offline at ts 3000,
    n-drn drained by ftd, n-una drained by an admin, n-cnd with an active condition and a reset
    running, n-ok healthy; racks r1 = node-1, n-ok, n-cnd and r2 = n-drn."""
    state = env.coordinator.state
    for node in ("n-off", "n-drn", "n-una", "n-cnd", "n-ok"):
        state.apply_status(NodeStatus(node=node, state="online", ts=2000.0))
    state.apply_status(NodeStatus(node="n-off", state="offline", ts=3000.0))
    state.mark_drained("n-drn", "ftd: xid 79")
    state.mark_unavailable("n-una", "admin: cable swap")
    state.apply_conditions("n-cnd", ["xid 48: double-bit ECC"])
    await env.coordinator.ledger.save_action(_record("reset-1", "gpu_reset", "n-cnd", ActionState.RUNNING))


RACKS = [  # coordinator.node_labels; n-gone is labelled but never reported: counted nowhere
    NodeLabelsConfig(nodes=["node-1", "n-ok", "n-cnd", "n-gone"], rack="r1"),
    NodeLabelsConfig(nodes=["n-drn"], rack="r2"),
]


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async for e in _env(TOKEN, node_labels=RACKS):
        await cluster(e)
        yield e


async def _nodes(env: Env, query: str) -> tuple[list[str], int]:
    resp = await env.client.get(f"/v1/nodes?{query}")
    assert resp.status == 200, await resp.text()
    return [n["name"] for n in await resp.json()], int(resp.headers["X-Total-Count"])


async def test_problems_sorted_by_severity_then_newest_change(env: Env) -> None:
    names, total = await _nodes(env, "problems=1&sort=severity")
    # critical: n-off (offline, newest change), n-cnd (condition), node-2 (offline since 1001);
    # warning: n-drn; info: n-una. Healthy node-1 and n-ok are not problems.
    assert names == ["n-off", "n-cnd", "node-2", "n-drn", "n-una"] and total == 5
    nodes = {n["name"]: n for n in await (await env.client.get("/v1/nodes?problems=1")).json()}
    assert nodes["n-cnd"]["state"] == "condition" and nodes["n-cnd"]["severity"] == "critical"
    assert nodes["n-cnd"]["action"]["id"] == "reset-1" and nodes["n-cnd"]["action"]["state"] == "running"
    assert nodes["n-cnd"]["labels"] == {"rack": "r1"}
    assert nodes["n-una"]["state"] == "unavailable" and nodes["n-una"]["severity"] == "info"
    assert nodes["n-drn"]["state"] == "drained" and nodes["n-drn"]["action"] is None


async def test_filter_search_and_pages(env: Env) -> None:
    assert await _nodes(env, "state=healthy") == (["n-ok", "node-1"], 2)
    assert await _nodes(env, "state=offline") == (["n-off", "node-2"], 2)
    assert await _nodes(env, "q=R2") == (["n-drn"], 1)  # a label, case-insensitive
    assert await _nodes(env, "q=cable") == (["n-una"], 1)  # the reason someone else gave
    assert await _nodes(env, "q=ECC") == (["n-cnd"], 1)  # a condition
    assert await _nodes(env, "q=42") == (["node-1"], 1)  # a job
    assert await _nodes(env, "q=gpu_reset&problems=1") == (["n-cnd"], 1)  # its action
    assert await _nodes(env, "limit=2&offset=1") == (["n-drn", "n-off"], 7)
    assert await _nodes(env, "limit=2&offset=6") == (["node-2"], 7)
    assert await _nodes(env, "offset=50") == ([], 7)
    everything = await (await env.client.get("/v1/nodes")).json()  # unchanged without a query
    assert [n["name"] for n in everything] == ["n-cnd", "n-drn", "n-off", "n-ok", "n-una", "node-1", "node-2"]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("sort=size", "sort"),
        ("state=broken", "state"),
        ("state=null", "state"),  # lax conversion would read it as "no filter"
        ("limit=null", "limit"),
        ("limit=0", "limit"),
        ("offset=-1", "offset"),
        ("q=" + "x" * 129, "q"),
        ("problems=maybe", "problems"),
        ("page=2", "page"),
    ],
)
async def test_bad_queries_are_400_naming_the_field(env: Env, query: str, field: str) -> None:
    resp = await env.client.get(f"/v1/nodes?{query}")
    assert resp.status == 400
    assert field in (await resp.json())["error"]


async def test_summary_counts_each_node_once(env: Env) -> None:
    body = await (await env.client.get("/v1/summary")).json()
    assert body["nodes"] == 7 and body["problems"] == 5
    assert body["by_state"] == {
        "offline": 2,
        "drained": 1,
        "unavailable": 1,
        "condition": 1,
        "acting": 0,
        "healthy": 2,
    }
    assert body["by_label"] == {"rack": {"r1": {"healthy": 2, "condition": 1}, "r2": {"drained": 1}}}
    assert body["jobs"] == {"training": 1}
    assert [a["id"] for a in body["in_flight"]] == ["reset-1"]
    assert body["deadlines"]["reset-1"] > time.time()


async def test_a_job_being_restarted_says_where_it_is(env: Env) -> None:
    ledger = env.coordinator.ledger
    restart = _record("cr-1", "checkpoint_restart", "42", ActionState.RUNNING, exclude=["node-1"])
    await ledger.save_action(restart)
    assert [(j["id"], j["state"], j["action"]) for j in await (await env.client.get("/v1/jobs")).json()] == [
        ("42", "saving", "cr-1")
    ]
    restart.detail["phases_done"] = ["stop"]
    await ledger.save_action(restart)
    assert (await (await env.client.get("/v1/jobs")).json())[0]["state"] == "restarting"
    restart.detail.update(phases_done=["stop", "requeue"], waiting="waiting for the job to train again")
    await ledger.save_action(restart)
    assert (await (await env.client.get("/v1/jobs")).json())[0]["state"] == "pending after requeue"
    node_1 = (await (await env.client.get("/v1/nodes?q=node-1")).json())[0]
    assert node_1["state"] == "acting" and node_1["action"]["id"] == "cr-1"  # the node it excludes
    assert node_1["action"]["why"] == "waiting for the job to train again"


async def test_a_plan_lists_its_steps_with_their_states(env: Env) -> None:
    ledger = env.coordinator.ledger
    await ledger.save_action(_record("cr-2", "checkpoint_restart", "42", ActionState.SUCCEEDED))
    steps = [
        Step(action="cr-2", kind="checkpoint_restart", target="42", role="job"),
        Step(action="reset-1", kind="gpu_reset", target="n-cnd", role="node"),
        Step(action="gone", kind="drain_node", target="n-cnd", role="node"),
    ]
    await ledger.save_plan(Plan(id="plan-1", event_id="e1", steps=steps, created=1.0, updated=1.0))
    body = await (await env.client.get("/v1/plans/plan-1")).json()
    assert body["id"] == "plan-1" and body["event_id"] == "e1" and body["state"] == "running"
    assert [(s["action"], s["state"]) for s in body["steps"]] == [
        ("cr-2", "succeeded"),
        ("reset-1", "running"),
        ("gone", None),
    ]
    assert (await env.client.get("/v1/plans/nope")).status == 404


async def test_an_action_the_engine_decides_shows_beside_its_node_at_once(env: Env) -> None:
    assert (await (await env.client.get("/v1/nodes?q=node-1")).json())[0]["action"] is None  # read, kept
    resp = await env.client.post("/v1/nodes/node-1/drain", json={"reason": "flaky nvlink"}, headers=AUTH)
    assert resp.status == 200  # decided, not started: n-drn already uses the drain budget
    await wait_finished(env.coordinator)
    node_1 = (await (await env.client.get("/v1/nodes?q=node-1")).json())[0]
    assert (node_1["action"]["kind"], node_1["action"]["state"]) == ("drain_node", "suppressed")
    assert node_1["action"]["why"].startswith("blast radius: draining node-1")  # the gate's verdict
    assert node_1["state"] == "healthy" and node_1["severity"] == "ok"  # still in service


@pytest.fixture
async def approval_env() -> AsyncIterator[Env]:
    async for e in _env(TOKEN, approval=("drain_node",)):
        yield e


async def test_a_held_action_is_in_flight_until_approved(approval_env: Env) -> None:
    env = approval_env
    resp = await env.client.post("/v1/nodes/node-1/drain", json={"reason": "bad gpu"}, headers=AUTH)
    held = await resp.json()
    assert held["state"] == "awaiting_approval"
    summary = await (await env.client.get("/v1/summary")).json()
    assert [(a["id"], a["state"]) for a in summary["in_flight"]] == [(held["id"], "awaiting_approval")]
    node_1 = (await (await env.client.get("/v1/nodes?problems=1&q=node-1")).json())[0]
    assert node_1["state"] == "acting" and node_1["action"]["state"] == "awaiting_approval"
    # the dashboard's approve button: POST with the token typed into the page, by "dashboard"
    answer = await env.client.post(
        f"/v1/actions/{held['id']}/approve", json={"by": "dashboard"}, headers=AUTH
    )
    assert answer.status == 200
    assert (await answer.json())["detail"]["approved_by"] == "dashboard"
    summary = await (await env.client.get("/v1/summary")).json()
    assert held["id"] not in [a["id"] for a in summary["in_flight"] if a["state"] == "awaiting_approval"]


async def test_the_action_phases_are_served_from_the_executors(env: Env) -> None:
    """GET /v1/action-phases: each kind whose executor has phases, in the engine's order (the
    dashboard reads them there instead of keeping its own copy, which had lost ``restart``)."""
    resp = await env.client.get("/v1/action-phases")
    assert resp.status == 200, await resp.text()
    served = await resp.json()
    executors = env.coordinator.engine.executors
    assert served == {kind: list(p) for kind, executor in executors.items() if (p := phases_of(executor))}
    assert served["checkpoint_restart"] == ["stop", "requeue", "restart", "resume"]
    assert served["gpu_reset"] == ["reset", "verify"] and "notify" not in served
    document = await (await env.client.get("/openapi.json")).json()
    assert "/v1/action-phases" in document["paths"]


_NODE_CHECK = """
const { actionPhase, ranksAcked, actionWhy } = require(process.argv[1]);
const [actions, phases] = JSON.parse(process.argv[2]);
const row = (a) => [actionPhase(a, phases[a.kind]), ranksAcked(a.detail), actionWhy(a)];
console.log(JSON.stringify(actions.map(row)));
"""


def _node_check(actions: list[dict[str, Any]], phases: dict[str, list[str]]) -> Any:
    out = subprocess.run(
        ["node", "-e", _NODE_CHECK, str(WEB_DIR / "app.js"), json.dumps([actions, phases])],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
async def test_the_action_view_says_phase_ranks_and_why(env: Env) -> None:
    phases = await (await env.client.get("/v1/action-phases")).json()  # what the page reads
    saving = {"kind": "checkpoint_restart", "state": "running", "detail": {"ranks": [0, 1, 2, 3]}}
    restarting = {
        "kind": "checkpoint_restart",
        "state": "running",
        "detail": {"phases_done": ["stop", "requeue"], "ranks": [0, 1], "saved": {"0": {}, "1": {}}},
    }
    waiting = {
        "kind": "checkpoint_restart",
        "state": "running",
        "detail": {
            "phases_done": ["stop", "requeue", "restart"],
            "ranks": [0, 1],
            "saved": {"0": {}, "1": {}},
            "waiting": "waiting for the job to train again",
        },
    }
    held = {"kind": "drain_node", "state": "awaiting_approval", "detail": {"policy": "needs approval"}}
    missing = {
        "kind": "checkpoint_restart",
        "state": "escalated",
        "detail": {"ranks": [0, 1], "saved": {"0": {}}, "save_missing": [1], "not_resumed": "ended FAILED"},
    }
    notifying = {"kind": "notify", "state": "running", "detail": {}}  # one step: no phases served
    assert _node_check([saving, restarting, waiting, held, missing, notifying], phases) == [
        ["running: stop (1 of 4)", "0 of 4", ""],
        ["running: restart (3 of 4)", "2 of 2", ""],
        [
            "running: resume (4 of 4) · waiting for the job to train again",
            "2 of 2",
            "waiting for the job to train again",
        ],
        ["awaiting approval", "", "needs approval"],
        ["finished (escalated)", "1 of 2 · missing 1", "ended FAILED"],
        ["running", "", ""],
    ]


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_action_view_renders_whatever_phases_it_is_given() -> None:
    """A plugin's executor with phases of its own: the page knows nothing of them but what it is served."""
    custom = {"kind": "site_reboot", "state": "running", "detail": {"phases_done": ["ask"]}}
    assert _node_check([custom], {"site_reboot": ["ask", "reboot", "check"]}) == [
        ["running: reboot (2 of 3)", "", ""]
    ]


_RESUMED = [
    {"detail": {"resume": {"step": 150, "level": "partner", "path": "/ck", "why": "newest verified"}}},
    {
        "detail": {
            "resume": {"step": None, "why": "no checkpoint verified on every rank can be read"},
            "resume_step": 9,
        }
    },
    {"detail": {"resume_step": 120}},
    {"detail": {}},
]
_RESUMED_TEXT = [
    "step 150 (partner): newest verified",
    "no verified checkpoint: no checkpoint verified on every rank can be read",
    "step 120 (the save's acknowledgements)",
    "",
]


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_dashboard_and_the_cli_say_which_checkpoint_a_restart_resumes_from() -> None:
    """Issue #34: the restart's checkpoint, level and why, in the same words on the page and in
    ``ftd actions show``."""
    from ftd.commands.action_view import resumed_from

    script = (
        "const { resumedFrom } = require(process.argv[1]);"
        "console.log(JSON.stringify(JSON.parse(process.argv[2]).map((a) => resumedFrom(a.detail))));"
    )
    out = subprocess.run(
        ["node", "-e", script, str(WEB_DIR / "app.js"), json.dumps(_RESUMED)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert json.loads(out.stdout) == _RESUMED_TEXT
    assert [resumed_from(a) for a in _RESUMED] == _RESUMED_TEXT
