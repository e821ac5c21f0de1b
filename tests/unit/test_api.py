"""The coordinator's HTTP API over a real Coordinator (MemoryBus, FakeScheduler, in-memory ledger).

Auth (no token configured, missing, wrong, right), the shape of every endpoint, manual actions going
through the policy gate and the ledger, validation errors, and the OpenAPI document covering every
route the application serves.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import ApiConfig, Config, CoordinatorConfig, PolicyConfig
from ftd.config.schema import HardwareConfig, NodeLabelsConfig
from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.coordinator.api import ROUTES, Api, openapi_document, resolve_token
from ftd.coordinator.daemon import Coordinator
from ftd.coordinator.ledger.sqlite import Ledger
from ftd.coordinator.wiring import build
from ftd.events import JobPresence, Kind, NodeStatus, RankInfo, Severity, make_event
from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Env:
    client: TestClient[Any, Any]
    coordinator: Coordinator
    scheduler: FakeScheduler
    api: Api


def make_coordinator(
    scheduler: FakeScheduler | None = None,
    *,
    dry_run: bool = False,
    approval: tuple[str, ...] = (),
    node_labels: list[NodeLabelsConfig] | None = None,
    hardware_profile: str = "",
) -> Coordinator:
    policy = PolicyConfig(dry_run=dry_run, approval_required_kinds=list(approval))
    coordinator = CoordinatorConfig(
        ledger_path=":memory:", scheduler="slurm", policy=policy, node_labels=node_labels or []
    )
    config = Config(coordinator=coordinator, hardware=HardwareConfig(profile=hardware_profile))
    return build(config, bus=MemoryBus(MemoryBroker()), scheduler=scheduler, ledger=Ledger(":memory:"))


async def populate(coordinator: Coordinator) -> None:
    state = coordinator.state
    state.apply_status(NodeStatus(node="node-1", state="online", ts=1000.0))
    state.apply_status(NodeStatus(node="node-2", state="online", ts=1000.0))
    state.apply_status(NodeStatus(node="node-2", state="offline", ts=1001.0))
    state.apply_presence(
        "node-1",
        "42",
        JobPresence(job="42", node="node-1", ranks=[RankInfo(rank=0, step=7), RankInfo(rank=1)]),
    )
    await coordinator.ledger.record_event(
        make_event("node-1", Kind.XID, severity=Severity.CRITICAL, data={"code": 79}, ts=1002.0, id="e1")
    )
    await coordinator.ledger.record_event(make_event("node-2", Kind.ECC, data={"dbe": 1}, ts=1003.0, id="e2"))


async def _env(
    token: str | None,
    *,
    dry_run: bool = False,
    approval: tuple[str, ...] = (),
    node_labels: list[NodeLabelsConfig] | None = None,
) -> AsyncIterator[Env]:
    scheduler = FakeScheduler()
    scheduler.add_node("node-1")
    scheduler.add_node("node-2")
    scheduler.add_job("42", ["node-1"])
    coordinator = make_coordinator(scheduler, dry_run=dry_run, approval=approval, node_labels=node_labels)
    await populate(coordinator)
    await coordinator.bus.start()  # directives (checkpoint_restart) are published on it
    api = Api(coordinator, ApiConfig(), token=token)
    client: TestClient[Any, Any] = TestClient(TestServer(api.app))
    await client.start_server()
    try:
        yield Env(client, coordinator, scheduler, api)
    finally:
        await client.close()
        await coordinator.engine.close()
        await coordinator.bus.stop()


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async for e in _env(TOKEN):
        yield e


@pytest.fixture
async def approval_env() -> AsyncIterator[Env]:
    """Drains need a human: they wait in the approval queue."""
    async for e in _env(TOKEN, approval=("drain_node",)):
        yield e


@pytest.fixture
async def open_env() -> AsyncIterator[Env]:
    async for e in _env(None):
        yield e


# --- auth ---------------------------------------------------------------------------------------

MUTATING = [
    ("/v1/nodes/node-1/drain", {"reason": "bad gpu"}),
    ("/v1/nodes/node-1/resume", {}),
    ("/v1/nodes/node-1/burn-in", {}),
    ("/v1/jobs/42/restart", {"reason": "move it"}),
    ("/v1/interruptions", {"node": "node-1", "in_s": 90}),
    ("/v1/actions/act-x/approve", {}),
    ("/v1/actions/act-x/reject", {"reason": "no"}),
    ("/v1/fabric/bisect", {"suspects": ["node-1"]}),
]


@pytest.mark.parametrize(("path", "body"), MUTATING)
async def test_without_a_configured_token_mutating_calls_are_refused(
    open_env: Env, path: str, body: dict[str, Any]
) -> None:
    for headers in ({}, AUTH, {"Authorization": "Bearer "}):
        resp = await open_env.client.post(path, json=body, headers=headers)
        assert resp.status == 403
        assert "no token is configured" in (await resp.json())["error"]
    assert open_env.scheduler.calls == []
    assert await open_env.coordinator.ledger.actions() == []


@pytest.mark.parametrize(("path", "body"), MUTATING)
async def test_missing_or_wrong_token_is_401(env: Env, path: str, body: dict[str, Any]) -> None:
    for headers, why in (
        ({}, "missing"),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, "missing"),
        ({"Authorization": "Bearer nope"}, "wrong"),
        ({"Authorization": f"Bearer {TOKEN}x"}, "wrong"),
    ):
        resp = await env.client.post(path, json=body, headers=headers)
        assert resp.status == 401, headers
        assert why in (await resp.json())["error"]
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert env.scheduler.calls == []
    assert await env.coordinator.ledger.actions() == []


async def test_reads_need_no_token(open_env: Env) -> None:
    for path in ("/healthz", "/v1/nodes", "/v1/gpus", "/v1/jobs", "/v1/events", "/v1/actions", "/metrics"):
        assert (await open_env.client.get(path)).status == 200, path


def test_token_file_is_read_relative_to_the_credentials_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "api-token").write_text("abc\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert resolve_token(ApiConfig(token_file="api-token")) == "abc"
    assert resolve_token(ApiConfig()) is None
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        resolve_token(ApiConfig(token_file="empty"))
    with pytest.raises(ValueError, match="cannot read"):
        resolve_token(ApiConfig(token_file="missing"))


# --- shapes -------------------------------------------------------------------------------------


async def test_healthz(env: Env) -> None:
    body = await (await env.client.get("/healthz")).json()
    assert body["status"] == "ok" and body["bus_connected"] is True and body["actions_in_progress"] == 0


async def test_nodes_jobs_gpus(env: Env) -> None:
    nodes = await (await env.client.get("/v1/nodes")).json()
    assert [(n["name"], n["online"], n["drained"], n["jobs"]) for n in nodes] == [
        ("node-1", True, False, ["42"]),
        ("node-2", False, False, []),
    ]
    jobs = await (await env.client.get("/v1/jobs")).json()
    assert jobs == [
        {
            "id": "42",
            "nodes": ["node-1"],
            "ranks": [0, 1],
            "last_step": 7,
            "ranks_by_node": {"node-1": [0, 1]},
            "allocations": {},
            "state": "training",
            "action": None,
            "supervisors": {},
            "spares": [],
            "slots": [],
            "generation": None,
            "checkpoints": {},
            "quarantined": {},
            "moved": None,
            "save_times": {},
        }
    ]
    assert await (await env.client.get("/v1/gpus")).json() == []


async def test_gpus_are_listed_when_the_state_tracks_them(env: Env) -> None:
    @dataclass
    class Gpu:
        uuid: str
        node: str

    env.coordinator.state.gpus = {"GPU-1": Gpu("GPU-1", "node-1")}  # type: ignore[attr-defined]
    assert await (await env.client.get("/v1/gpus")).json() == [{"uuid": "GPU-1", "node": "node-1"}]


async def test_events_newest_first_with_limit_and_node(env: Env) -> None:
    events = await (await env.client.get("/v1/events")).json()
    assert [e["id"] for e in events] == ["e2", "e1"]
    assert events[1]["kind"] == "xid" and events[1]["data"] == {"code": 79}
    assert [e["id"] for e in await (await env.client.get("/v1/events?limit=1")).json()] == ["e2"]
    assert [e["id"] for e in await (await env.client.get("/v1/events?node=node-1")).json()] == ["e1"]


@pytest.mark.parametrize(
    ("query", "needle"),
    [
        ("limit=0", "limit"),
        ("limit=100000", "limit"),
        ("limit=abc", "limit"),
        ("node=bad%20name", "node"),
        ("nope=1", "nope"),
        ("limit=1&limit=2", "limit"),
    ],
)
async def test_bad_queries_are_400_with_the_field_named(env: Env, query: str, needle: str) -> None:
    resp = await env.client.get(f"/v1/events?{query}")
    assert resp.status == 400
    assert needle in (await resp.json())["error"]


async def test_unknown_ids_are_404(env: Env) -> None:
    for method, path, body in (
        ("GET", "/v1/actions/act-nope", None),
        ("POST", "/v1/nodes/node-9/drain", {"reason": "x"}),
        ("POST", "/v1/nodes/node-9/resume", {}),
        ("POST", "/v1/jobs/999/restart", {"reason": "x"}),
        ("POST", "/v1/actions/act-nope/approve", {}),
        ("GET", "/v1/nothing", None),
        ("GET", "/static/../api.py", None),
        ("GET", "/static/api.py", None),
    ):
        resp = await env.client.request(method, path, json=body, headers=AUTH)
        assert resp.status == 404, path
        assert "error" in await resp.json()


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[]",
        b'{"reason": ""}',
        b'{"reason": 5}',
        b'{"reason": "line\\nbreak"}',
        b'{"reason": "ok", "extra": 1}',
        b'{"reason": "ok", "by": "two words"}',
    ],
)
async def test_bad_bodies_are_400(env: Env, body: bytes) -> None:
    resp = await env.client.post("/v1/nodes/node-1/drain", data=body, headers=AUTH)
    assert resp.status == 400
    assert (await resp.json())["error"].startswith("request body")
    assert env.scheduler.calls == []


async def test_wrong_method_is_a_json_405(env: Env) -> None:
    resp = await env.client.delete("/v1/nodes")
    assert resp.status == 405 and "GET" in resp.headers["Allow"]
    assert "error" in await resp.json()


# --- manual actions go through the gate and the ledger -------------------------------------------


async def wait_finished(coordinator: Coordinator) -> None:
    assert await coordinator.engine.wait_idle(5)


async def test_manual_drain_runs_through_the_gate_and_the_ledger(env: Env) -> None:
    resp = await env.client.post(
        "/v1/nodes/node-1/drain", json={"reason": "flaky nvlink", "by": "alice"}, headers=AUTH
    )
    assert resp.status == 202
    action = await resp.json()
    assert action["kind"] == "drain_node" and action["target"] == "node-1"
    assert action["rule"] == "api:alice" and action["state"] in ("pending", "running")
    await wait_finished(env.coordinator)

    assert env.scheduler.calls == [("drain", ("node-1", "ftd: flaky nvlink"))]
    got = await (await env.client.get(f"/v1/actions/{action['id']}")).json()
    assert got["state"] == "succeeded" and got["detail"]["reason"] == "ftd: flaky nvlink"
    nodes = {n["name"]: n for n in await (await env.client.get("/v1/nodes")).json()}
    assert nodes["node-1"]["drained"] is True and nodes["node-1"]["drain_reason"] == "ftd: flaky nvlink"

    # A second drain is stopped by the gate's cooldown and recorded as suppressed, with the reason.
    again = await env.client.post("/v1/nodes/node-1/drain", json={"reason": "again"}, headers=AUTH)
    assert again.status == 200
    suppressed = await again.json()
    assert suppressed["state"] == "suppressed" and "cooldown" in suppressed["detail"]["policy"]
    assert len(env.scheduler.calls) == 1
    listed = await (await env.client.get("/v1/actions")).json()
    assert [(a["id"], a["state"]) for a in listed] == [
        (suppressed["id"], "suppressed"),
        (action["id"], "succeeded"),
    ]
    assert (await (await env.client.get("/v1/actions?limit=1")).json())[0]["id"] == suppressed["id"]

    # Resume is a separate key (resume_node:node-1): allowed, and it undoes ftd's own drain.
    resumed = await env.client.post("/v1/nodes/node-1/resume", json={"by": "alice"}, headers=AUTH)
    assert resumed.status == 202
    await wait_finished(env.coordinator)
    assert env.scheduler.calls[-1] == ("resume", ("node-1",))
    assert not env.scheduler.nodes["node-1"].drained


async def test_a_manual_burn_in_is_an_action_through_the_gate(env: Env) -> None:
    """Issue #36: POST /v1/nodes/{node}/burn-in submits the burn_in action (its agent runs it)."""
    resp = await env.client.post("/v1/nodes/node-1/burn-in", json={"by": "alice"}, headers=AUTH)
    assert resp.status in (200, 202)
    action = await resp.json()
    assert action["kind"] == "burn_in" and action["target"] == "node-1"
    assert action["rule"] == "api:alice" and action["reason"] == "manual burn-in"


