"""A real read-only filesystem under a real agent (issue #23): a trainer registers its checkpoint
directory on a tmpfs, the tmpfs is remounted read-only (``mount -o remount,ro``, as the kernel does to
an ext4 after an I/O error), and the agent reports ``fs_readonly`` for that directory, naming the
mount and the job; remounted read-write, it says so. Needs root (mount); about 1 s."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftd.agent.save_path import SavePathWatcher
from ftd.agent.wiring import build_agent
from ftd.bus import topics
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.client import Client
from ftd.config import AgentConfig
from ftd.events import Event, Kind, decode
from tests.realparts import REQUIRE_REAL
from tests.unit.helpers import until

pytestmark = pytest.mark.real


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    point = tmp_path / "ckpt-fs"
    point.mkdir()
    try:
        mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(point))
    except (OSError, subprocess.CalledProcessError) as exc:
        why = f"cannot mount a tmpfs here ({exc}); needs root"
        if REQUIRE_REAL and os.geteuid() == 0:
            pytest.fail(f"FTD_REQUIRE_REAL=1 and {why}", pytrace=False)
        pytest.skip(why)
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=10)


async def test_the_agent_reports_the_checkpoint_dir_read_only_and_back(tmp_path: Path, tmpfs: Path) -> None:
    (tmp_path / "kmsg").touch()
    cfg = AgentConfig(
        node="n1",
        kmsg_path=str(tmp_path / "kmsg"),
        state_dir=str(tmp_path / "s"),
        socket_path=str(tmp_path / "a.sock"),
    )
    broker = MemoryBroker()
    sub = MemoryBus(broker, client_id="coordinator")
    await sub.subscribe(topics.node_event("n1", str(Kind.FS_READONLY)))
    await sub.start()
    agent = build_agent(cfg, bus=MemoryBus(broker, client_id="agent"), node="n1", stall_s=2.0)
    [watcher] = [w for w in agent.watchers if isinstance(w, SavePathWatcher)]
    assert watcher.interval_s == 0.5
    task = asyncio.create_task(agent.run())
    ckpt = tmpfs / "run-1"
    client = Client(job="j7", rank=0, socket_path=cfg.socket_path, checkpoint_dir=str(ckpt))
    seen: list[Event] = []
    try:
        async with asyncio.timeout(20):
            await until(lambda: bool(watcher.directories()), within=20)
            mount("-o", "remount,ro", str(tmpfs))
            async for message in sub.messages():
                seen.append(decode(message.payload, Event))
                if len(seen) == 1:
                    mount("-o", "remount,rw", str(tmpfs))
                else:
                    break
    finally:
        client.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await agent.close(flush_s=0.1)
        await sub.stop()
    ro, rw = seen
    assert (ro.kind, ro.source, ro.severity) == (Kind.FS_READONLY, "save_path", "critical")
    assert ro.data["path"] == str(ckpt) and ro.data["mount"] == str(tmpfs)
    assert ro.data["jobs"] == ["j7"] and ro.data["fstype"] == "tmpfs" and ro.data["shared"] is False
    assert rw.kind == Kind.FS_READONLY and rw.data["state"] == "rw" and rw.severity == "info"
