"""The agent's own metrics, scraped over HTTP from a running agent: exact values from what it did."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import aiohttp

from ftd.agent.watchers.kmsg import _record_lag
from ftd.agent.wiring import build_agent
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import AgentConfig
from ftd.config.schema import AgentMetricsConfig
from tests.realparts import free_port
from tests.unit.helpers import until

XID = "[ 100.000000] NVRM: Xid (PCI:0000:05:00): 79, pid=123, GPU has fallen off the bus.\n"


class Crashy:
    name = "crashy"

    def __init__(self) -> None:
        self.runs = 0

    async def run(self) -> None:
        self.runs += 1
        raise RuntimeError("boom")


def samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


async def test_agent_serves_its_metrics(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("[ 1.0] unrelated line\n" + XID + "[ 2.0] another unrelated line\n")
    port = free_port()
    cfg = AgentConfig(
        node="n1",
        kmsg_path=str(kmsg),
        kmsg_from_start=True,
        state_dir=str(tmp_path / "s"),
        socket_path=str(tmp_path / "a.sock"),
        metrics=AgentMetricsConfig(port=port),
    )
    crashy = Crashy()
    agent = build_agent(cfg, bus=MemoryBus(MemoryBroker(), client_id="agent"), node="n1", watchers=[crashy])
    task = asyncio.create_task(agent.run())
    try:
        # A spare's rank supervisor (ftd run) connects: counted by role and state.
        await until(lambda: Path(cfg.socket_path).exists(), 15)
        _, writer = await asyncio.open_unix_connection(cfg.socket_path)
        info = {"role": "spare", "state": "idle"}
        writer.write(json.dumps({"v": 1, "op": "supervise", "job": "j1", "info": info}).encode() + b"\n")
        got: dict[str, float] = {}
        async with aiohttp.ClientSession() as http, asyncio.timeout(15):
            while True:  # until the three lines are read and the crashing watcher was restarted once
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                        assert resp.status == 200
                        got = samples(await resp.text())
                if (
                    got.get("ftd_agent_kmsg_lines_total") == 3
                    and got.get('ftd_agent_watcher_restarts_total{watcher="crashy"}', 0) >= 1
                    and got.get('ftd_agent_supervisors{role="spare",state="idle"}') == 1
                ):
                    break
                await asyncio.sleep(0.05)
        assert got["ftd_agent_bus_connected"] == 1
        assert got['ftd_agent_events_total{kind="xid"}'] == 1
        assert got['ftd_agent_watcher_up{watcher="kmsg"}'] == 1
        # No coordinator receipts anything here: the Xid event (at least) is still held.
        assert got["ftd_agent_spool_entries"] >= 1 and got["ftd_agent_spool_oldest_age_seconds"] > 0
        assert got["ftd_agent_spool_dropped_total"] == 0
        assert got["ftd_agent_kmsg_lag_seconds"] == 0  # a file, not /dev/kmsg
        assert got["ftd_agent_supervisors_lost_total"] == 0
        assert got["ftd_agent_loop_stalls_total"] == 0 and got["ftd_agent_kmsg_stalls_total"] == 0
        assert got["ftd_agent_loop_stall_longest_seconds"] == 0
        assert got["ftd_agent_watchdog_pings_total"] == 0  # no systemd watchdog asked for here
        writer.close()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    # Closed with the agent: the port is free again.
    async with aiohttp.ClientSession() as http:
        try:
            await http.get(f"http://127.0.0.1:{port}/metrics")
            raise AssertionError("the metrics port is still served after the agent closed")
        except aiohttp.ClientConnectionError:
            pass


def test_record_lag_reads_the_kernel_timestamp() -> None:
    assert _record_lag(b"6,5120,918273645,-;NVRM: Xid ...", 920.0) == 920.0 - 918.273645
    assert _record_lag(b"6,5120,918273645,-;x", 100.0) == 0.0  # never negative
    assert _record_lag(b"garbage without fields", 100.0) == 0.0