async def test_dry_run_gate_records_but_does_not_drain() -> None:
    async for env in _env(TOKEN, dry_run=True):
        resp = await env.client.post("/v1/nodes/node-1/drain", json={"reason": "x"}, headers=AUTH)
        assert resp.status == 200
        assert (await resp.json())["state"] == "dry_run"
        assert env.scheduler.calls == []


async def test_manual_restart_goes_through_checkpoint_restart(env: Env) -> None:
    # Answer the save directive as a trainer would, and leave when told to stop.
    coordinator = env.coordinator

    async def trainer() -> None:
        from ftd.events import Ack

        while True:
            for record in await coordinator.ledger.unfinished():
                if record.request.kind == "checkpoint_restart" and record.state == ActionState.RUNNING:
                    for rank in (0, 1):
                        coordinator.acks.record(
                            Ack(directive_id=f"{record.id}-save", job="42", rank=rank, node="node-1", step=7)
                        )
                    await asyncio.sleep(0.05)
                    coordinator.state.apply_presence("node-1", "42", None)
                    return
            await asyncio.sleep(0.01)

    helper = asyncio.create_task(trainer())
    resp = await env.client.post(
        "/v1/jobs/42/restart", json={"reason": "move it", "exclude": ["node-1", "node-1"]}, headers=AUTH
    )
    assert resp.status == 202
    action = await resp.json()
    assert action["params"] == {"exclude": ["node-1"]} and action["rule"] == "api:operator"
    await asyncio.wait_for(helper, 5)
    await wait_finished(coordinator)
    got = await (await env.client.get(f"/v1/actions/{action['id']}")).json()
    assert got["state"] == "succeeded", got
    assert got["detail"]["save_step"] == 7
    assert ("requeue", ("42", ("node-1",))) in env.scheduler.calls
    assert env.scheduler.jobs["42"].restarts == 1


