"""The agent supervises its watchers: a crash or a stall is reported and the watcher restarted."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from pathlib import Path

import pytest

from ftd.agent.wiring import build_agent
from ftd.bus import topics
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import AgentConfig
from ftd.events import Event, Kind, decode


class Crashy:
    name = "crashy"

    def __init__(self) -> None:
        self.runs = 0

    async def run(self) -> None:
        self.runs += 1
        await asyncio.sleep(0.01)
        raise RuntimeError(f"boom {self.runs}")


class Stalls:
    name = "stalls"

    def __init__(self) -> None:
        self.runs = 0
        self.last_progress = time.monotonic()

    async def run(self) -> None:
        self.runs += 1
        self.last_progress = time.monotonic()
        await asyncio.sleep(3600)  # never progresses again


def config(tmp_path: Path) -> AgentConfig:
    (tmp_path / "kmsg").touch()
    return AgentConfig(
        node="n1",
        kmsg_path=str(tmp_path / "kmsg"),
        state_dir=str(tmp_path / "s"),
        socket_path=str(tmp_path / "a.sock"),
    )


async def test_crashing_and_stalled_watchers_are_reported_and_restarted_agent_keeps_running(
    tmp_path: Path,
) -> None:
    broker = MemoryBroker()
    sub = MemoryBus(broker, client_id="sub")
    await sub.subscribe(topics.node_event("n1", "agent_health"))
    await sub.start()
    crashy, stalls = Crashy(), Stalls()
    agent = build_agent(
        config(tmp_path),
        bus=MemoryBus(broker, client_id="agent"),
        node="n1",
        watchers=[crashy, stalls],
        stall_s=0.3,
        health_interval_s=0.05,
    )
    task = asyncio.create_task(agent.run())
    reports: list[Event] = []
    try:
        async with asyncio.timeout(10):
            async for message in sub.messages():
                reports.append(decode(message.payload, Event))
                names = {e.data.get("watcher") for e in reports}
                if {"crashy", "stalls"} <= names and crashy.runs >= 3 and stalls.runs >= 2:
                    break
        assert all(e.kind is Kind.AGENT_HEALTH and e.data["problem"] == "watcher_restart" for e in reports)
        crash = next(e for e in reports if e.data["watcher"] == "crashy")
        assert "RuntimeError: boom" in crash.data["reason"]
        stall = next(e for e in reports if e.data["watcher"] == "stalls")
        assert "stalled" in stall.data["reason"]
        backoffs = [e.data["backoff_s"] for e in reports if e.data["watcher"] == "crashy"]
        assert backoffs == sorted(backoffs) and backoffs[0] < backoffs[-1]  # exponential backoff
        assert not task.done()  # the agent itself kept running
        assert agent.healthy()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_watchdog_pings_only_while_healthy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "notify.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    server.setblocking(False)
    messages: list[bytes] = []

    async def drain() -> None:  # like systemd: read every datagram as it comes
        loop = asyncio.get_running_loop()
        while True:
            messages.append(await loop.sock_recv(server, 100))

    reader = asyncio.create_task(drain())
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "100000")  # ping every 50 ms
    agent = build_agent(config(tmp_path), bus=MemoryBus(MemoryBroker()), node="n1", health_interval_s=0.02)
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.sleep(0.5)
        assert b"READY=1" in messages and messages.count(b"WATCHDOG=1") >= 3
        agent._core[1].cancel()  # a core task dies: no more pings (systemd would restart us)
        await asyncio.sleep(0.05)
        assert not agent.healthy()
        before = messages.count(b"WATCHDOG=1")
        await asyncio.sleep(0.3)
        assert messages.count(b"WATCHDOG=1") == before
    finally:
        task.cancel()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        server.close()
