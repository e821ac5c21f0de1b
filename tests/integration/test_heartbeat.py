"""Trainer heartbeats through a real LocalApi and real ftd.client.Client ranks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from ftd.agent.local_api import LocalApi
from ftd.agent.watchers.heartbeat import HeartbeatWatcher
from ftd.client import Client
from ftd.config import HeartbeatConfig
from ftd.events import Ack, Event, Kind, RankInfo
from tests.unit.helpers import until


@pytest.fixture
def sockdir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="ftdhb", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def api(sockdir: str) -> AsyncIterator[LocalApi]:
    async def on_presence(job: str, ranks: list[RankInfo]) -> None:
        pass

    async def on_ack(ack: Ack) -> None:
        pass

    server = LocalApi(os.path.join(sockdir, "a.sock"), "node1", on_presence, on_ack)
    await server.start()
    yield server
    await server.stop()


class Beater:
    """Calls client.heartbeat(step) every 50 ms while ``on`` (like a training loop)."""

    def __init__(self, client: Client, step: int = 0, stride: int = 1) -> None:
        self.client, self.step, self.stride, self.on = client, step, stride, True
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            if self.on:
                self.step += self.stride
                self.client.heartbeat(self.step)
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await asyncio.to_thread(self.client.close)


def watcher(api: LocalApi, cfg: HeartbeatConfig) -> tuple[HeartbeatWatcher, list[Event]]:
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    return HeartbeatWatcher(cfg, "node1", emit, local_api=api), events


async def test_silent_rank_reported_once_per_episode_and_rearmed_by_a_beat(api: LocalApi) -> None:
    cfg = HeartbeatConfig(timeout_s=0.6, check_interval_s=0.05, straggler_steps=0)
    hb, events = watcher(api, cfg)
    client = Client(job="j1", rank=3, socket_path=api.socket_path, heartbeat_interval=0.05)
    beater = Beater(client)
    task = asyncio.create_task(hb.run())
    try:
        await until(lambda: "j1" in api.jobs())
        await asyncio.sleep(1.0)  # beating: longer than the timeout, nothing reported
        assert events == []
        beater.on = False
        silent_from = time.monotonic()
        await until(lambda: len(events) == 1)
        took = time.monotonic() - silent_from
        assert 0.5 <= took < 0.6 + 1.0  # reported after the deadline, well within a second of it
        lost = events[0]
        assert lost.kind is Kind.RANK_HEARTBEAT_LOST
        assert lost.data["job"] == "j1" and lost.data["rank"] == 3 and lost.data["pid"] == os.getpid()
        assert lost.data["step"] == beater.step and lost.data["silent_s"] >= 0.6
        await asyncio.sleep(0.8)
        assert len(events) == 1  # once per silence, not once per check
        beater.on = True
        await until(lambda: not api.ranks_silent_for(cfg.timeout_s))
        await asyncio.sleep(0.2)
        beater.on = False
        await until(lambda: len(events) == 2)  # a new episode is reported again
    finally:
        task.cancel()
        await beater.close()


async def test_straggler_is_reported_once_and_only_the_one_far_behind(api: LocalApi) -> None:
    cfg = HeartbeatConfig(timeout_s=60, check_interval_s=0.05, straggler_steps=100, straggler_fraction=0.05)
    hb, events = watcher(api, cfg)
    fast = Beater(Client(job="j2", rank=0, socket_path=api.socket_path, heartbeat_interval=0.05), 1000)
    peer = Beater(Client(job="j2", rank=1, socket_path=api.socket_path, heartbeat_interval=0.05), 990)
    slow = Beater(Client(job="j2", rank=2, socket_path=api.socket_path, heartbeat_interval=0.05), 500)
    task = asyncio.create_task(hb.run())
    try:
        await until(lambda: len(api.jobs().get("j2", [])) == 3 and all(r.step for r in api.jobs()["j2"]))
        await until(lambda: len(events) >= 1)
        await asyncio.sleep(0.4)
        assert [e.kind for e in events] == [Kind.RANK_STRAGGLER]
        data = events[0].data
        assert data["rank"] == 2 and data["behind"] >= 100 and data["max_step"] > data["step"]
    finally:
        task.cancel()
        for beater in (fast, peer, slow):
            await beater.close()


async def test_straggler_check_off_with_zero_steps_on_otherwise(api: LocalApi) -> None:
    cfg = HeartbeatConfig(timeout_s=60, straggler_steps=0)
    hb, events = watcher(api, cfg)
    a = Beater(Client(job="j3", rank=0, socket_path=api.socket_path, heartbeat_interval=0.05), 5000)
    b = Beater(Client(job="j3", rank=1, socket_path=api.socket_path, heartbeat_interval=0.05), 0)
    try:
        await until(lambda: len(api.jobs().get("j3", [])) == 2 and all(r.step for r in api.jobs()["j3"]))
        await hb.check()
        assert events == []
        hb.cfg = HeartbeatConfig(timeout_s=60, straggler_steps=100)
        await hb.check()
        assert [e.data["rank"] for e in events] == [1]
    finally:
        await a.close()
        await b.close()
