"""Inventory and drift from the agents to the coordinator on a real Mosquitto (issue #36): four real
agents (``build_agent``, NVML through the backend's fake, this machine's own /proc and /etc) and a
real coordinator (``build``) on one broker. The node whose driver differs from its three peers gets
a drift condition naming ``driver``; fixed under its running agent, the condition clears within one
report interval; ``no_spare`` refuses it as a spare while it drifts. A new coordinator with an empty
ledger (a restart that lost it, a new leader) learns every inventory again from its online status."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ftd.agent.watchers.nvml.fake import FakeNvml
from ftd.agent.wiring import build_agent
from ftd.bus.mqtt import MqttBus
from ftd.config import Config
from ftd.config.schema import AgentConfig, ApiConfig, CoordinatorConfig, DriftConfig, InventoryConfig
from ftd.coordinator.wiring import build
from tests.realparts import Mosquitto


async def until(predicate: Callable[[], bool], timeout_s: float) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"not within {timeout_s} s")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def stop(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_drifted_node_is_named_and_cleared_over_the_bus(tmp_path: Path, mosquitto: Mosquitto) -> None:
    config = Config(
        coordinator=CoordinatorConfig(
            ledger_path=str(tmp_path / "ledger.sqlite"),
            api=ApiConfig(enabled=False),
            drift=DriftConfig(action="no_spare", settle_s=0.2),
        )
    )
    coord = build(
        config, bus=MqttBus(host="127.0.0.1", port=mosquitto.port, client_id="coord"), scheduler=None
    )
    nvmls = [FakeNvml(2) for _ in range(4)]
    nvmls[3].driver = "535.104.05"
    run_dir = tempfile.mkdtemp(prefix="ftd-inv-", dir="/tmp")
    agents = []
    for i, nvml in enumerate(nvmls):
        (tmp_path / f"kmsg{i}").touch()
        cfg = AgentConfig(
            node=f"gpu-{i}",
            kmsg_path=str(tmp_path / f"kmsg{i}"),
            state_dir=str(tmp_path / f"agent{i}"),
            socket_path=f"{run_dir}/a{i}.sock",
            inventory=InventoryConfig(interval_s=1.0, ofed_command=""),
        )
        bus = MqttBus(host="127.0.0.1", port=mosquitto.port, client_id=f"agent-{i}")
        agents.append(build_agent(cfg, bus=bus, node=f"gpu-{i}", nvml_backend=nvml))
    tasks = [asyncio.create_task(coord.run()), *(asyncio.create_task(a.run()) for a in agents)]
    book = coord.state.inventory
    try:
        await until(lambda: len(book.inventories) == 4, 30)  # generous: the machine is shared
        await until(lambda: bool(coord.state.nodes.get("gpu-3") and coord.state.nodes["gpu-3"].drift), 30)
        report = book.report("gpu-3")
        assert report is not None and report.fields == ("driver",)
        assert "535.104.05 differs from its h100-sxm peers (3 of 4 run 550.54.15)" in report.summary()
        assert book.blocks_spare("gpu-3") is not None and book.blocks_spare("gpu-0") is None
        assert set(book.drifted()) == {"gpu-3"}
        view = book.view("gpu-0")
        assert view is not None and view["facts"]["kernel"] != "" and view["facts"]["driver"] == "550.54.15"
        nvmls[3].driver = "550.54.15"  # the node upgraded under its running agent
        cleared_s = await until(lambda: not coord.state.nodes["gpu-3"].drift, 30)
        assert book.drifted() == {}
        await stop(tasks[:1])
        await coord.engine.close()
        fresh = Config(
            coordinator=CoordinatorConfig(
                ledger_path=str(tmp_path / "other.sqlite"), api=ApiConfig(enabled=False)
            )
        )
        coord = build(
            fresh, bus=MqttBus(host="127.0.0.1", port=mosquitto.port, client_id="coord2"), scheduler=None
        )
        tasks[0] = asyncio.create_task(coord.run())
        relearned_s = await until(lambda: len(coord.state.inventory.inventories) == 4, 30)
    finally:
        await stop(tasks)
        await coord.engine.close()
    print(f"relearned by a new coordinator in {relearned_s:.2f} s (resend_s: a day)")
    print(f"drift cleared {cleared_s:.2f} s after the fix (report interval 1 s, settle 0.2 s)")
