"""The standby's read-only API (ftd.coordinator.ha.standby_api) over aiohttp's test client: it serves the
same dashboard as the leader behind the same DNS rebinding guard, answers who leads, and refuses
everything else with a 503 naming the leader. The dashboard's "who leads" header (app.js ``haView``)
is checked under node when node is installed.

The ledger factory given to the API raises: none of these requests may open the shared ledger."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from ftd.config import ApiConfig
from ftd.coordinator.api import WEB_DIR
from ftd.coordinator.ha.standby_api import StandbyApi
from ftd.coordinator.ledger.store import LedgerStore
from ftd.coordinator.model.leadership import HaStatus


def _no_ledger() -> LedgerStore:
    raise AssertionError("the standby API opened the ledger for a request that needs none")


def _status() -> HaStatus:
    return HaStatus(
        identity="coord-b", leader="coord-a", leader_epoch=7, lease_age_s=1.5, lease_expires_in_s=3.5
    )


@pytest.fixture
async def standby() -> AsyncIterator[tuple[TestClient[Any, Any], StandbyApi]]:
    api = StandbyApi(ApiConfig(), _status(), _no_ledger)
    client: TestClient[Any, Any] = TestClient(TestServer(api.app))
    await client.start_server()
    try:
        yield client, api
    finally:
        await client.close()


async def test_the_standby_serves_the_leaders_dashboard(
    standby: tuple[TestClient[Any, Any], StandbyApi],
) -> None:
    client, _ = standby
    page = await client.get("/")
    assert page.status == 200 and page.content_type == "text/html"
    assert page.headers["Cache-Control"] == "no-cache"
    assert await page.read() == (WEB_DIR / "index.html").read_bytes()
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        asset = await client.get(f"/static/{name}")
        assert asset.status == 200 and asset.content_type == kind, name
        assert await asset.read() == (WEB_DIR / name).read_bytes()
    assert (await client.get("/static/index.html")).status == 404  # only the listed assets
    assert (await client.get("/static/nope.js")).status == 404


async def test_a_foreign_host_is_refused_on_every_route(
    standby: tuple[TestClient[Any, Any], StandbyApi],
) -> None:
    client, api = standby
    for path in ("/", "/static/app.js", "/v1/ha", "/v1/events", "/healthz"):
        resp = await client.get(path, headers={"Host": "evil.example:8787"})
        assert resp.status == 421, path
        assert "DNS rebinding" in (await resp.json())["error"]
    assert api.counters["wrong_host"] == 5
    resp = await client.get("/v1/ha", headers={"Host": "localhost:8787"})
    assert resp.status == 200


async def test_allowed_hosts_apply_to_the_standby_too() -> None:
    api = StandbyApi(ApiConfig(allowed_hosts=["ftd.example.org"]), _status(), _no_ledger)
    async with TestClient(TestServer(api.app)) as client:
        assert (await client.get("/", headers={"Host": "ftd.example.org:8787"})).status == 200
        assert (await client.get("/", headers={"Host": "other.example.org"})).status == 421


async def test_mutating_and_leader_only_calls_answer_503_naming_the_leader(
    standby: tuple[TestClient[Any, Any], StandbyApi],
) -> None:
    client, _ = standby
    calls = [
        ("POST", "/v1/nodes/node-7/drain", {"reason": "x"}),
        ("POST", "/v1/nodes/node-7/resume", {}),
        ("POST", "/v1/jobs/42/restart", {"reason": "x"}),
        ("POST", "/v1/actions/act-1/approve", {}),
        ("POST", "/v1/actions/act-1/reject", {}),
        ("GET", "/v1/nodes", None),
        ("GET", "/v1/jobs", None),
        ("GET", "/v1/sim/goodput", None),
        ("POST", "/healthz", None),
    ]
    for method, path, body in calls:
        resp = await client.request(method, path, json=body)
        assert resp.status == 503, (method, path)
        data = await resp.json()
        assert (data["leader"], data["epoch"]) == ("coord-a", 7), (method, path)
        assert "standby" in data["error"] and "coord-a" in data["error"]


async def test_without_a_leader_the_503_says_so() -> None:
    api = StandbyApi(ApiConfig(), HaStatus(identity="coord-b"), _no_ledger)
    async with TestClient(TestServer(api.app)) as client:
        resp = await client.post("/v1/nodes/node-7/drain", json={"reason": "x"})
        data = await resp.json()
    assert resp.status == 503 and data["leader"] is None
    assert "none holds the lease" in data["error"]


async def test_ha_document_and_health_name_the_leader(
    standby: tuple[TestClient[Any, Any], StandbyApi],
) -> None:
    client, _ = standby
    ha = await (await client.get("/v1/ha")).json()
    assert ha == {
        "ledger": "postgresql",
        "identity": "coord-b",
        "role": "standby",
        "epoch": None,
        "leader": "coord-a",
        "leader_epoch": 7,
        "lease_age_s": 1.5,
        "lease_expires_in_s": 3.5,
        "terms": 0,
        "database_ok": True,
    }
    health = await (await client.get("/healthz")).json()
    assert (health["status"], health["leader"], health["epoch"]) == ("standby", "coord-a", 7)


_NODE_CHECK = """
const { haView, servedByLeader } = require(process.argv[1]);
const docs = JSON.parse(process.argv[2]);
console.log(JSON.stringify(docs.map((d) => { const v = haView(d); return [v, servedByLeader(v)]; })));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_dashboard_header_shows_who_leads_on_every_role() -> None:
    standby = {"ledger": "postgresql", **_status().as_dict()}
    leader = {**standby, "identity": "coord-a", "role": "leader", "epoch": 7}
    single = {"role": "single", "ledger": "sqlite", "leader": None, "epoch": None}
    leaderless = {**standby, "leader": None, "leader_epoch": 0, "lease_age_s": None, "database_ok": False}
    docs = [standby, leader, single, leaderless, None]
    out = subprocess.run(
        ["node", "-e", _NODE_CHECK, str(WEB_DIR / "app.js"), json.dumps(docs)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    (on_standby, note), (on_leader, _), (on_single, _), (no_leader, _), (unknown, _) = json.loads(out.stdout)
    assert on_standby["standby"] is True and on_standby["cls"] == "warning"
    assert on_standby["banner"] == "read-only standby — leader is coord-a (epoch 7)"
    assert "leader: coord-a" in on_standby["badge"] and "epoch 7" in on_standby["badge"]
    assert "renewed 1.5 s ago" in on_standby["badge"]  # the lease age
    assert note == "served by the leader (coord-a): open its dashboard"
    assert on_leader["standby"] is False and on_leader["banner"] is None
    assert on_leader["badge"].startswith("leader: coord-a (this replica) · epoch 7")
    assert on_single["badge"].startswith("single coordinator") and on_single["banner"] is None
    assert no_leader["standby"] is True and "no coordinator holds the lease" in no_leader["banner"]
    assert "database is unreachable" in no_leader["banner"]
    assert unknown["badge"] is None and unknown["banner"] is None
