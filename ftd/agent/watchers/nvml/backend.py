"""The NVML backend seam: the synchronous questions the watcher asks about GPUs, and their answers.

:class:`NvmlBackend` asks small, index-based questions (inventory, ECC counters, remapped rows,
histogram, retired pages, temperature, throttle reasons, power, SM clocks, PCIe replays, the PCIe
link's current and maximum generation and width, NVLink error counters and per-link states, Xid
events; the driver, CUDA, VBIOS and serial for the inventory).
:class:`ftd.agent.watchers.nvml.real.RealNvml` answers
them through pynvml; :class:`ftd.agent.watchers.nvml.fake.FakeNvml` answers them from a script for
tests and benches.
A question the GPU cannot answer raises :class:`NvmlNotSupported` (the watcher remembers it and does
not ask again); a GPU that is gone raises :class:`NvmlGpuLost`. Every method may block: call it off
the event loop (:mod:`ftd.agent.watchers.nvml.worker`).

No pynvml here: the fake and the watcher import this module without NVML present.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

__all__ = [
    "THROTTLE_ALERT_REASONS",
    "GpuIdentity",
    "NvmlBackend",
    "NvmlError",
    "NvmlGpuLost",
    "NvmlNotSupported",
    "NvmlUnavailable",
    "PcieLinkInfo",
    "RemapInfo",
    "XidRecord",
    "throttle_names",
]


class NvmlError(Exception):
    """Any NVML failure the backend reports."""


class NvmlUnavailable(NvmlError):
    """NVML cannot be used at all (library missing, driver not loaded, init failed)."""


class NvmlNotSupported(NvmlError):
    """This GPU (or driver) does not answer this question."""


class NvmlGpuLost(NvmlError):
    """The GPU is gone (fallen off the bus, "GPU is lost", "GPU requires reset")."""


@dataclasses.dataclass(frozen=True, slots=True)
class GpuIdentity:
    index: int
    uuid: str
    pci: str  # lowercase dddd:bb:dd.f
    name: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class RemapInfo:
    corrected: int  # rows remapped because of correctable errors
    uncorrected: int  # rows remapped because of uncorrectable errors
    pending: bool  # a remap waits for the next GPU reset
    failure: bool  # a remap failed: the GPU ran out of spare rows


@dataclasses.dataclass(frozen=True, slots=True)
class PcieLinkInfo:
    """The GPU's PCIe link as NVML reports it (a GPU lowers its generation when idle)."""

    cur_gen: int
    max_gen: int
    cur_width: int
    max_width: int


@dataclasses.dataclass(frozen=True, slots=True)
class XidRecord:
    code: int
    uuid: str | None = None
    index: int | None = None


# Throttle ("clocks event") reason bits worth an alert (NVML's nvmlClocksEventReason* values):
# HW slowdown, SW thermal, HW thermal, HW power brake. SW power cap (0x4) is normal under load.
THROTTLE_ALERT_REASONS: dict[int, str] = {
    0x08: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}
_THROTTLE_NAMES: dict[int, str] = {
    0x01: "gpu_idle",
    0x02: "applications_clocks_setting",
    0x04: "sw_power_cap",
    0x10: "sync_boost",
    0x100: "display_clock_setting",
    **THROTTLE_ALERT_REASONS,
}


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in sorted(_THROTTLE_NAMES.items()) if mask & bit]


class NvmlBackend(Protocol):
    """Synchronous NVML questions by device index. Every method may block (call it off the loop)."""

    def init(self) -> None:
        """Raise :class:`NvmlUnavailable` when NVML cannot be used."""

    def shutdown(self) -> None: ...

    def device_count(self) -> int: ...

    def identity(self, index: int) -> GpuIdentity: ...

    def ecc_counters(self, index: int) -> dict[str, int]:
        """``{volatile,aggregate}_{sbe,dbe}`` and, where known, ``..._{sram,dram}`` split counters;
        ``sram_threshold_exceeded`` (1) where the driver says the GPU is past its SRAM error threshold."""

    def remapped_rows(self, index: int) -> RemapInfo: ...

    def remap_histogram(self, index: int) -> dict[str, int]:
        """Banks by spare rows left: ``max``, ``high``, ``partial``, ``low``, ``none``."""

    def retired_pages_pending(self, index: int) -> bool: ...

    def temperature_c(self, index: int) -> float: ...

    def throttle_reasons(self, index: int) -> int: ...

    def power_w(self, index: int) -> float: ...

    def sm_clocks_mhz(self, index: int) -> tuple[int, int]:
        """The SM clock now and its maximum, in MHz (a throttled GPU runs below its maximum)."""

    def pcie_replay_count(self, index: int) -> int: ...

    def pcie_link(self, index: int) -> PcieLinkInfo:
        """Current and maximum PCIe generation and width (``nvmlDeviceGetCurrPcieLinkGeneration`` ...)."""

    def nvlink_errors(self, index: int) -> dict[str, int]:
        """Error counters summed over active links (``replay``, ``recovery``, ``crc_flit``, ...)."""

    def nvlink_states(self, index: int) -> dict[int, bool]:
        """Link id -> active, for every link whose state NVML answers (NotSupported: no NVLink).

        A link whose state cannot be read this time is left out, never reported as inactive."""

    def xid_events_start(self) -> None:
        """Create the event set and register every device for Xid events (NotSupported if none)."""

    def xid_wait(self, timeout_ms: int) -> XidRecord | None:
        """One Xid event, or ``None`` after ``timeout_ms`` without one."""

    def xid_events_stop(self) -> None: ...

    # --- versions (the inventory, issue #36) ------------------------------------------------------

    def driver_version(self) -> str:
        """The driver's version (``nvmlSystemGetDriverVersion``: ``550.54.15``)."""

    def cuda_driver_version(self) -> str:
        """The CUDA version the driver supports (``nvmlSystemGetCudaDriverVersion_v2``: ``12.4``)."""

    def vbios_version(self, index: int) -> str:
        """The GPU's VBIOS (``nvmlDeviceGetVbiosVersion``: ``96.00.89.00.01``)."""

    def serial(self, index: int) -> str:
        """The board's serial number (``nvmlDeviceGetSerial``; NotSupported on some boards)."""