# --- approvals ----------------------------------------------------------------------------------


async def test_drain_waits_for_approval_reject_closes_it_approve_runs_it(approval_env: Env) -> None:
    client, scheduler = approval_env.client, approval_env.scheduler

    async def drain(node: str) -> dict[str, Any]:
        resp = await client.post(f"/v1/nodes/{node}/drain", json={"reason": "flaky gpu"}, headers=AUTH)
        held: dict[str, Any] = await resp.json()
        assert resp.status == 200 and held["state"] == "awaiting_approval", held
        return held

    first = await drain("node-2")
    resp = await client.post(f"/v1/actions/{first['id']}/reject", json={"reason": "not now"}, headers=AUTH)
    closed = await resp.json()
    assert resp.status == 200 and closed["state"] == "suppressed"
    assert "not now" in closed["detail"]["policy"]

    second = await drain("node-1")
    assert scheduler.calls == []  # nothing happens before a human says so
    resp = await client.post(f"/v1/actions/{second['id']}/approve", json={"by": "alice"}, headers=AUTH)
    assert resp.status == 200
    await wait_finished(approval_env.coordinator)
    done = await (await client.get(f"/v1/actions/{second['id']}")).json()
    assert done["state"] == "succeeded" and done["detail"]["approved_by"] == "alice"
    assert [args for op, args in scheduler.calls if op == "drain"] == [("node-1", "ftd: flaky gpu")]

    assert done["detail"]["approved_at"] > 0
    rejected = await (await client.get(f"/v1/actions/{first['id']}")).json()
    assert rejected["detail"]["rejected_by"] == "operator" and rejected["detail"]["rejected_at"] > 0

    # Only held actions can be decided: the answer says what the action is instead (issue #32: it
    # was a 404 "not awaiting approval" for an action that had succeeded).
    said = {
        first["id"]: "it was already suppressed (rejected, or held back by the policy gate)",
        second["id"]: "it already succeeded",
    }
    for action_id, state in said.items():
        for verb in ("approve", "reject"):
            resp = await client.post(f"/v1/actions/{action_id}/{verb}", headers=AUTH)
            error = (await resp.json())["error"]
            assert resp.status == 409 and error == f"{action_id} is not awaiting approval: {state}", error
    resp = await client.post("/v1/actions/act-none/approve", headers=AUTH)
    assert resp.status == 404  # an unknown id is still unknown


