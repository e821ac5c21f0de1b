"""The events the agent's watchers really emit, fed to the built-in rules (issue #10 contract).

The rule tests build event shapes by hand; here the shapes come from the watchers themselves (NVML
through FakeNvml, the filesystem through a fake ``statvfs``, memory through fake /proc text), so a
key renamed on either side, or a recovery event a rule would mistake for a fault, fails a test.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from ftd.agent.watchers.fs import FsWatcher
from ftd.agent.watchers.memory import MemoryWatcher
from ftd.agent.watchers.nvml.fake import FakeNvml
from ftd.agent.watchers.nvml.watcher import NvmlWatcher
from ftd.config import FsConfig, FsMount, MemoryConfig, NvmlConfig
from ftd.events import Event, Kind
from ftd.plugin import ActionRequest, ClusterView
from ftd.rules import ecc_remap, fs_fill, gpu_health, memory, thermal
from ftd.testing import evaluate_rule, view_with

pytestmark = pytest.mark.timeout(60)

NODE = "node-a"


def view() -> ClusterView:
    return view_with(jobs={"j1": [NODE, "node-b"]})


def kinds(actions: list[ActionRequest]) -> list[str]:
    return [str(a.kind) for a in actions]


class Sink:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def __call__(self, event: Event) -> None:
        self.events.append(event)

    def take(self) -> list[Event]:
        out, self.events = self.events, []
        return out


class Nvml:
    def __init__(self, **cfg: Any) -> None:
        self.fake = FakeNvml(1)
        self.fake.init()
        self.now = 0.0
        self.sink = Sink()
        config = NvmlConfig(**{"interval_s": 0.05, "call_timeout_s": 5.0, **cfg})
        self.watcher = NvmlWatcher(config, NODE, self.sink, backend=self.fake, clock=lambda: self.now)
        self.watcher.available = True

    async def poll(self, advance_s: float = 5.0) -> list[Event]:
        self.now += advance_s
        await self.watcher.poll_once()
        return self.sink.take()


async def test_nvlink_down_drains_and_its_recovery_does_nothing() -> None:
    h = Nvml()
    gpu = h.fake.gpu(0).with_nvlink(18)
    await h.poll()
    gpu.set_link(7, False)
    (down,) = await h.poll()
    assert kinds(evaluate_rule(gpu_health, down, view())) == ["checkpoint_restart", "drain_node"]
    gpu.set_link(7, True)
    (up,) = await h.poll()
    assert evaluate_rule(gpu_health, up, view()) == []


async def test_stall_and_its_end() -> None:
    h = Nvml(call_timeout_s=0.2)
    gpu = h.fake.gpu(0)
    await h.poll()
    gpu.block.add("temperature_c")
    (stalled,) = await h.poll()
    assert kinds(evaluate_rule(gpu_health, stalled, view())) == ["notify"]
    h.fake.release()
    gpu.block.clear()
    for _ in range(1000):  # the released probe thread finishes at once; never a timed wait
        if not h.watcher.outstanding_probes():
            break
        await asyncio.sleep(0.01)
    assert h.watcher.outstanding_probes() == 0
    ended = [e for e in await h.poll() if e.data.get("stalled") is False]
    assert len(ended) == 1 and evaluate_rule(gpu_health, ended[0], view()) == []


async def test_correctable_rate_no_spare_rows_and_sustained_throttle_reach_their_rules() -> None:
    h = Nvml(ecc_correctable_rate_per_hour=1000.0, thermal_sustained_s=300.0)
    gpu = h.fake.gpu(0)
    await h.poll()
    gpu.bump_ecc("sbe", 100)
    await h.poll(30)
    found = await h.poll(30)
    (rate,) = [e for e in found if e.data.get("signal") == "correctable_rate"]
    assert kinds(evaluate_rule(ecc_remap, rate, view())) == ["notify"]

    gpu.remap_failure = True
    (remap,) = await h.poll()
    assert remap.data["no_spare_rows"] is True
    assert kinds(evaluate_rule(ecc_remap, remap, view())) == ["checkpoint_restart", "drain_node"]

    gpu.throttle = 0x40
    (first,) = await h.poll(60)
    assert kinds(evaluate_rule(thermal, first, view())) == ["notify"]
    for _ in range(4):
        assert await h.poll(60) == []
    (sustained,) = await h.poll(60)
    assert sustained.data["sustained"] is True
    assert kinds(evaluate_rule(thermal, sustained, view())) == ["checkpoint", "notify"]


@dataclass
class Vfs:
    f_frsize: int = 4096
    f_blocks: int = (100 << 30) // 4096
    f_bfree: int = (100 << 30) // 4096
    f_bavail: int = (100 << 30) // 4096
    f_files: int = 1_000_000
    f_ffree: int = 1_000_000
    f_favail: int = 1_000_000

    def fill(self, used_gb: float) -> None:
        self.f_bfree = self.f_bavail = int((100 - used_gb) * (1 << 30)) // 4096


async def test_a_burst_write_is_a_save_never_a_stop_and_a_forecast_is_a_save() -> None:
    vfs, now, sink = Vfs(), [0.0], Sink()
    cfg = FsConfig(mounts=[FsMount(path="/ckpt", warn_pct=85, critical_pct=95)], interval_s=30)
    w = FsWatcher(cfg, NODE, sink, statvfs=lambda _p: vfs, clock=lambda: now[0])
    for used in (50.0, 50.0, 50.0, 50.0, 50.0, 88.0, 88.0):  # one 38 GB dd
        vfs.fill(used)
        await w.poll_once()
        now[0] += 30
    (crossing,) = sink.take()
    assert kinds(evaluate_rule(fs_fill, crossing, view())) == ["checkpoint", "notify"]
    w = FsWatcher(cfg, NODE, sink, statvfs=lambda _p: vfs, clock=lambda: now[0])  # another day
    used = 10.0
    for _ in range(8):  # 0.1 GB/s: full in ~13 min
        now[0] += 30
        used += 3.0
        vfs.fill(used)
        await w.poll_once()
    (forecast,) = sink.take()
    assert forecast.data["reason"] == "forecast"
    assert forecast.data["time_to_full_s"] < 900
    assert kinds(evaluate_rule(fs_fill, forecast, view())) == ["checkpoint", "notify"]


async def test_memory_leak_saves_then_restarts_when_it_goes_on() -> None:
    now, sink = [0.0], Sink()
    rss, avail = [4_000_000], [30 * 1024 * 1024]

    def read(path: str) -> str:
        if path == "/proc/meminfo":
            return f"MemTotal: {100 * 1024 * 1024} kB\nMemAvailable: {avail[0]} kB\n"
        if path == "/proc/pressure/memory":
            raise FileNotFoundError(path)
        return f"Name:\tpython\nVmRSS:\t {rss[0]} kB\n"

    w = MemoryWatcher(MemoryConfig(), NODE, sink, pids=lambda: {101: ("j1", 0)}, read_text=read,
                      clock=lambda: now[0])  # fmt: skip
    leaks: list[Event] = []
    for _ in range(400):
        await w.poll_once()
        leaks += [e for e in sink.take() if e.data.get("leak")]
        now[0] += 10
        rss[0] += 85 * 1024  # ~510 MB per minute
        avail[0] = max(0, avail[0] - 85 * 1024)
    assert [e.data["escalated"] for e in leaks] == [False, True]
    assert all(e.kind is Kind.MEM_PRESSURE for e in leaks)
    assert kinds(evaluate_rule(memory, leaks[0], view())) == ["checkpoint"]
    assert kinds(evaluate_rule(memory, leaks[1], view())) == ["checkpoint_restart"]
