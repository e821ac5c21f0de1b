"""NVML signals the rules act on (issue #10): NVLink links down, the correctable-ECC rate, sustained
throttling, row-remap failure (no spare rows), and ``data.signal`` on every ``gpu_health`` finding;
the SM clock against its maximum that slow-rank findings quote (issue #33).

The watcher runs against :class:`FakeNvml` with a fake clock (no sleeping); the real backend's
translation of NVML answers is checked against a stand-in ``pynvml`` module (no GPU needed).
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from ftd.agent.watchers.nvml.backend import NvmlError, NvmlGpuLost, NvmlNotSupported
from ftd.agent.watchers.nvml.fake import FakeNvml
from ftd.agent.watchers.nvml.probe import sample_gpu
from ftd.agent.watchers.nvml.real import RealNvml
from ftd.agent.watchers.nvml.signals import GpuMemory, row_remap
from ftd.agent.watchers.nvml.watcher import NvmlWatcher
from ftd.config import NvmlConfig
from ftd.events import Event, Kind, Severity

pytestmark = pytest.mark.timeout(60)

GPU_HEALTH_SIGNALS = {"retired_pages", "pcie_replay", "nvlink_errors", "nvlink_down"}


class Harness:
    def __init__(self, count: int = 1, **cfg: Any) -> None:
        self.fake = FakeNvml(count)
        self.fake.init()
        self.now = 0.0
        self.events: list[Event] = []
        config = NvmlConfig(**{"interval_s": 0.05, "call_timeout_s": 5.0, **cfg})
        self.watcher = NvmlWatcher(config, "node-a", self.emit, backend=self.fake, clock=lambda: self.now)
        self.watcher.available = True

    async def emit(self, event: Event) -> None:
        self.events.append(event)

    async def poll(self, advance_s: float = 0.0) -> list[Event]:
        """Advance the clock, poll once, return the events of this poll."""
        self.now += advance_s
        before = len(self.events)
        await self.watcher.poll_once()
        return self.events[before:]

    def signal(self, kind: Kind, signal: str) -> list[Event]:
        return [e for e in self.events if e.kind is kind and e.data.get("signal") == signal]


# --- NVLink links down ------------------------------------------------------------------------------


async def test_nvlink_link_down_then_back() -> None:
    h = Harness(2)
    gpu = h.fake.gpu(1).with_nvlink(18)
    h.fake.gpu(0).with_nvlink(18)
    assert await h.poll() == []  # baseline
    gpu.set_link(3, False)
    (down,) = await h.poll(5)
    assert down.kind is Kind.GPU_HEALTH and down.severity is Severity.ERROR
    assert down.data["signal"] == "nvlink_down"
    assert down.data["links_down"] == [3] and down.data["new_links_down"] == [3]
    assert down.data["active_links"] == 17 and down.data["previous_active_links"] == 18
    assert down.data["gpu"] == 1 and down.data["uuid"] == gpu.uuid and down.data["index"] == 1
    assert await h.poll(5) == []  # still down: reported once
    gpu.set_link(5, False)
    (second,) = await h.poll(5)
    assert second.severity is Severity.ERROR
    assert second.data["links_down"] == [3, 5] and second.data["new_links_down"] == [5]
    assert second.data["active_links"] == 16 and second.data["previous_active_links"] == 17
    gpu.set_link(3, True)
    gpu.set_link(5, True)
    (back,) = await h.poll(5)
    # its own signal and no links_down key: nothing acting on a link going down can mistake it
    assert back.severity is Severity.INFO and back.data["signal"] == "nvlink_up"
    assert back.data["recovered"] is True and back.data["links_up"] == [3, 5]
    assert back.data["still_down"] == [] and "links_down" not in back.data
    assert back.data["active_links"] == 18
    assert await h.poll(5) == []
    # the active-link count is not an error counter: no nvlink_errors finding came from it
    assert h.signal(Kind.GPU_HEALTH, "nvlink_errors") == []


async def test_link_down_between_baseline_and_first_diff_and_all_links_down() -> None:
    h = Harness(1)
    gpu = h.fake.gpu(0).with_nvlink(4)
    await h.poll()
    for link in range(4):
        gpu.set_link(link, False)
    (down,) = await h.poll(5)
    assert down.data["links_down"] == [0, 1, 2, 3] and down.data["active_links"] == 0
    # every link down is an answer, not "no NVLink": the watcher keeps asking and sees them come back
    assert not {"nvlink_states", "nvlink_errors"} & h.watcher.gpus[gpu.uuid].unsupported
    gpu.set_link(2, True)
    (back,) = await h.poll(5)
    assert back.data["signal"] == "nvlink_up"
    assert back.data["links_up"] == [2] and back.data["still_down"] == [0, 1, 3]
    gpu.set_link(2, False)  # down again: reported again, with the others still down
    (again,) = await h.poll(5)
    assert again.data["signal"] == "nvlink_down"
    assert again.data["links_down"] == [0, 1, 2, 3] and again.data["new_links_down"] == [2]


async def test_no_active_link_at_baseline_means_no_nvlink_in_use() -> None:
    h = Harness(1)
    gpu = h.fake.gpu(0).with_nvlink(4)
    for link in range(4):
        gpu.set_link(link, False)
    await h.poll()
    gpu.set_link(1, True)
    assert await h.poll(5) == []  # a link coming up is not news
    gpu.set_link(1, False)
    (down,) = await h.poll(5)  # but once seen active, losing it is
    assert down.data["links_down"] == [1] and down.data["previous_active_links"] == 1


async def test_no_nvlink_is_asked_once_and_never_reported() -> None:
    h = Harness(1)  # nvlink_links is None: NotSupported
    await h.poll()
    await h.poll(5)
    assert h.events == []
    assert h.fake.calls["nvlink_states"] == 1
    assert "nvlink_states" in h.watcher.gpus[h.fake.gpu(0).uuid].unsupported


# --- gpu_health carries data.signal -------------------------------------------------------------------


async def test_every_gpu_health_finding_names_its_signal() -> None:
    h = Harness(1, pcie_replay_burst=10)
    gpu = h.fake.gpu(0).with_nvlink(2)
    await h.poll()
    gpu.pcie_replay = 50
    gpu.nvlink = {**(gpu.nvlink or {}), "crc_flit": 7}
    gpu.retired_pending = True
    gpu.set_link(1, False)
    found = await h.poll(5)
    health = [e for e in found if e.kind is Kind.GPU_HEALTH]
    signals = [e.data["signal"] for e in health]
    assert signals == ["retired_pages", "pcie_replay", "nvlink_errors", "nvlink_down"]
    assert {e.data["signal"] for e in health} == GPU_HEALTH_SIGNALS
    assert health[2].data["nvlink_errors"] == {"crc_flit": 7}
    assert all(e.data["gpu"] == 0 for e in health)


# --- correctable-ECC rate ------------------------------------------------------------------------------


async def test_correctable_ecc_rate_once_per_episode_rearmed_below_half() -> None:
    h = Harness(1, ecc_correctable_rate_per_hour=1000.0, ecc_correctable_window_s=600.0)
    gpu = h.fake.gpu(0)
    await h.poll()
    for _ in range(20):  # 5 per 30 s = 600/h: under the threshold
        gpu.bump_ecc("sbe", 5)
        await h.poll(30)
    assert h.signal(Kind.ECC, "correctable_rate") == []
    for _ in range(30):  # 20 per 30 s = 2400/h: over it, for 15 minutes
        gpu.bump_ecc("sbe", 20)
        await h.poll(30)
    (rate,) = h.signal(Kind.ECC, "correctable_rate")
    assert rate.severity is Severity.WARNING
    # over the 600 s window: 5 high polls (5 x 20) + 15 low ones (15 x 5) = 175 errors -> 1050/h
    assert rate.data["rate_per_hour"] == 1050.0 and rate.data["threshold_per_hour"] == 1000.0
    assert rate.data["window_s"] == 600.0 and rate.data["correctable_delta"] == 175 and rate.data["gpu"] == 0
    for _ in range(20):  # quiet for 10 minutes: the rate falls to 0, the episode re-arms
        await h.poll(30)
    assert len(h.signal(Kind.ECC, "correctable_rate")) == 1
    for _ in range(30):
        gpu.bump_ecc("sbe", 20)
        await h.poll(30)
    both = h.signal(Kind.ECC, "correctable_rate")
    assert len(both) == 2
    assert both[1].data["rate_per_hour"] == 1080.0  # 9 high polls after a quiet window: 180 in 600 s


async def test_correctable_ecc_rate_needs_a_minute_of_samples() -> None:
    h = Harness(1, ecc_correctable_rate_per_hour=1000.0)
    gpu = h.fake.gpu(0)
    await h.poll()
    gpu.bump_ecc("sbe", 500)  # a burst within 30 s: not a rate yet
    await h.poll(30)
    assert h.signal(Kind.ECC, "correctable_rate") == []
    await h.poll(30)  # 60 s span: 500 in 60 s = 30000/h
    (rate,) = h.signal(Kind.ECC, "correctable_rate")
    assert rate.data["rate_per_hour"] == pytest.approx(30000.0)
    assert rate.data["window_s"] == 60.0 and rate.data["correctable_delta"] == 500


async def test_correctable_ecc_counter_reset_starts_afresh() -> None:
    h = Harness(1, ecc_correctable_rate_per_hour=1000.0)
    gpu = h.fake.gpu(0)
    gpu.ecc["volatile_sbe"] = 10_000
    await h.poll()
    gpu.ecc["volatile_sbe"] = 0  # GPU reset: volatile counters start over
    await h.poll(60)
    await h.poll(60)
    assert h.signal(Kind.ECC, "correctable_rate") == []


# --- sustained throttling ------------------------------------------------------------------------------


async def test_sustained_throttle_once_per_episode() -> None:
    h = Harness(1, thermal_sustained_s=300.0)
    gpu = h.fake.gpu(0)
    await h.poll()
    gpu.throttle = 0x04 | 0x40  # power cap (normal) + HW thermal slowdown
    (first,) = await h.poll(60)
    assert first.kind is Kind.THERMAL and first.severity is Severity.WARNING
    assert first.data["sustained"] is False
    for _ in range(4):  # 240 s
        assert await h.poll(60) == []
    gpu.throttle = 0x20  # another alerting reason, no gap: the same episode
    found = await h.poll(60)  # 300 s
    sustained = [e for e in found if e.data.get("sustained")]
    assert len(sustained) == 1
    event = sustained[0]
    assert event.kind is Kind.THERMAL and event.severity is Severity.ERROR
    assert event.data["active"] is True and event.data["sustained_s"] == 300.0
    assert event.data["throttle_reasons"] == ["sw_thermal_slowdown"] and event.data["gpu"] == 0
    for _ in range(5):
        await h.poll(60)
    assert len([e for e in h.events if e.data.get("sustained")]) == 1
    gpu.throttle = 0  # cleared: re-armed
    await h.poll(60)
    gpu.throttle = 0x40
    for _ in range(6):
        await h.poll(60)
    assert len([e for e in h.events if e.data.get("sustained")]) == 2


async def test_short_throttle_bursts_are_not_sustained() -> None:
    h = Harness(1, thermal_sustained_s=300.0)
    gpu = h.fake.gpu(0)
    await h.poll()
    for _ in range(10):
        gpu.throttle = 0x40
        await h.poll(100)
        await h.poll(100)
        gpu.throttle = 0x04  # power cap alone is normal under load
        await h.poll(100)
    assert [e for e in h.events if e.data.get("sustained")] == []


# --- row-remap failure: no spare rows ------------------------------------------------------------------


async def test_remap_failure_is_no_spare_rows() -> None:
    h = Harness(1)
    gpu = h.fake.gpu(0)
    await h.poll()
    gpu.remap_failure = True
    gpu.histogram = {"max": 0, "high": 0, "partial": 0, "low": 0, "none": 640}
    (event,) = await h.poll(5)
    assert event.kind is Kind.ROW_REMAP and event.severity is Severity.CRITICAL
    assert "failure" in event.data["reasons"] and event.data["no_spare_rows"] is True
    assert event.data["histogram"]["none"] == 640


# --- SM clocks --------------------------------------------------------------------------------------


async def test_sm_clocks_on_the_first_sample_then_only_when_they_move() -> None:
    h = Harness(2)
    for gpu in (h.fake.gpu(0), h.fake.gpu(1)):
        gpu.sm_clocks = (1980, 1980)
    await h.poll()
    first = h.signal(Kind.THERMAL, "sm_clocks")
    assert sorted((e.data["index"], e.data["sm_mhz"], e.data["max_mhz"]) for e in first) == [
        (0, 1980, 1980),
        (1, 1980, 1980),
    ]
    assert all(e.severity is Severity.INFO and "active" not in e.data for e in first)  # alerts nobody
    h.fake.gpu(1).sm_clocks = (1900, 1980)  # within 10 % of its maximum: not a move
    assert await h.poll(60.0) == []
    h.fake.gpu(1).sm_clocks = (990, 1980)  # half its maximum
    moved = await h.poll(1.0)
    assert [(e.data["index"], e.data["sm_mhz"]) for e in moved] == [(1, 990)]
    h.fake.gpu(1).sm_clocks = (1980, 1980)  # back at once: at most one finding per GPU every 30 s
    assert await h.poll(1.0) == []
    back = await h.poll(30.0)
    assert [(e.data["index"], e.data["sm_mhz"]) for e in back] == [(1, 1980)]


async def test_sm_clocks_not_supported_is_asked_once_and_never_reported() -> None:
    h = Harness(1)  # a FakeGpu without sm_clocks answers NotSupported, as an old driver does
    await h.poll()
    await h.poll(60.0)
    assert h.signal(Kind.THERMAL, "sm_clocks") == []
    assert h.fake.calls["sm_clocks_mhz"] == 1


def test_real_sm_clocks_read_the_sm_clock_and_its_maximum() -> None:
    asked: list[tuple[str, int]] = []

    def clock(name: str, mhz: int) -> Any:
        def get(handle: str, which: int) -> int:
            asked.append((name, which))
            return mhz

        return get

    nv = stand_in_pynvml(
        NVML_CLOCK_SM=1,
        nvmlDeviceGetClockInfo=clock("now", 1410),
        nvmlDeviceGetMaxClockInfo=clock("max", 1980),
    )
    assert real_with(nv).sm_clocks_mhz(0) == (1410, 1980)
    assert asked == [("now", 1), ("max", 1)]

    def unsupported(handle: str, which: int) -> int:
        raise FakeNVMLError(3)

    nv = stand_in_pynvml(NVML_CLOCK_SM=1, nvmlDeviceGetClockInfo=unsupported)
    with pytest.raises(NvmlNotSupported):
        real_with(nv).sm_clocks_mhz(0)


# --- the real backend, against a stand-in pynvml ------------------------------------------------------


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def stand_in_pynvml(**functions: Any) -> types.SimpleNamespace:
    """The few pynvml names RealNvml uses, with the real constants' meaning."""
    return types.SimpleNamespace(
        NVMLError=FakeNVMLError,
        NVML_ERROR_NOT_SUPPORTED=3,
        NVML_ERROR_INVALID_ARGUMENT=2,
        NVML_ERROR_UNKNOWN=999,
        NVML_ERROR_GPU_IS_LOST=15,
        NVML_ERROR_RESET_REQUIRED=16,
        NVML_NVLINK_MAX_LINKS=18,
        NVML_NVLINK_ERROR_DL_REPLAY=0,
        NVML_NVLINK_ERROR_DL_RECOVERY=1,
        NVML_NVLINK_ERROR_DL_CRC_FLIT=2,
        NVML_NVLINK_ERROR_DL_CRC_DATA=3,
        NVML_NVLINK_ERROR_DL_ECC_DATA=4,
        nvmlDeviceGetHandleByIndex=lambda index: f"handle-{index}",
        **functions,
    )