# --- metrics, dashboard, OpenAPI ----------------------------------------------------------------


async def test_metrics_are_prometheus_text(env: Env) -> None:
    await env.coordinator.engine.handle_event(make_event("node-1", Kind.ECC, id="m1"))
    await env.coordinator.engine.handle_event(make_event("node-1", Kind.ECC, id="m1"))  # duplicate
    env.coordinator.bad_messages = 3
    await env.client.post("/v1/nodes/node-1/drain", json={"reason": "x"}, headers=AUTH)
    await wait_finished(env.coordinator)
    resp = await env.client.get("/metrics")
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
    text = await resp.text()
    lines = set(text.splitlines())
    assert "ftd_events_received_total 1.0" in lines
    assert "ftd_events_duplicate_total 1.0" in lines
    assert "ftd_bad_messages_total 3.0" in lines
    assert 'ftd_actions_finished_total{kind="drain_node",state="succeeded"} 1.0' in lines
    assert 'ftd_nodes{state="online"} 0.0' in lines  # exclusive: the drained node counts once
    assert 'ftd_nodes{state="drained"} 1.0' in lines
    assert "ftd_decision_latency_seconds_count 1.0" in lines


async def test_dashboard_and_its_assets_are_served_locally(env: Env) -> None:
    page = await env.client.get("/")
    assert page.status == 200 and page.content_type == "text/html"
    html = await page.text()
    assert "/static/app.js" in html and "http://" not in html and "https://" not in html
    js = await env.client.get("/static/app.js")
    assert js.status == 200 and "javascript" in js.content_type
    assert "/v1/nodes" in await js.text()
    assert (await env.client.get("/static/style.css")).status == 200


