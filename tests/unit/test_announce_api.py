"""POST /v1/interruptions (issue #37): an operator's announcement becomes an ``interruption`` event
for the rules; bad bodies and bogus deadlines are a 400 that changes nothing."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ftd.plugin import ActionKind
from tests.unit.test_api import AUTH, TOKEN, _env


async def test_a_node_announcement_saves_and_stops_its_jobs_by_the_deadline() -> None:
    async for env in _env(TOKEN, dry_run=True):  # recorded by the gate, not run
        before = time.time()
        resp = await env.client.post(
            "/v1/interruptions", json={"node": "node-1", "in_s": 90, "reason": "kernel update"}, headers=AUTH
        )
        assert resp.status == 202, await resp.text()
        out = await resp.json()
        assert out["node"] == "node-1" and before + 90 <= out["deadline"] <= time.time() + 90
        restarts = [a for a in out["actions"] if a["kind"] == ActionKind.CHECKPOINT_RESTART]
        assert [a["target"] for a in restarts] == ["42"]
        assert restarts[0]["params"]["deadline"] == out["deadline"]
        assert restarts[0]["params"]["source"] == "operator" and restarts[0]["params"]["ref"] == out["ref"]
        assert "kernel update" in restarts[0]["reason"]


async def test_a_job_announcement_with_an_epoch_deadline() -> None:
    async for env in _env(TOKEN, dry_run=True):
        deadline = time.time() + 600
        resp = await env.client.post(
            "/v1/interruptions", json={"job": "42", "deadline": deadline}, headers=AUTH
        )
        assert resp.status == 202, await resp.text()
        out = await resp.json()
        assert (out["job"], out["node"], out["deadline"]) == ("42", "node-1", deadline)
        assert [a["target"] for a in out["actions"] if a["kind"] == ActionKind.CHECKPOINT_RESTART] == ["42"]


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"node": "node-1", "job": "42", "in_s": 90}, "node or job"),
        ({"in_s": 90}, "node or job"),
        ({"node": "node-1"}, "deadline"),
        ({"node": "node-1", "in_s": 90, "deadline": 1e12}, "deadline"),
        ({"node": "node-1", "deadline": 1000.0}, "in the past"),
        ({"node": "node-1", "deadline": 1e13}, "ahead"),
        ({"node": "node-1", "in_s": -5}, ""),
        ({"node": "node-1", "in_s": 90, "colour": "red"}, ""),
    ],
)
async def test_a_bad_announcement_is_refused_and_nothing_happens(body: dict[str, Any], said: str) -> None:
    async for env in _env(TOKEN, dry_run=True):
        resp = await env.client.post("/v1/interruptions", json=body, headers=AUTH)
        assert resp.status == 400
        assert said in (await resp.json())["error"]
        assert await env.coordinator.ledger.actions() == []


async def test_an_unknown_node_or_job_is_a_404() -> None:
    async for env in _env(TOKEN, dry_run=True):
        for body in ({"node": "node-9", "in_s": 90}, {"job": "999", "in_s": 90}):
            resp = await env.client.post("/v1/interruptions", json=body, headers=AUTH)
            assert resp.status == 404
