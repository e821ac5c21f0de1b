"""Where inventories and drift are shown (issue #36): the API (``/v1/drift``, ``/v1/inventory``,
``/v1/nodes/{node}/inventory``, ``drift`` in ``/v1/nodes``) over a real coordinator, ``ftd status
--node``'s INVENTORY section from what the API answers, and the dashboard's drift table (app.js in node)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from ftd.commands.status import _conditions, render_inventory
from ftd.events import Kind, make_event
from ftd.platform.inventory import Inventory, known, unknown
from tests.unit.test_api import AUTH, TOKEN, Env, _env
from tests.unit.test_dashboard_text import run


def inventory(driver: str = "550.54.15") -> Inventory:
    return Inventory(
        profile=known("h100-sxm"),
        driver=known(driver),
        cuda=known("12.4"),
        vbios=known("96.00.89.00.01"),
        nic_firmware=unknown("no RDMA device: /sys/class/infiniband does not exist"),
        kernel=known("5.15.0-91-generic"),
        os=known("Ubuntu 22.04.3 LTS"),
    )


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async for e in _env(TOKEN):
        state = e.coordinator.state
        for i in range(16):
            inv = inventory("535.104.05") if i == 5 else inventory()
            node = "node-1" if i == 0 else f"gpu-{i:02d}"
            state.apply_event(
                make_event(node, Kind.INVENTORY, severity="info", data=inv.to_data(), ts=5000.0)
            )
        yield e


async def get(env: Env, path: str) -> Any:
    response = await env.client.get(path, headers=AUTH)
    assert response.status == 200, await response.text()
    return await response.json()


async def test_drift_inventory_and_the_node_row(env: Env) -> None:
    drift = await get(env, "/v1/drift")
    assert drift["action"] == "warn" and drift["reported"] == 16 and drift["unchecked"] == 0
    assert [(n["node"], n["fields"]) for n in drift["nodes"]] == [("gpu-05", ["driver"])]
    one = await get(env, "/v1/nodes/gpu-05/inventory")
    assert one["facts"]["driver"] == "535.104.05"
    assert one["facts"]["nic_firmware"] == "unknown (no RDMA device: /sys/class/infiniband does not exist)"
    assert one["unknown"]["ofed"] == "not reported"
    assert one["drift"]["reasons"] == [
        "driver: 535.104.05 differs from its h100-sxm peers (15 of 16 run 550.54.15)"
    ]
    every = await get(env, "/v1/inventory")
    assert len(every["nodes"]) == 16 and every["nodes"]["gpu-06"]["drift"]["fields"] == []
    rows = {n["name"]: n for n in await get(env, "/v1/nodes")}
    assert rows["node-1"]["drift"] == [] and "node-2" in rows  # a node without an inventory: no drift
    missing = await env.client.get("/v1/nodes/node-2/inventory", headers=AUTH)
    assert missing.status == 404


async def test_status_node_renders_what_the_api_answers(env: Env) -> None:
    text = render_inventory("gpu-05", await get(env, "/v1/nodes/gpu-05/inventory"))
    assert "INVENTORY OF gpu-05" in text and "535.104.05" in text
    assert "unknown (no RDMA device" in text
    assert "DRIFT (action warn): driver: 535.104.05 differs" in text
    assert "DRIFT: none" in render_inventory("gpu-06", await get(env, "/v1/nodes/gpu-06/inventory"))
    assert "none reported" in render_inventory("node-2", None)
    rows = {n["name"]: n for n in await get(env, "/v1/nodes")}
    assert _conditions(rows["gpu-05"]) == "version drift: driver"  # the overview's conditions column
    assert _conditions(rows["gpu-06"]) == "-"


async def test_the_dashboard_lists_drifted_nodes_and_what_was_not_checked(env: Env) -> None:
    drift = await get(env, "/v1/drift")
    drift["unchecked"] = 2
    view = run("app.driftView(a[0])", drift)
    assert view["rows"][0][:3] == ["gpu-05", "driver", drift["nodes"][0]["reasons"][0]]
    assert (
        view["summary"]
        == "1 of 16 reporting nodes drift · action: warn · 2 not checked (no hardware profile)"
    )


async def test_metrics_count_drifted_nodes_per_field(env: Env) -> None:
    text = await (await env.client.get("/metrics", headers=AUTH)).text()
    assert 'ftd_nodes_drifted{field="driver"} 1.0' in text
    assert "ftd_nodes_drift_unchecked 0.0" in text
