"""The API shows what reconciliation found: others' drains as ``unavailable``, ftd's as ``drained``.

A real Coordinator (MemoryBus, FakeScheduler, in-memory ledger) and the aiohttp test client, in the
style of ``test_api.py``; one reconciliation round is run by hand.
"""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import ApiConfig, Config, CoordinatorConfig
from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.coordinator.api import Api
from ftd.coordinator.ledger.sqlite import Ledger
from ftd.coordinator.wiring import build
from ftd.events import NodeStatus


async def test_nodes_and_metrics_show_unavailable_and_drained() -> None:
    scheduler = FakeScheduler()
    for node in ("node-1", "node-2", "node-3"):
        scheduler.add_node(node)
    config = Config(coordinator=CoordinatorConfig(ledger_path=":memory:", scheduler="slurm"))
    bus = MemoryBus(MemoryBroker())
    coordinator = build(config, bus=bus, scheduler=scheduler, ledger=Ledger(":memory:"))
    coordinator.state.apply_status(NodeStatus(node="node-1", state="online", ts=1.0))
    scheduler.operator_drain("node-2", "maintenance")  # someone else's
    await scheduler.drain("node-3", "xid 79")  # ftd's, from before the ledger knew (adopted)
    changes = await coordinator.reconciler.reconcile()
    assert changes == {"external_drain": ["node-2"], "ftd_drain_adopted": ["node-3"]}

    client: TestClient[Any, Any] = TestClient(TestServer(Api(coordinator, ApiConfig(), token=None).app))
    await client.start_server()
    try:
        nodes = {n["name"]: n for n in await (await client.get("/v1/nodes")).json()}
        assert (nodes["node-1"]["drained"], nodes["node-1"]["unavailable"]) == (False, None)
        assert nodes["node-2"]["unavailable"] == "IDLE+DRAIN: maintenance"
        assert nodes["node-2"]["drained"] is False
        assert (nodes["node-3"]["drained"], nodes["node-3"]["drain_reason"]) == (True, "ftd: xid 79")
        assert nodes["node-3"]["unavailable"] is None
        metrics = (await (await client.get("/metrics")).text()).splitlines()
        assert 'ftd_nodes{state="unavailable"} 1.0' in metrics
        assert 'ftd_nodes{state="drained"} 1.0' in metrics
    finally:
        await client.close()
        await coordinator.engine.close()
