"""A scriptable in-process NVML (:class:`FakeNvml`) for tests, benches and the simulator.

State is plain attributes on :class:`FakeGpu` objects that a test changes between polls: raise a
counter, set ``remap_pending``, heat a GPU, remove it (``vanish``: no longer enumerated) or make it
answer "GPU is lost" (``lost = True``), set the driver's SRAM threshold flag
(``sram_threshold_exceeded``), give it NVLink (``with_nvlink``) and take a link down
(``set_link(3, False)``), narrow its PCIe link (``pcie = PcieLinkInfo(5, 5, 8, 16)``; ``None``:
NotSupported), change its ``vbios`` or ``serial``, or the node's ``driver`` and ``cuda`` (``""``:
NotSupported). ``unsupported`` names backend methods that answer
NotSupported; ``block`` names methods that block until :meth:`FakeNvml.release` (or forever), so a
stalled probe can be tested. :meth:`FakeNvml.inject_xid` queues an Xid event. ``calls`` counts
every call by method name.

No pynvml here: this module must import without NVML present.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections import Counter

from ftd.agent.watchers.nvml.backend import (
    GpuIdentity,
    NvmlGpuLost,
    NvmlNotSupported,
    NvmlUnavailable,
    PcieLinkInfo,
    RemapInfo,
    XidRecord,
)

__all__ = ["FakeGpu", "FakeNvml"]


@dataclasses.dataclass
class FakeGpu:
    index: int
    uuid: str
    pci: str
    name: str = "NVIDIA H100 80GB HBM3"
    ecc: dict[str, int] = dataclasses.field(
        default_factory=lambda: {
            "volatile_sbe": 0,
            "volatile_dbe": 0,
            "aggregate_sbe": 0,
            "aggregate_dbe": 0,
            "volatile_sbe_sram": 0,
            "volatile_dbe_sram": 0,
            "volatile_sbe_dram": 0,
            "volatile_dbe_dram": 0,
        }
    )
    remap_corrected: int = 0
    remap_uncorrected: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    histogram: dict[str, int] = dataclasses.field(
        default_factory=lambda: {"max": 640, "high": 0, "partial": 0, "low": 0, "none": 0}
    )
    retired_pending: bool = False
    sram_threshold_exceeded: bool = False  # the driver's own SRAM threshold flag (ecc_counters)
    temperature_c: float = 40.0
    throttle: int = 0
    power_w: float = 70.0
    sm_clocks: tuple[int, int] | None = None  # (SM MHz now, its maximum); None: NotSupported
    pcie_replay: int = 0
    pcie: PcieLinkInfo | None = dataclasses.field(default_factory=lambda: PcieLinkInfo(5, 5, 16, 16))
    nvlink: dict[str, int] | None = None  # None: NotSupported (no NVLink)
    nvlink_links: dict[int, bool] | None = None  # link id -> active; None: NotSupported (no NVLink)
    vbios: str = "96.00.89.00.01"
    serial: str = ""  # "" : a serial made from the index (FakeNvml.__init__)
    lost: bool = False  # every call answers "GPU is lost"
    unsupported: set[str] = dataclasses.field(default_factory=set)
    block: set[str] = dataclasses.field(default_factory=set)

    def bump_ecc(self, kind: str = "sbe", n: int = 1, location: str = "dram") -> None:
        """Count ``n`` new errors the way NVML does (volatile, aggregate, and the location split)."""
        for scope in ("volatile", "aggregate"):
            self.ecc[f"{scope}_{kind}"] = self.ecc.get(f"{scope}_{kind}", 0) + n
            key = f"{scope}_{kind}_{location}"
            self.ecc[key] = self.ecc.get(key, 0) + n

    def with_nvlink(self, links: int = 18) -> FakeGpu:
        """Give this GPU ``links`` active NVLink links and zeroed error counters."""
        self.nvlink_links = dict.fromkeys(range(links), True)
        self.nvlink = {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0, "ecc_data": 0}
        return self

    def set_link(self, link: int, active: bool) -> None:
        """Take an NVLink link down (``active=False``) or bring it back."""
        assert self.nvlink_links is not None, "call with_nvlink() first"
        self.nvlink_links[link] = active


class FakeNvml:
    """:class:`~ftd.agent.watchers.nvml.backend.NvmlBackend` with scripted answers. Thread-safe enough for
    the watcher (one probe thread per GPU, one Xid thread)."""

    def __init__(self, count: int = 2, *, unavailable: str | None = None) -> None:
        self.gpus: list[FakeGpu] = [
            FakeGpu(
                index=i,
                uuid=f"GPU-fake-{i:04d}-0000-0000-000000000000",
                pci=f"0000:{0x18 + i * 0x10:02x}:00.0",
                serial=f"165202{i:07d}",
            )
            for i in range(count)
        ]
        self.unavailable = unavailable
        self.xid_supported = True
        self.driver = "550.54.15"  # driver_version(); "" answers NotSupported
        self.cuda = "12.4"  # cuda_driver_version(); "" answers NotSupported
        self.calls: Counter[str] = Counter()
        self.block_global: set[str] = set()  # methods that block for every GPU
        self._release = threading.Event()
        self._xids: queue.Queue[XidRecord] = queue.Queue()
        self.initialized = False
        self.shut_down = False
        self._lock = threading.Lock()

    # --- scripting --------------------------------------------------------------------------------

    def gpu(self, index: int) -> FakeGpu:
        return next(g for g in self.gpus if g.index == index)

    def vanish(self, index: int) -> FakeGpu:
        """Remove a GPU from enumeration (re-indexes the rest, as a re-enumeration would)."""
        gone = self.gpu(index)
        self.gpus.remove(gone)
        for i, gpu in enumerate(self.gpus):
            gpu.index = i
        return gone

    def release(self) -> None:
        """Let every blocked call return (and every later one pass)."""
        self._release.set()

    def inject_xid(self, code: int, index: int = 0) -> None:
        gpu = self.gpu(index)
        self._xids.put(XidRecord(code=code, uuid=gpu.uuid, index=index))

    # --- helpers ----------------------------------------------------------------------------------

    def _enter(self, method: str, index: int | None = None) -> FakeGpu | None:
        with self._lock:
            self.calls[method] += 1
        if not self.initialized:
            raise NvmlUnavailable("Uninitialized")
        gpu = None
        if index is not None:
            try:
                gpu = self.gpu(index)
            except StopIteration:
                raise NvmlGpuLost(f"no GPU at index {index}") from None
            if method in gpu.block:
                self._release.wait()
        if method in self.block_global:
            self._release.wait()
        if gpu is not None:
            if gpu.lost:
                raise NvmlGpuLost("GPU is lost")
            if method in gpu.unsupported:
                raise NvmlNotSupported("Not Supported")
        return gpu

    # --- backend ----------------------------------------------------------------------------------

    def init(self) -> None:
        self.calls["init"] += 1
        if "init" in self.block_global:
            self._release.wait()
        if self.unavailable is not None:
            raise NvmlUnavailable(self.unavailable)
        self.initialized = True

    def shutdown(self) -> None:
        self.shut_down = True

    def device_count(self) -> int:
        self._enter("device_count")
        return len(self.gpus)

    def identity(self, index: int) -> GpuIdentity:
        gpu = self._enter("identity", index)
        assert gpu is not None
        return GpuIdentity(index=gpu.index, uuid=gpu.uuid, pci=gpu.pci, name=gpu.name)

    def ecc_counters(self, index: int) -> dict[str, int]:
        gpu = self._enter("ecc_counters", index)
        assert gpu is not None
        counters = dict(gpu.ecc)
        if gpu.sram_threshold_exceeded:
            counters["sram_threshold_exceeded"] = 1
        return counters

    def remapped_rows(self, index: int) -> RemapInfo:
        gpu = self._enter("remapped_rows", index)
        assert gpu is not None
        return RemapInfo(gpu.remap_corrected, gpu.remap_uncorrected, gpu.remap_pending, gpu.remap_failure)

    def remap_histogram(self, index: int) -> dict[str, int]:
        gpu = self._enter("remap_histogram", index)
        assert gpu is not None
        return dict(gpu.histogram)

    def retired_pages_pending(self, index: int) -> bool:
        gpu = self._enter("retired_pages_pending", index)
        assert gpu is not None
        return gpu.retired_pending

    def temperature_c(self, index: int) -> float:
        gpu = self._enter("temperature_c", index)
        assert gpu is not None
        return gpu.temperature_c

    def throttle_reasons(self, index: int) -> int:
        gpu = self._enter("throttle_reasons", index)
        assert gpu is not None
        return gpu.throttle

    def power_w(self, index: int) -> float:
        gpu = self._enter("power_w", index)
        assert gpu is not None
        return gpu.power_w

    def sm_clocks_mhz(self, index: int) -> tuple[int, int]:
        gpu = self._enter("sm_clocks_mhz", index)
        assert gpu is not None
        if gpu.sm_clocks is None:
            raise NvmlNotSupported("sm clocks not supported (fake)")
        return gpu.sm_clocks

    def pcie_replay_count(self, index: int) -> int:
        gpu = self._enter("pcie_replay_count", index)
        assert gpu is not None
        return gpu.pcie_replay

    def pcie_link(self, index: int) -> PcieLinkInfo:
        gpu = self._enter("pcie_link", index)
        assert gpu is not None
        if gpu.pcie is None:
            raise NvmlNotSupported("Not Supported")
        return gpu.pcie

    def nvlink_errors(self, index: int) -> dict[str, int]:
        gpu = self._enter("nvlink_errors", index)
        assert gpu is not None
        if gpu.nvlink is None:
            raise NvmlNotSupported("Not Supported")
        out = dict(gpu.nvlink)
        if gpu.nvlink_links is not None:  # as the real backend: counted over active links
            out["active_links"] = sum(gpu.nvlink_links.values())
        return out

    def nvlink_states(self, index: int) -> dict[int, bool]:
        gpu = self._enter("nvlink_states", index)
        assert gpu is not None
        if gpu.nvlink_links is None:
            raise NvmlNotSupported("Not Supported")
        return dict(gpu.nvlink_links)

    def xid_events_start(self) -> None:
        self._enter("xid_events_start")
        if not self.xid_supported:
            raise NvmlNotSupported("Not Supported")

    def xid_wait(self, timeout_ms: int) -> XidRecord | None:
        try:
            return self._xids.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            return None

    def xid_events_stop(self) -> None:
        self.calls["xid_events_stop"] += 1

    # --- versions -----------------------------------------------------------------------------------

    def driver_version(self) -> str:
        self._enter("driver_version")
        if not self.driver:
            raise NvmlNotSupported("Not Supported")
        return self.driver

    def cuda_driver_version(self) -> str:
        self._enter("cuda_driver_version")
        if not self.cuda:
            raise NvmlNotSupported("Not Supported")
        return self.cuda

    def vbios_version(self, index: int) -> str:
        gpu = self._enter("vbios_version", index)
        assert gpu is not None
        return gpu.vbios

    def serial(self, index: int) -> str:
        gpu = self._enter("serial", index)
        assert gpu is not None
        return gpu.serial
