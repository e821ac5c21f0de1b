"""The filesystem watcher with an injectable statvfs and clock."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import pytest

from ftd.agent.watchers.fs import FsWatcher, linear_slope
from ftd.config import FsConfig, FsMount
from ftd.events import Event, Kind, Severity

pytestmark = pytest.mark.timeout(60)

GB = 1 << 30


@dataclass
class Vfs:
    f_frsize: int = 4096
    f_blocks: int = 100 * GB // 4096
    f_bfree: int = 100 * GB // 4096
    f_bavail: int = 100 * GB // 4096
    f_files: int = 1000
    f_ffree: int = 1000
    f_favail: int = 1000

    def fill(self, used_gb: float) -> None:
        free = int((100 - used_gb) * GB) // 4096
        self.f_bfree = self.f_bavail = free


class Fake:
    def __init__(self) -> None:
        self.vfs = Vfs()
        self.now = 0.0
        self.events: list[Event] = []
        self.block = threading.Event()
        self.blocking = False

    def statvfs(self, path: str) -> Vfs:
        if self.blocking:
            self.block.wait()
        return self.vfs

    async def emit(self, event: Event) -> None:
        self.events.append(event)


def watcher(fake: Fake, **mount: float) -> FsWatcher:
    cfg = FsConfig(
        mounts=[FsMount(path="/ckpt", **mount)],
        interval_s=60,
        hysteresis_pct=2,
        forecast_horizon_s=3600,
        forecast_window_s=900,
    )
    return FsWatcher(
        cfg, "node-a", fake.emit, statvfs=fake.statvfs, clock=lambda: fake.now, call_timeout_s=0.2
    )


def test_linear_slope() -> None:
    assert linear_slope([(0, 1), (1, 3), (2, 5)]) == pytest.approx(2.0)
    assert linear_slope([(1, 1)]) is None


async def test_thresholds_with_hysteresis() -> None:
    fake = Fake()
    w = watcher(fake, warn_pct=80, critical_pct=90)
    levels = []
    for used in (50, 81, 79, 85, 91, 89, 87.5, 70, 77, 79):
        fake.vfs.fill(used)
        fake.now += 3600  # far apart: no forecast
        await w.poll_once()
        levels.append(w.state["/ckpt"].level)
    assert levels == [
        "ok",
        "warning",
        "warning",
        "warning",
        "critical",
        "critical",
        "warning",
        "ok",
        "ok",
        "ok",
    ]
    got = [(e.data["level"], e.severity) for e in fake.events]
    assert got == [
        ("warning", Severity.WARNING),
        ("critical", Severity.CRITICAL),
        ("warning", Severity.WARNING),
        ("ok", Severity.INFO),
    ]
    assert all(e.kind is Kind.FS_FILL and e.data["path"] == "/ckpt" for e in fake.events)


async def test_capacity_factor_counts_full_earlier() -> None:
    fake = Fake()
    w = watcher(fake, warn_pct=85, critical_pct=95, capacity_factor=0.8)
    fake.vfs.fill(77)  # 77 / 80 = 96% of effective capacity
    await w.poll_once()
    assert fake.events[0].data["level"] == "critical"
    assert fake.events[0].data["used_pct"] == pytest.approx(96.25, abs=0.1)


async def test_inodes_count_too() -> None:
    fake = Fake()
    w = watcher(fake, warn_pct=80, critical_pct=90)
    fake.vfs.f_ffree = fake.vfs.f_favail = 150
    await w.poll_once()
    assert fake.events[0].data["resource"] == "inodes" and fake.events[0].data["level"] == "warning"


async def test_forecast_once_per_episode() -> None:
    fake = Fake()
    w = watcher(fake, warn_pct=95, critical_pct=99)
    used = 10.0
    for _ in range(10):  # 1 GB per minute: 90 GB left -> ~90 min: beyond the 1 h horizon
        fake.vfs.fill(used)
        await w.poll_once()
        fake.now += 60
        used += 1
    assert fake.events == []
    for _ in range(30):  # 3 GB per minute: full in well under an hour
        fake.vfs.fill(used)
        await w.poll_once()
        fake.now += 60
        used += 3
    forecasts = [e for e in fake.events if e.data["reason"] == "forecast"]
    assert len(forecasts) == 1
    assert 0 < forecasts[0].data["time_to_full_s"] < 3600
    # it fires as soon as the fitted rate (old slow samples + new fast ones) crosses the horizon
    assert GB / 60 < forecasts[0].data["fill_rate_bytes_per_s"] <= 3 * GB / 60 * 1.01


async def test_stuck_statvfs_reported_once_without_thread_pile_up() -> None:
    fake = Fake()
    w = watcher(fake)
    fake.blocking = True
    before = threading.active_count()
    try:
        for _ in range(5):
            await w.poll_once()
        assert threading.active_count() <= before + 1
        stalled = [e for e in fake.events if e.data.get("stalled")]
        assert len(stalled) == 1
    finally:
        fake.block.set()


async def test_real_statvfs_on_tmp(tmp_path: os.PathLike[str]) -> None:
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    w = FsWatcher(
        FsConfig(mounts=[FsMount(path=str(tmp_path), warn_pct=0.0001, critical_pct=100)]), "n", emit
    )
    await w.poll_once()
    assert events and events[0].data["level"] in ("warning", "critical")
