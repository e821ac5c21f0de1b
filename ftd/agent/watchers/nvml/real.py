"""The NVML backend through pynvml (nvidia-ml-py), the only module importing it (docs/architecture.md §3.4).

:class:`RealNvml` answers :class:`~ftd.agent.watchers.nvml.backend.NvmlBackend` questions through
pynvml, imported lazily in :meth:`RealNvml.init` so that the agent runs (with the GPU watcher
disabled) where nvidia-ml-py or the driver is missing. pynvml's errors are translated into the
seam's: NOT_SUPPORTED -> :class:`NvmlNotSupported`, GPU_IS_LOST / RESET_REQUIRED ->
:class:`NvmlGpuLost`, anything else -> :class:`NvmlError`. PCI bus ids come back in ftd's
canonical form (:func:`ftd.pci.normalize_pci`).
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable
from typing import Any, TypeVar

from ftd.agent.watchers.nvml.backend import (
    GpuIdentity,
    NvmlError,
    NvmlGpuLost,
    NvmlNotSupported,
    NvmlUnavailable,
    PcieLinkInfo,
    RemapInfo,
    XidRecord,
)
from ftd.logs import get_logger
from ftd.pci import normalize_pci

__all__ = ["RealNvml", "cuda_text"]

log = get_logger(__name__)

_T = TypeVar("_T")


class RealNvml:
    """:class:`NvmlBackend` through pynvml (nvidia-ml-py). Imports pynvml lazily in :meth:`init`."""

    def __init__(self) -> None:
        self._nv: Any = None
        self._handles: dict[int, Any] = {}
        self._event_set: Any = None
        self._uuid_by_handle: dict[int, str] = {}

    def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        nv = self._nv
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            value = getattr(exc, "value", None)
            if value == nv.NVML_ERROR_NOT_SUPPORTED:
                raise NvmlNotSupported(str(exc)) from None
            if value in (nv.NVML_ERROR_GPU_IS_LOST, nv.NVML_ERROR_RESET_REQUIRED):
                raise NvmlGpuLost(str(exc)) from None
            raise NvmlError(str(exc)) from None

    def init(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailable(f"pynvml (nvidia-ml-py) not installed: {exc}") from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"nvmlInit failed: {exc}") from None
        except OSError as exc:  # pragma: no cover - odd loader failures
            raise NvmlUnavailable(f"cannot load libnvidia-ml: {exc}") from None
        self._nv = pynvml

    def shutdown(self) -> None:
        if self._nv is not None:
            with contextlib.suppress(Exception):
                self._nv.nvmlShutdown()

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = self._handles[index] = self._call(self._nv.nvmlDeviceGetHandleByIndex, index)
        return handle

    def device_count(self) -> int:
        count: int = self._call(self._nv.nvmlDeviceGetCount)
        return count

    def identity(self, index: int) -> GpuIdentity:
        nv = self._nv
        handle = self._call(nv.nvmlDeviceGetHandleByIndex, index)
        self._handles[index] = handle
        uuid = _text(self._call(nv.nvmlDeviceGetUUID, handle))
        pci_info = self._call(nv.nvmlDeviceGetPciInfo, handle)
        bus_id = _text(pci_info.busId)
        pci = normalize_pci(bus_id) or bus_id.strip().lower()
        name = _text(self._call(nv.nvmlDeviceGetName, handle))
        return GpuIdentity(index=index, uuid=uuid, pci=pci, name=name)

    def ecc_counters(self, index: int) -> dict[str, int]:
        nv, handle = self._nv, self._handle(index)
        out: dict[str, int] = {}
        kinds = (("sbe", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED), ("dbe", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED))
        scopes = (("volatile", nv.NVML_VOLATILE_ECC), ("aggregate", nv.NVML_AGGREGATE_ECC))
        for scope, counter in scopes:
            for kind, error_type in kinds:
                out[f"{scope}_{kind}"] = int(
                    self._call(nv.nvmlDeviceGetTotalEccErrors, handle, error_type, counter)
                )
                for loc_name, loc in (
                    ("sram", nv.NVML_MEMORY_LOCATION_SRAM),
                    ("dram", nv.NVML_MEMORY_LOCATION_DRAM),
                ):
                    with contextlib.suppress(NvmlNotSupported, NvmlError):
                        out[f"{scope}_{kind}_{loc_name}"] = int(
                            self._call(nv.nvmlDeviceGetMemoryErrorCounter, handle, error_type, counter, loc)
                        )
        self._sram_status(handle, out)
        return out

    def _sram_status(self, handle: Any, out: dict[str, int]) -> None:
        """The newer SRAM answer (``nvmlDeviceGetSramEccErrorStatus``, Ampere and later, as root):
        aggregate uncorrectable SRAM errors (parity + SEC-DED) and the driver's threshold flag. Kept
        out when the driver, the GPU or the agent's rights do not allow it."""
        nv = self._nv
        struct = getattr(nv, "c_nvmlEccSramErrorStatus_v1_t", None)
        if struct is None:
            return
        status = struct()
        status.version = nv.nvmlEccSramErrorStatus_v1
        try:
            self._call(nv.nvmlDeviceGetSramEccErrorStatus, handle, ctypes.byref(status))
        except NvmlError:
            return
        uncorrectable = int(status.aggregateUncParity) + int(status.aggregateUncSecDed)
        out["aggregate_dbe_sram"] = max(out.get("aggregate_dbe_sram", 0), uncorrectable)
        if status.bThresholdExceeded:
            out["sram_threshold_exceeded"] = 1

    def remapped_rows(self, index: int) -> RemapInfo:
        corr, unc, pending, failure = self._call(self._nv.nvmlDeviceGetRemappedRows, self._handle(index))
        return RemapInfo(int(corr), int(unc), bool(pending), bool(failure))

    def remap_histogram(self, index: int) -> dict[str, int]:
        values = self._call(self._nv.nvmlDeviceGetRowRemapperHistogram, self._handle(index))
        return {key: int(getattr(values, key)) for key in ("max", "high", "partial", "low", "none")}

    def retired_pages_pending(self, index: int) -> bool:
        return bool(self._call(self._nv.nvmlDeviceGetRetiredPagesPendingStatus, self._handle(index)))

    def temperature_c(self, index: int) -> float:
        nv = self._nv
        return float(self._call(nv.nvmlDeviceGetTemperature, self._handle(index), nv.NVML_TEMPERATURE_GPU))

    def throttle_reasons(self, index: int) -> int:
        nv = self._nv
        fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or (
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        return int(self._call(fn, self._handle(index)))

    def power_w(self, index: int) -> float:
        return float(self._call(self._nv.nvmlDeviceGetPowerUsage, self._handle(index))) / 1000.0

    def sm_clocks_mhz(self, index: int) -> tuple[int, int]:
        nv, handle = self._nv, self._handle(index)
        now = int(self._call(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM))
        return now, int(self._call(nv.nvmlDeviceGetMaxClockInfo, handle, nv.NVML_CLOCK_SM))

    def pcie_replay_count(self, index: int) -> int:
        return int(self._call(self._nv.nvmlDeviceGetPcieReplayCounter, self._handle(index)))

    def pcie_link(self, index: int) -> PcieLinkInfo:
        nv, handle = self._nv, self._handle(index)
        return PcieLinkInfo(
            cur_gen=int(self._call(nv.nvmlDeviceGetCurrPcieLinkGeneration, handle)),
            max_gen=int(self._call(nv.nvmlDeviceGetMaxPcieLinkGeneration, handle)),
            cur_width=int(self._call(nv.nvmlDeviceGetCurrPcieLinkWidth, handle)),
            max_width=int(self._call(nv.nvmlDeviceGetMaxPcieLinkWidth, handle)),
        )

    def nvlink_errors(self, index: int) -> dict[str, int]:
        nv, handle = self._nv, self._handle(index)
        names = {
            "replay": nv.NVML_NVLINK_ERROR_DL_REPLAY,
            "recovery": nv.NVML_NVLINK_ERROR_DL_RECOVERY,
            "crc_flit": nv.NVML_NVLINK_ERROR_DL_CRC_FLIT,
            "crc_data": nv.NVML_NVLINK_ERROR_DL_CRC_DATA,
            "ecc_data": nv.NVML_NVLINK_ERROR_DL_ECC_DATA,
        }
        totals = dict.fromkeys(names, 0)
        active = 0
        for link, up in self.nvlink_states(index).items():
            if not up:
                continue
            active += 1
            for name, counter in names.items():
                with contextlib.suppress(NvmlNotSupported, NvmlError):
                    totals[name] += int(self._call(nv.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter))
        # No active link is an answer (0 errors), not NotSupported: NotSupported is remembered for
        # good, and the links may come back.
        totals["active_links"] = active
        return totals

    def nvlink_states(self, index: int) -> dict[int, bool]:
        """Every link's state through ``nvmlDeviceGetNvLinkState``. NOT_SUPPORTED on link 0: no
        NVLink (:class:`NvmlNotSupported`); NOT_SUPPORTED or INVALID_ARGUMENT on a later link: past
        this GPU's last link; another error on one link: that link is left out (unknown, not down)."""
        nv, handle = self._nv, self._handle(index)
        states: dict[int, bool] = {}
        for link in range(int(nv.NVML_NVLINK_MAX_LINKS)):
            try:
                states[link] = bool(nv.nvmlDeviceGetNvLinkState(handle, link))
            except nv.NVMLError as exc:
                value = getattr(exc, "value", None)
                if value in (nv.NVML_ERROR_GPU_IS_LOST, nv.NVML_ERROR_RESET_REQUIRED):
                    raise NvmlGpuLost(str(exc)) from None
                if value == nv.NVML_ERROR_NOT_SUPPORTED and link == 0:
                    raise NvmlNotSupported("NVLink not supported") from None
                if value in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_INVALID_ARGUMENT):
                    break  # past the last link this GPU has
        if not states:
            raise NvmlError("no NVLink link state could be read")
        return states

    def xid_events_start(self) -> None:
        nv = self._nv
        event_set = self._call(nv.nvmlEventSetCreate)
        registered = 0
        for index in range(self.device_count()):
            handle = self._handle(index)
            try:
                self._call(nv.nvmlDeviceRegisterEvents, handle, nv.nvmlEventTypeXidCriticalError, event_set)
            except NvmlError as exc:
                log.warning("nvml_xid_register_failed", index=index, error=str(exc))
                continue
            registered += 1
            with contextlib.suppress(NvmlError):
                self._uuid_by_handle[_handle_key(handle)] = _text(self._call(nv.nvmlDeviceGetUUID, handle))
        if not registered:
            with contextlib.suppress(Exception):
                nv.nvmlEventSetFree(event_set)
            raise NvmlNotSupported("no GPU accepts Xid event registration")
        self._event_set = event_set

    def xid_wait(self, timeout_ms: int) -> XidRecord | None:
        nv = self._nv
        try:
            data = nv.nvmlEventSetWait(self._event_set, timeout_ms)
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) == nv.NVML_ERROR_TIMEOUT:
                return None
            raise NvmlError(str(exc)) from None
        if not data.eventType & nv.nvmlEventTypeXidCriticalError:
            return None
        uuid = self._uuid_by_handle.get(_handle_key(data.device))
        if uuid is None:
            with contextlib.suppress(Exception):
                uuid = _text(nv.nvmlDeviceGetUUID(data.device))
        return XidRecord(code=int(data.eventData), uuid=uuid)

    def xid_events_stop(self) -> None:
        if self._event_set is not None:
            with contextlib.suppress(Exception):
                self._nv.nvmlEventSetFree(self._event_set)
            self._event_set = None

    def driver_version(self) -> str:
        return _text(self._call(self._nv.nvmlSystemGetDriverVersion))

    def cuda_driver_version(self) -> str:
        nv = self._nv
        fn = getattr(nv, "nvmlSystemGetCudaDriverVersion_v2", None) or nv.nvmlSystemGetCudaDriverVersion
        return cuda_text(int(self._call(fn)))

    def vbios_version(self, index: int) -> str:
        return _text(self._call(self._nv.nvmlDeviceGetVbiosVersion, self._handle(index)))

    def serial(self, index: int) -> str:
        return _text(self._call(self._nv.nvmlDeviceGetSerial, self._handle(index)))


def cuda_text(version: int) -> str:
    """NVML's CUDA version number as people write it: 12040 -> ``12.4``, 12020 -> ``12.2``."""
    return f"{version // 1000}.{version % 1000 // 10}"


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _handle_key(handle: Any) -> int:
    """A hashable key for a ctypes device handle (the pointer value)."""
    import ctypes

    with contextlib.suppress(Exception):
        return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
    return id(handle)
