"""Filesystem fill forecasts: robust to bursts, inodes like bytes, a forecast is at most a warning.

Reported (issue #10): one burst write (a ``dd``, a checkpoint) extrapolated from three samples gave
``time_to_full_s`` 1.9 and a critical forecast. These tests feed the watcher's samples through a fake
``statvfs`` and clock; the hypothesis properties check :func:`ftd.agent.watchers.fs.fill_rate`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.agent.watchers.fs import FsWatcher, fill_rate
from ftd.config import FsConfig, FsMount
from ftd.events import Event, Severity
from tests.properties import examples

pytestmark = pytest.mark.timeout(120)

GB = 1 << 30
BLOCK = 4096


@dataclass
class Vfs:
    f_frsize: int = BLOCK
    f_blocks: int = 100 * GB // BLOCK
    f_bfree: int = 100 * GB // BLOCK
    f_bavail: int = 100 * GB // BLOCK
    f_files: int = 1_000_000
    f_ffree: int = 1_000_000
    f_favail: int = 1_000_000

    def fill(self, used_gb: float) -> None:
        self.f_bfree = self.f_bavail = int((100 - used_gb) * GB) // BLOCK

    def inodes(self, used: int) -> None:
        self.f_ffree = self.f_favail = self.f_files - used


class Fake:
    def __init__(self) -> None:
        self.vfs = Vfs()
        self.now = 0.0
        self.events: list[Event] = []

    def statvfs(self, path: str) -> Vfs:
        return self.vfs

    async def emit(self, event: Event) -> None:
        self.events.append(event)

    def reasons(self) -> list[str]:
        return [e.data["reason"] for e in self.events]

    def forecasts(self) -> list[Event]:
        return [e for e in self.events if e.data["reason"] == "forecast"]


def watcher(fake: Fake, **cfg: float) -> FsWatcher:
    config = FsConfig(
        mounts=[FsMount(path="/ckpt", warn_pct=85, critical_pct=95)],
        **{"interval_s": 30, "forecast_horizon_s": 3600, "forecast_window_s": 900, **cfg},  # type: ignore[arg-type]
    )
    return FsWatcher(config, "node-a", fake.emit, statvfs=fake.statvfs, clock=lambda: fake.now)


async def test_one_burst_after_steady_samples_is_no_forecast() -> None:
    """The reported failure: steady samples, then one large jump (a 38 GB dd) -> no forecast."""
    fake = Fake()
    w = watcher(fake)
    for used in (50.0, 50.0, 50.0, 50.0, 50.0, 88.0, 88.0):
        fake.vfs.fill(used)
        await w.poll_once()
        fake.now += 30
    assert fake.forecasts() == []
    # the jump crossed warn_pct: that is a threshold event, a warning
    assert fake.reasons() == ["threshold"]
    assert fake.events[0].data["level"] == "warning" and fake.events[0].severity is Severity.WARNING
    assert fake.events[0].data["resource"] == "bytes"


async def test_three_samples_are_not_a_trend() -> None:
    fake = Fake()
    w = watcher(fake)
    for used in (10.0, 40.0, 70.0):  # 1 GB/s, but only 60 s of samples
        fake.vfs.fill(used)
        await w.poll_once()
        fake.now += 30
    assert fake.forecasts() == []


async def test_sustained_fill_is_a_warning_forecast_never_critical() -> None:
    fake = Fake()
    w = watcher(fake)
    used = 10.0
    for _ in range(8):  # 0.1 GB/s: 90 GB left -> ~15 min to full
        fake.vfs.fill(used)
        await w.poll_once()
        fake.now += 30
        used += 3.0
    forecasts = fake.forecasts()
    assert len(forecasts) == 1
    event = forecasts[0]
    assert event.severity is Severity.WARNING
    assert event.data["resource"] == "bytes"
    # the first forecast comes at the 5th sample (120 s span): 10 + 4 * 3 = 22 GB used, 78 GB left
    assert event.data["time_to_full_s"] == pytest.approx(78 / 0.1, rel=0.01)
    assert event.data["fill_rate_bytes_per_s"] == pytest.approx(0.1 * GB, rel=0.01)


async def test_inode_exhaustion_is_forecast_from_inodes() -> None:
    """Inodes fill (small files) while bytes stay flat: the forecast is about inodes."""
    fake = Fake()
    w = watcher(fake)
    fake.vfs.fill(1.0)
    used = 100_000
    for _ in range(6):  # 1000 inodes/s: 900k free -> 900 s to full
        fake.vfs.inodes(used)
        await w.poll_once()
        fake.now += 30
        used += 30_000
    forecasts = fake.forecasts()
    assert len(forecasts) == 1
    data = forecasts[0].data
    assert data["resource"] == "inodes"
    assert data["inode_fill_rate_per_s"] == pytest.approx(1000, rel=0.01)
    assert data["inodes_free"] == 1_000_000 - 220_000
    assert data["time_to_full_s"] == pytest.approx(780, rel=0.01)
    assert data["used_pct"] == pytest.approx(1.0, abs=0.01)
    assert data["inodes_used_pct"] == pytest.approx(22.0, abs=0.01)
    assert forecasts[0].severity is Severity.WARNING


async def test_inode_threshold_names_inodes() -> None:
    fake = Fake()
    w = watcher(fake)
    fake.vfs.inodes(960_000)
    await w.poll_once()
    (event,) = fake.events
    assert event.data["reason"] == "threshold" and event.data["resource"] == "inodes"
    assert event.data["level"] == "critical" and event.severity is Severity.CRITICAL
    assert event.data["inodes_free"] == 40_000


async def test_forecast_rearms_after_the_fill_stops() -> None:
    fake = Fake()
    w = watcher(fake, forecast_window_s=300)
    used = 10.0
    for _ in range(8):
        fake.vfs.fill(used)
        await w.poll_once()
        fake.now += 30
        used += 3.0
    for _ in range(12):  # flat for 6 min: the window forgets the fill, the rate is 0
        await w.poll_once()
        fake.now += 30
    for _ in range(8):
        fake.vfs.fill(used)
        await w.poll_once()
        fake.now += 30
        used += 1.5
    assert len(fake.forecasts()) == 2


def steady(n: int, dt: float, rate: float, start: float = 0.0) -> list[tuple[float, float]]:
    return [(i * dt, start + rate * i * dt) for i in range(n)]


@settings(max_examples=examples(300), deadline=None)
@given(
    n=st.integers(5, 60),
    dt=st.floats(1.0, 120.0),
    rate=st.floats(0.0, 1e9),
    burst=st.floats(1e6, 1e13),
    where=st.floats(0.0, 1.0),
)
def test_property_one_burst_never_shortens_the_steady_forecast(
    n: int, dt: float, rate: float, burst: float, where: float
) -> None:
    points = steady(n, dt, rate)
    k = 1 + int(where * (n - 2))  # the burst lands between sample k-1 and k
    points = [(t, y + (burst if i >= k else 0.0)) for i, (t, y) in enumerate(points)]
    got = fill_rate(points)
    assert got is not None
    # never a faster fill than the steady trend (so never a nearer forecast), within rounding
    assert got <= rate * (1 + 1e-6) + 1e-6 * burst / (n * dt)


@settings(max_examples=examples(300), deadline=None)
@given(
    n=st.integers(2, 60),
    dt=st.floats(0.5, 300.0),
    rate=st.floats(-1e9, 1e9),
    start=st.floats(0.0, 1e14),
)
def test_property_linear_fill_gives_its_rate(n: int, dt: float, rate: float, start: float) -> None:
    got = fill_rate(steady(n, dt, rate, start))
    assert got == pytest.approx(rate, rel=1e-6, abs=1e-6 * (1 + start) / (n * dt))


@settings(max_examples=examples(200), deadline=None)
@given(
    n=st.integers(1, 40),
    rate_gb_s=st.floats(0.01, 2.0),
    start_gb=st.floats(0.0, 50.0),
)
def test_property_linear_fill_eta(n: int, rate_gb_s: float, start_gb: float) -> None:
    """A monotone linear fill: the forecast's ETA is what is left divided by the rate."""
    asyncio.run(_linear_fill_eta(n, rate_gb_s, start_gb))