def real_with(nv: types.SimpleNamespace) -> RealNvml:
    backend = RealNvml()
    backend._nv = nv
    return backend


def test_real_remap_failure_bit_is_no_spare_rows() -> None:
    nv = stand_in_pynvml(nvmlDeviceGetRemappedRows=lambda handle: (2, 1, False, True))
    info = real_with(nv).remapped_rows(0)
    assert info.failure is True and info.pending is False and (info.corrected, info.uncorrected) == (2, 1)
    others = {"ecc_counters", "remap_histogram", "retired_pages_pending", "temperature", "throttle_reasons"}
    others |= {"power", "sm_clocks", "pcie_replay_counter", "nvlink_errors", "nvlink_states"}
    sample = sample_gpu(real_with(nv), 0, others)
    assert sample.remap == info
    finding = row_remap(None, sample)
    assert finding is not None
    kind, severity, data = finding
    assert kind is Kind.ROW_REMAP and severity is Severity.CRITICAL
    assert data["reasons"] == ["failure"] and data["no_spare_rows"] is True and data["failure"] is True


def link_states(states: dict[int, int | FakeNVMLError], past_end: int) -> Any:
    def get(handle: str, link: int) -> int:
        answer = states.get(link, FakeNVMLError(past_end))
        if isinstance(answer, FakeNVMLError):
            raise answer
        return answer

    return get