async def test_openapi_documents_every_route(env: Env) -> None:
    served = await (await env.client.get("/openapi.json")).json()
    assert served == openapi_document() and served["openapi"].startswith("3.")
    routes = {
        (r.method, r.resource.canonical)
        for r in env.api.app.router.routes()
        if r.method != "HEAD" and r.resource is not None
    }
    documented = {(m.upper(), path) for path, ops in served["paths"].items() for m in ops}
    assert routes == documented
    assert len(routes) == len(ROUTES)
    for path, ops in served["paths"].items():
        for method, op in ops.items():
            if method == "post":
                assert op["security"] == [{"bearer": []}], path
                assert {"401", "403"} <= set(op["responses"]), path


async def test_a_drain_for_repair_links_its_diagnostic_bundle(env: Env) -> None:
    """Issue #36 item 5: the drain's own view (GET /v1/actions/{drain}) carries the bundle of the
    rma_bundle action asked for it; another drain shows none."""
    resp = await env.client.post("/v1/nodes/node-1/drain", json={"reason": "bad gpu"}, headers=AUTH)
    drain = await resp.json()
    other = await (await env.client.post("/v1/nodes/node-2/drain", json={"reason": "x"}, headers=AUTH)).json()
    await wait_finished(env.coordinator)
    bundle = ActionRecord(
        id="act-bundle-1",
        request=ActionRequest(
            kind="rma_bundle", target="node-1", reason="r", params={"drain_action": drain["id"]}
        ),
        state=ActionState.SUCCEEDED,
        detail={"drain_action": drain["id"], "bundle": "/var/lib/ftd/rma/node-1-x.tar.gz"},
        created=drain["created"] + 1.0,
        updated=drain["created"] + 1.0,
    )
    await env.coordinator.ledger.save_action(bundle)
    got = await (await env.client.get(f"/v1/actions/{drain['id']}")).json()
    assert got["detail"]["rma_bundle"] == {
        "action": "act-bundle-1",
        "state": "succeeded",
        "bundle": "/var/lib/ftd/rma/node-1-x.tar.gz",
    }
    plain = await (await env.client.get(f"/v1/actions/{other['id']}")).json()
    assert "rma_bundle" not in plain["detail"]