async def _linear_fill_eta(n: int, rate_gb_s: float, start_gb: float) -> None:
    fake = Fake()
    w = watcher(fake, forecast_horizon_s=1e9)  # every trend below the horizon: the first is reported
    dt = 30.0
    taken = 0
    for i in range(n):
        used = start_gb + rate_gb_s * i * dt
        if used >= 84.0:  # stay below warn_pct: this is about the forecast alone
            break
        fake.vfs.fill(used)
        await w.poll_once()
        fake.now += dt
        taken += 1
    forecasts = fake.forecasts()
    assert [e.data["reason"] for e in fake.events] == ["forecast"] * len(forecasts)
    if taken < 5:
        assert forecasts == []  # fewer than 5 samples / 120 s: no trend yet
        return
    assert len(forecasts) == 1
    data = forecasts[0].data
    left_gb = 100 - (start_gb + rate_gb_s * 4 * dt)  # first reported at the 5th sample
    assert data["time_to_full_s"] == pytest.approx(left_gb / rate_gb_s, rel=0.01, abs=1)


def test_fill_rate_drops_samples_out_of_time_order() -> None:
    # (5, 999) and (7, 500) are not later than (10, 10): dropped, not fitted
    assert fill_rate([(0, 0), (10, 10), (5, 999), (7, 500), (20, 20)]) == pytest.approx(1.0)
    assert fill_rate([(0, 0), (0, 5)]) is None
