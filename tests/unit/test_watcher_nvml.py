"""The NVML watcher against FakeNvml (and, marked ``gpu``, against the real NVML when present)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog.testing

from ftd.agent.watchers.nvml.backend import NvmlNotSupported
from ftd.agent.watchers.nvml.fake import FakeNvml
from ftd.agent.watchers.nvml.probe import sample_gpu
from ftd.agent.watchers.nvml.real import RealNvml
from ftd.agent.watchers.nvml.watcher import NvmlWatcher
from ftd.catalog.gpu_limits import sram_over_limit
from ftd.config import NvmlConfig
from ftd.events import Event, Kind, Severity
from tests.skips import skip_without_gpu

pytestmark = pytest.mark.timeout(60)


class Collect:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def __call__(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: Kind) -> list[Event]:
        return [e for e in self.events if e.kind is kind]


def make(fake: FakeNvml, **cfg: object) -> tuple[NvmlWatcher, Collect]:
    out = Collect()
    config = NvmlConfig(**{"interval_s": 0.05, "call_timeout_s": 0.3, **cfg})  # type: ignore[arg-type]
    return NvmlWatcher(config, "node-a", out, backend=fake), out


async def init(watcher: NvmlWatcher) -> None:
    watcher.backend.init()
    watcher.available = True


async def test_counters_rising_one_event_per_increase() -> None:
    fake = FakeNvml(2)
    watcher, out = make(fake)
    await init(watcher)
    await watcher.poll_once()  # baseline
    assert out.events == []
    await watcher.poll_once()
    assert out.events == []  # nothing changed: nothing sent
    fake.gpu(1).bump_ecc("sbe", 3)
    await watcher.poll_once()
    await watcher.poll_once()
    fake.gpu(1).bump_ecc("dbe", 1, location="sram")
    await watcher.poll_once()
    ecc = out.of(Kind.ECC)
    assert len(ecc) == 2
    assert ecc[0].severity is Severity.WARNING and ecc[0].data["deltas"]["volatile_sbe"] == 3
    assert ecc[1].severity is Severity.ERROR and ecc[1].data["dbe"] is True
    assert ecc[1].data["deltas"]["volatile_dbe_sram"] == 1
    for event in ecc:
        assert event.source == "nvml"
        assert event.data["uuid"] == fake.gpu(1).uuid and event.data["index"] == 1
        assert event.data["pci"] == fake.gpu(1).pci


async def test_row_remap_thermal_pcie_nvlink_retired() -> None:
    fake = FakeNvml(1)
    gpu = fake.gpu(0)
    gpu.nvlink = {"replay": 0, "recovery": 0, "crc_flit": 0, "active_links": 18}
    watcher, out = make(fake, temperature_c=80.0, pcie_replay_burst=50)
    await init(watcher)
    await watcher.poll_once()
    gpu.remap_uncorrected, gpu.remap_pending = 1, True
    gpu.histogram = {"max": 639, "high": 1, "partial": 0, "low": 0, "none": 0}
    await watcher.poll_once()
    await watcher.poll_once()
    remap = out.of(Kind.ROW_REMAP)
    assert len(remap) == 1
    assert set(remap[0].data["reasons"]) == {"pending", "uncorrectable_grew"}
    assert remap[0].data["histogram"]["high"] == 1 and remap[0].severity is Severity.ERROR
    gpu.remap_failure = True
    await watcher.poll_once()
    assert out.of(Kind.ROW_REMAP)[-1].severity is Severity.CRITICAL

    gpu.temperature_c = 83
    await watcher.poll_once()
    gpu.temperature_c = 79  # within hysteresis: still hot, nothing new
    await watcher.poll_once()
    gpu.temperature_c = 60
    await watcher.poll_once()
    thermal = out.of(Kind.THERMAL)
    assert [e.data["active"] for e in thermal] == [True, False]
    gpu.throttle = 0x04  # SW power cap: normal under load, not an alert
    await watcher.poll_once()
    gpu.throttle = 0x04 | 0x40
    await watcher.poll_once()
    await watcher.poll_once()
    thermal = out.of(Kind.THERMAL)
    assert len(thermal) == 3 and thermal[-1].data["new_reasons"] == ["hw_thermal_slowdown"]

    gpu.pcie_replay = 10
    await watcher.poll_once()
    gpu.pcie_replay = 200
    await watcher.poll_once()
    gpu.nvlink["crc_flit"] = 4
    await watcher.poll_once()
    gpu.retired_pending = True
    await watcher.poll_once()
    await watcher.poll_once()
    health = out.of(Kind.GPU_HEALTH)
    assert [
        next(k for k in ("pcie_replay_burst", "nvlink_errors", "retired_pages_pending") if k in e.data)
        for e in health
    ] == ["pcie_replay_burst", "nvlink_errors", "retired_pages_pending"]
    assert health[0].data["pcie_replay_burst"] == 190
    assert health[1].data["nvlink_errors"] == {"crc_flit": 4}


async def test_initial_bad_state_reported_once() -> None:
    fake = FakeNvml(1)
    fake.gpu(0).ecc["volatile_dbe"] = 2
    fake.gpu(0).ecc["aggregate_sbe"] = 7  # history, normal: not reported
    fake.gpu(0).remap_pending = True
    watcher, out = make(fake)
    await init(watcher)
    await watcher.poll_once()
    await watcher.poll_once()
    assert [e.kind for e in out.events] == [Kind.ECC, Kind.ROW_REMAP]
    assert all(e.data["initial"] for e in out.events)


async def test_gpu_vanishing_and_count_below_expected() -> None:
    fake = FakeNvml(4)
    watcher, out = make(fake, expected_gpus=4)
    await init(watcher)
    await watcher.poll_once()
    assert out.events == []
    gone = fake.vanish(2)
    await watcher.poll_once()
    await watcher.poll_once()
    missing = out.of(Kind.GPU_MISSING)
    assert len(missing) == 2
    per_gpu = next(e for e in missing if e.data["uuid"] == gone.uuid)
    assert per_gpu.data["pci"] == gone.pci and per_gpu.data["index"] == 2
    node_level = next(e for e in missing if e.data["uuid"] is None)
    assert node_level.data["expected"] == 4 and node_level.data["found"] == 3
    assert node_level.data["missing_uuids"] == [gone.uuid]
    # "GPU is lost" answers: one event per episode, probing goes on, recovery re-arms
    fake.gpu(0).lost = True
    await watcher.poll_once()
    await watcher.poll_once()
    assert len(out.of(Kind.GPU_MISSING)) == 3
    fake.gpu(0).lost = False
    await watcher.poll_once()
    fake.gpu(0).lost = True
    await watcher.poll_once()
    assert len(out.of(Kind.GPU_MISSING)) == 4


async def test_blocking_call_is_reported_and_threads_do_not_pile_up() -> None:
    fake = FakeNvml(2)
    watcher, out = make(fake, call_timeout_s=0.2)
    await init(watcher)
    await watcher.poll_once()
    fake.gpu(1).block.add("temperature_c")

    def probe_threads() -> int:  # the stuck GPU's probe threads (other tests may leave threads behind)
        name = f"ftd-nvml-gpu-{fake.gpu(1).uuid}"
        return sum(1 for t in threading.enumerate() if t.name == name and t.is_alive())

    threads_before = probe_threads()
    try:
        for _ in range(8):
            await watcher.poll_once()
        stalled = [e for e in out.of(Kind.GPU_HEALTH) if e.data.get("stalled")]
        assert len(stalled) == 1
        assert stalled[0].data["call"] == "temperature" and stalled[0].data["gpu"] == 1
        assert stalled[0].data["signal"] == "stalled" and stalled[0].severity is Severity.ERROR
        assert stalled[0].data["uuid"] == fake.gpu(1).uuid
        assert watcher.outstanding_probes() == 1
        assert probe_threads() <= threads_before + 1
        # the healthy GPU is still watched while the other is stuck
        fake.gpu(0).bump_ecc("dbe")
        await watcher.poll_once()
        assert out.of(Kind.ECC)[-1].data["index"] == 0
    finally:
        fake.gpu(1).block.clear()
        fake.release()
    await asyncio.sleep(0.05)
    await watcher.poll_once()
    over = [e for e in out.of(Kind.GPU_HEALTH) if e.data.get("stalled") is False]
    assert len(over) == 1 and over[0].data["stalled_for_s"] > 0
    assert over[0].data["signal"] == "stall_ended" and over[0].severity is Severity.INFO


async def test_notsupported_asked_once() -> None:
    fake = FakeNvml(1)
    fake.gpu(0).unsupported = {"retired_pages_pending", "pcie_replay_count"}
    watcher, out = make(fake)
    await init(watcher)
    for _ in range(5):
        await watcher.poll_once()
    assert fake.calls["retired_pages_pending"] == 1
    assert fake.calls["nvlink_errors"] == 1  # FakeGpu.nvlink None -> NotSupported
    assert fake.calls["temperature_c"] == 5
    assert out.events == []


async def test_run_emits_nvml_xid_events() -> None:
    fake = FakeNvml(2)
    watcher, out = make(fake, interval_s=0.05)
    task = asyncio.create_task(watcher.run())
    try:
        await wait_for(lambda: watcher.polls >= 2)
        fake.inject_xid(79, index=1)
        await wait_for(lambda: bool(out.of(Kind.XID)))
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    xid = out.of(Kind.XID)[0]
    assert xid.data["code"] == 79 and xid.data["source"] == "nvml"
    assert xid.data["uuid"] == fake.gpu(1).uuid and xid.data["pci"] == fake.gpu(1).pci
    assert xid.severity is Severity.CRITICAL
    await wait_for(lambda: fake.shut_down)


async def test_no_nvml_logs_one_line_and_idles(tmp_path: Path) -> None:
    fake = FakeNvml(0, unavailable="nvmlInit failed: Driver Not Loaded")
    watcher, out = make(fake, gpu_root=str(tmp_path))  # a node without GPUs: nothing to watch
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(watcher.run())
        await wait_for(lambda: watcher.available is False)
        await asyncio.sleep(0.1)
        assert not task.done()  # idles, does not crash or return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert out.events == [] and fake.calls["device_count"] == 0
    lines = [(e["event"], e.get("reason")) for e in logs if e["event"].startswith("nvml_unavailable")]
    assert lines == [("nvml_unavailable_watcher_disabled", "nvmlInit failed: Driver Not Loaded")]
    health = watcher.health()
    assert health.state == "idle" and "no NVIDIA GPU on this node" in health.reason, health


async def test_no_nvml_on_a_gpu_node_is_unavailable_once_until_it_works(tmp_path: Path) -> None:
    # issue #32 item 3: the driver's GPU entry is there, NVML does not answer
    (tmp_path / "proc" / "driver" / "nvidia" / "gpus" / "0000:3b:00.0").mkdir(parents=True)
    fake = FakeNvml(1, unavailable="nvmlInit failed: Driver/library version mismatch")
    watcher, out = make(fake, gpu_root=str(tmp_path))
    watcher.init_retry_s = 0.02
    task = asyncio.create_task(watcher.run())
    try:
        await wait_for(lambda: fake.calls["init"] >= 4)  # tried again, told once
        health = watcher.health()
        assert health.state == "unavailable", health
        assert health.reason == (
            "nvml unavailable on a node with NVIDIA GPUs (proc/driver/nvidia/gpus/0000:3b:00.0): "
            "nvmlInit failed: Driver/library version mismatch"
        )
        [told] = out.of(Kind.AGENT_HEALTH)
        assert (told.severity, told.data["problem"], told.data["watcher"]) == (
            Severity.ERROR,
            "watcher_unavailable",
            "nvml",
        )
        assert told.data["reason"] == health.reason and told.data["gpus"] == [
            "proc/driver/nvidia/gpus/0000:3b:00.0"
        ]
        fake.unavailable = None  # the driver is fixed
        await wait_for(lambda: watcher.health().state == "running")
        back = out.of(Kind.AGENT_HEALTH)[-1]
        assert (back.severity, back.data["problem"]) == (Severity.INFO, "watcher_available")
        await wait_for(lambda: watcher.polls >= 1)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_real_backend_without_library_is_unavailable_not_a_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # runs everywhere: where nvidia-ml-py is installed (it is a dependency), its import is made to fail
    monkeypatch.setitem(sys.modules, "pynvml", None)
    watcher, _ = make(FakeNvml(0))
    watcher.backend = RealNvml()
    task = asyncio.create_task(watcher.run())
    await wait_for(lambda: watcher.available is False)
    assert "pynvml (nvidia-ml-py) not installed" in (watcher.disabled_reason or "")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def wait_for(predicate: Callable[[], bool], within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


REQUIRE_GPU = os.environ.get("FTD_REQUIRE_GPU") == "1"


def _real_nvml_or_skip() -> RealNvml:
    """The real backend, initialised; without NVML the test skips with the reason, or fails when
    ``FTD_REQUIRE_GPU=1`` (set it on a GPU machine, so a broken driver is never a silent skip)."""
    backend = RealNvml()
    try:
        backend.init()
    except Exception as exc:
        if REQUIRE_GPU:
            pytest.fail(f"FTD_REQUIRE_GPU=1 and no NVML here: {exc}", pytrace=False)
        skip_without_gpu(f"no NVML (set FTD_REQUIRE_GPU=1 on a GPU machine): {exc}")
    return backend


@pytest.mark.gpu
def test_real_nvml_answers_every_question() -> None:
    backend = _real_nvml_or_skip()
    try:
        count = backend.device_count()
        if count == 0:
            skip_without_gpu("NVML present but no GPU")
        for index in range(count):
            ident = backend.identity(index)
            assert ident.uuid.startswith("GPU-")
            assert len(ident.pci) == 12 and ident.pci == ident.pci.lower()
            unsupported: set[str] = set()
            sample = sample_gpu(backend, index, unsupported)
            assert sample.temperature_c is not None and 0 < sample.temperature_c < 130
            assert sample.power_w is not None and sample.power_w > 0
            assert sample.errors == {}, sample.errors
    finally:
        backend.shutdown()


@pytest.mark.gpu
def test_real_nvml_link_states_remap_and_throttle() -> None:
    """The questions behind nvlink_down, no_spare_rows and sustained throttling, on a real GPU."""
    backend = _real_nvml_or_skip()
    try:
        if backend.device_count() == 0:
            skip_without_gpu("NVML present but no GPU")
        for index in range(backend.device_count()):
            try:
                states = backend.nvlink_states(index)
            except NvmlNotSupported:
                states = None  # a PCIe GPU without NVLink
            if states is not None:
                assert states and all(isinstance(up, bool) for up in states.values())
                assert all(0 <= link < 64 for link in states)
                errors = backend.nvlink_errors(index)
                assert errors["active_links"] == sum(states.values())
            try:
                remap = backend.remapped_rows(index)
            except NvmlNotSupported:
                continue  # before Ampere: no row remapper
            assert remap.failure is False, "a healthy test GPU has spare rows left"
            counters = backend.ecc_counters(index)
            assert not sram_over_limit(counters), f"a healthy test GPU is under the SRAM limit: {counters}"
            assert isinstance(backend.throttle_reasons(index), int)
    finally:
        backend.shutdown()


@pytest.mark.gpu
async def test_real_nvml_watcher_quiet_on_a_healthy_gpu() -> None:
    _real_nvml_or_skip().shutdown()
    out = Collect()
    watcher = NvmlWatcher(NvmlConfig(interval_s=0.5, temperature_c=120.0), "node-a", out)
    task = asyncio.create_task(watcher.run())
    try:
        await wait_for(lambda: watcher.polls >= 4, within_s=30)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert watcher.available is True and watcher.gpus
    stalled = [e for e in out.events if e.data.get("stalled")]
    assert not stalled and not out.of(Kind.GPU_MISSING)