def test_real_nvlink_states_per_link() -> None:
    nv = stand_in_pynvml(
        nvmlDeviceGetNvLinkState=link_states({0: 1, 1: 0, 2: FakeNVMLError(999), 3: 1}, past_end=2)
    )
    # link 2 could not be read: left out (unknown), not reported down; link 4 is past the last one
    assert real_with(nv).nvlink_states(0) == {0: True, 1: False, 3: True}


def test_real_nvlink_states_not_supported_and_lost() -> None:
    nv = stand_in_pynvml(nvmlDeviceGetNvLinkState=link_states({0: FakeNVMLError(3)}, past_end=2))
    with pytest.raises(NvmlNotSupported):
        real_with(nv).nvlink_states(0)
    nv = stand_in_pynvml(nvmlDeviceGetNvLinkState=link_states({0: 1, 1: FakeNVMLError(15)}, past_end=2))
    with pytest.raises(NvmlGpuLost):
        real_with(nv).nvlink_states(0)
    nv = stand_in_pynvml(nvmlDeviceGetNvLinkState=link_states({0: FakeNVMLError(999)}, past_end=2))
    with pytest.raises(NvmlError) as caught:
        real_with(nv).nvlink_states(0)
    assert not isinstance(caught.value, NvmlNotSupported)  # a transient failure is not remembered


def test_real_nvlink_errors_with_every_link_down_is_zero_not_unsupported() -> None:
    counters: list[tuple[int, int]] = []

    def counter(handle: str, link: int, which: int) -> int:
        counters.append((link, which))
        return 10 * link + which

    nv = stand_in_pynvml(
        nvmlDeviceGetNvLinkState=link_states({0: 0, 1: 0, 2: 0}, past_end=2),
        nvmlDeviceGetNvLinkErrorCounter=counter,
    )
    totals = real_with(nv).nvlink_errors(0)
    assert totals["active_links"] == 0 and counters == []
    nv = stand_in_pynvml(
        nvmlDeviceGetNvLinkState=link_states({0: 1, 1: 0, 2: 1}, past_end=2),
        nvmlDeviceGetNvLinkErrorCounter=counter,
    )
    totals = real_with(nv).nvlink_errors(0)
    assert totals["active_links"] == 2
    assert totals["crc_flit"] == (0 + 2) + (20 + 2)  # summed over the active links 0 and 2 only
    assert sorted({link for link, _ in counters}) == [0, 2]


def test_gpu_memory_starts_empty() -> None:
    mem = GpuMemory()
    assert mem.links_baseline is None and not mem.links_down and not mem.ecc_window
