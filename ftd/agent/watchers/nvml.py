"""GPU health through NVML: the only module that imports ``pynvml`` (DESIGN §3).

Two halves:

* **Backend seam** (:class:`NvmlBackend`): small, synchronous, index-based questions (inventory,
  ECC counters, remapped rows, histogram, retired pages, temperature, throttle reasons, power, PCIe
  replays, NVLink error counters, Xid events). :class:`RealNvml` answers them through pynvml;
  :class:`ftd.agent.watchers.nvml_fake.FakeNvml` answers them from a script for tests and benches.
  A question the GPU cannot answer raises :class:`NvmlNotSupported` (remembered: not asked again);
  a GPU that is gone raises :class:`NvmlGpuLost`.
* **Watcher** (:class:`NvmlWatcher`): polls every ``interval_s`` and emits on *change* only.

NVML can block for seconds or forever on a sick GPU, so every backend call runs off the event loop
in a dedicated daemon thread, never the loop's default executor (a stuck call would hold one of its
few workers forever). One GPU's whole probe (about a dozen calls, microseconds each on a healthy
H100) runs in one thread under one deadline (``call_timeout_s``); the probe records which call it is
in, so a stalled probe is reported as ``gpu_health`` with ``stalled=true`` and the call's name. While
a GPU's probe is still stuck that GPU is skipped (at most one outstanding probe per GPU, so threads
never pile up); when it finally returns, a ``stalled=false`` event closes the episode. Inventory
(device count + identities) is probed the same way under its own key.

Events (``source="nvml"``; each carries ``uuid``, ``index``, ``pci`` as lowercase ``dddd:bb:dd.f``):

* ``ecc``: any ECC counter rose (SBE: warning, DBE: error), with deltas and all counters.
* ``row_remap``: pending or failure newly set, or uncorrectable/correctable remaps grew; histogram.
* ``thermal``: temperature reached ``temperature_c`` (cleared below it minus the hysteresis), or a
  thermal / power-brake / hardware-slowdown throttle reason newly set; clearing is an ``info`` event.
* ``gpu_missing``: fewer GPUs than ``expected_gpus``, a UUID from the first inventory gone, or a
  GPU answering "GPU is lost". Once per episode.
* ``gpu_health``: stalled probes, PCIe replay bursts, NVLink error-counter increases, retired pages
  pending.
* ``xid``: Xid errors from NVML's event API (``data.source = "nvml"``), read by a thread that
  waits on the event set with a short timeout so it can stop.

The first sample of a GPU is its baseline: counters are not reported, but *states* that need a
human (volatile DBE > 0, remap pending/failure, retired pages pending) are reported once with
``initial=true``.

Without NVML (library missing, no driver) the watcher logs one line
``NVML unavailable: <reason>; GPU watcher disabled`` and idles until cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import structlog

from ftd.agent.watchers.base import Emit
from ftd.catalog import load_xid_catalog
from ftd.config import NvmlConfig
from ftd.events import Event, Kind, Severity, make_event
from ftd.pci import normalize_pci

__all__ = [
    "THROTTLE_ALERT_REASONS",
    "GpuIdentity",
    "GpuSample",
    "NvmlBackend",
    "NvmlError",
    "NvmlGpuLost",
    "NvmlNotSupported",
    "NvmlUnavailable",
    "NvmlWatcher",
    "RealNvml",
    "RemapInfo",
    "XidRecord",
    "sample_gpu",
]

log = structlog.get_logger(__name__)

_T = TypeVar("_T")


# --- the seam ------------------------------------------------------------------------------------


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
        """``{volatile,aggregate}_{sbe,dbe}`` and, where known, ``..._{sram,dram}`` split counters."""

    def remapped_rows(self, index: int) -> RemapInfo: ...

    def remap_histogram(self, index: int) -> dict[str, int]:
        """Banks by spare rows left: ``max``, ``high``, ``partial``, ``low``, ``none``."""

    def retired_pages_pending(self, index: int) -> bool: ...

    def temperature_c(self, index: int) -> float: ...

    def throttle_reasons(self, index: int) -> int: ...

    def power_w(self, index: int) -> float: ...

    def pcie_replay_count(self, index: int) -> int: ...

    def nvlink_errors(self, index: int) -> dict[str, int]:
        """Error counters summed over active links (``replay``, ``recovery``, ``crc_flit``, ...)."""

    def xid_events_start(self) -> None:
        """Create the event set and register every device for Xid events (NotSupported if none)."""

    def xid_wait(self, timeout_ms: int) -> XidRecord | None:
        """One Xid event, or ``None`` after ``timeout_ms`` without one."""

    def xid_events_stop(self) -> None: ...


# --- pynvml --------------------------------------------------------------------------------------


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
        return out

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

    def pcie_replay_count(self, index: int) -> int:
        return int(self._call(self._nv.nvmlDeviceGetPcieReplayCounter, self._handle(index)))

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
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                if not self._call(nv.nvmlDeviceGetNvLinkState, handle, link):
                    continue
            except (NvmlNotSupported, NvmlError):
                if link == 0:
                    raise NvmlNotSupported("NVLink not supported") from None
                break  # past the last link this GPU has
            active += 1
            for name, counter in names.items():
                with contextlib.suppress(NvmlNotSupported, NvmlError):
                    totals[name] += int(self._call(nv.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter))
        if not active:
            raise NvmlNotSupported("no active NVLink")
        totals["active_links"] = active
        return totals

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


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _handle_key(handle: Any) -> int:
    """A hashable key for a ctypes device handle (the pointer value)."""
    import ctypes

    with contextlib.suppress(Exception):
        return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
    return id(handle)


# --- one GPU's probe -----------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class GpuSample:
    """What one probe read. ``None``: the GPU does not support that question (or it failed)."""

    index: int
    ecc: dict[str, int] | None = None
    remap: RemapInfo | None = None
    histogram: dict[str, int] | None = None
    retired_pending: bool | None = None
    temperature_c: float | None = None
    throttle: int | None = None
    power_w: float | None = None
    pcie_replay: int | None = None
    nvlink: dict[str, int] | None = None
    errors: dict[str, str] = dataclasses.field(default_factory=dict)


_PROBES: tuple[tuple[str, str, str], ...] = (
    # (sample field, backend method, name reported in events)
    ("ecc", "ecc_counters", "ecc_counters"),
    ("remap", "remapped_rows", "remapped_rows"),
    ("histogram", "remap_histogram", "remap_histogram"),
    ("retired_pending", "retired_pages_pending", "retired_pages_pending"),
    ("temperature_c", "temperature_c", "temperature"),
    ("throttle", "throttle_reasons", "throttle_reasons"),
    ("power_w", "power_w", "power"),
    ("pcie_replay", "pcie_replay_count", "pcie_replay_counter"),
    ("nvlink", "nvlink_errors", "nvlink_errors"),
)


class _Tracker:
    """Which call a probe thread is in (read by the loop when the deadline passes)."""

    __slots__ = ("call",)

    def __init__(self) -> None:
        self.call = ""


def sample_gpu(
    backend: NvmlBackend,
    index: int,
    unsupported: set[str] | None = None,
    tracker: _Tracker | None = None,
) -> GpuSample:
    """Ask every question about one GPU (blocking). NotSupported answers are added to
    ``unsupported`` so they are not asked again; :class:`NvmlGpuLost` propagates."""
    sample = GpuSample(index=index)
    skip = unsupported if unsupported is not None else set()
    for field, method, call in _PROBES:
        if call in skip:
            continue
        if tracker is not None:
            tracker.call = call
        try:
            setattr(sample, field, getattr(backend, method)(index))
        except NvmlNotSupported:
            skip.add(call)
        except NvmlGpuLost:
            raise
        except NvmlError as exc:
            sample.errors[call] = str(exc)
    return sample


class _Worker:
    """One daemon thread per probe key (a GPU, the inventory), reused poll after poll.

    Polling then creates no threads (8 GPUs at 1 Hz would otherwise start 8 threads a second), and a
    probe stuck inside NVML blocks only its own GPU's worker; the watcher never queues a second
    probe behind a stuck one (``_BUSY``), so jobs never pile up either.
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def close(self) -> None:
        self._jobs.put(None)


class _Probe:
    """One outstanding blocking job on its key's worker thread, awaitable from the loop."""

    def __init__(
        self, key: str, fn: Callable[[_Tracker], Any], loop: asyncio.AbstractEventLoop, worker: _Worker
    ) -> None:
        self.key = key
        self.tracker = _Tracker()
        self.future: asyncio.Future[Any] = loop.create_future()
        self.finished = threading.Event()  # set by the worker thread, whatever the outcome
        self.started = time.monotonic()
        self.stalled_reported = False

        def target() -> None:
            try:
                result = fn(self.tracker)
            except BaseException as exc:
                loop.call_soon_threadsafe(_settle, self.future, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, self.future, result, None)
            finally:
                self.finished.set()

        worker.submit(target)


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


# --- the watcher ---------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _GpuState:
    ident: GpuIdentity
    last: GpuSample | None = None
    hot: bool = False
    lost: bool = False
    unsupported: set[str] = dataclasses.field(default_factory=set)


class NvmlWatcher:
    """Polls every GPU through an :class:`NvmlBackend`; see the module docstring."""

    name = "nvml"

    def __init__(
        self,
        cfg: NvmlConfig,
        node: str,
        emit: Emit,
        *,
        backend: NvmlBackend | None = None,
    ) -> None:
        self.cfg = cfg
        self.node = node
        self._emit = emit
        self.backend: NvmlBackend = backend if backend is not None else RealNvml()
        self.gpus: dict[str, _GpuState] = {}  # by uuid
        self.inventory: dict[str, GpuIdentity] = {}  # the first inventory: UUIDs this node should keep
        self.available: bool | None = None  # None until init was tried
        self.disabled_reason: str | None = None
        self.polls = 0
        self.events = 0
        self.last_progress = time.monotonic()
        self._probes: dict[str, _Probe] = {}
        self._workers: dict[str, _Worker] = {}
        self._count_low = False
        self._present: list[str] = []  # UUIDs in the latest inventory, in index order
        self._inventory_stalled = False
        self._xid_thread: threading.Thread | None = None
        self._xid_stop = threading.Event()
        self.xid_supported: bool | None = None

    # --- public -----------------------------------------------------------------------------------

    def outstanding_probes(self) -> int:
        return sum(1 for p in self._probes.values() if not p.finished.is_set())

    async def run(self) -> None:
        if not self.cfg.enabled:
            log.info("nvml_watcher_disabled", reason="agent.nvml.enabled = false")
            await asyncio.Event().wait()
        init = await self._guarded("init", lambda _t: self.backend.init())
        if isinstance(init, BaseException) or init is _STALLED:
            reason = "nvmlInit did not return" if init is _STALLED else str(init)
            self.available, self.disabled_reason = False, reason
            log.warning(f"NVML unavailable: {reason}; GPU watcher disabled")
            await asyncio.Event().wait()  # idle until cancelled; the agent's other watchers go on
        self.available = True
        queue: asyncio.Queue[XidRecord] = asyncio.Queue(maxsize=10000)
        try:
            if self.cfg.xid_events:
                await self._start_xid_thread(queue)
            while True:
                await self.poll_once()
                self.last_progress = time.monotonic()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.cfg.interval_s):
                        while True:
                            record = await queue.get()
                            await self._handle_xid(record)
        finally:
            self._close()

    async def poll_once(self) -> None:
        """One pass: inventory, then one probe per GPU (concurrently, each under the deadline)."""
        self.polls += 1
        inventory = await self._guarded("inventory", self._read_inventory)
        if isinstance(inventory, list):
            await self._check_inventory(inventory)
            self._inventory_stalled = False
        elif inventory is _STALLED and not self._inventory_stalled:
            self._inventory_stalled = True
            call = self._probes["inventory"].tracker.call
            await self._send_node(
                Kind.GPU_HEALTH,
                Severity.ERROR,
                {"stalled": True, "call": call, "gpu": None, "deadline_s": self.cfg.call_timeout_s},
            )
        elif isinstance(inventory, BaseException):
            log.warning("nvml_inventory_failed", error=str(inventory))
        states = [self.gpus[u] for u in self._present if u in self.gpus]
        results = await asyncio.gather(*(self._probe_gpu(s) for s in states))
        for state, result in zip(states, results, strict=True):
            if isinstance(result, GpuSample):
                if state.lost:
                    log.info("nvml_gpu_back", uuid=state.ident.uuid)
                    state.lost = False
                await self._diff(state, result)
            elif isinstance(result, NvmlGpuLost):
                await self._gpu_lost(state, str(result))
            elif isinstance(result, BaseException):
                log.warning("nvml_probe_failed", uuid=state.ident.uuid, error=str(result))

    # --- probing ----------------------------------------------------------------------------------

    async def _guarded(self, key: str, fn: Callable[[_Tracker], _T]) -> _T | BaseException | object:
        """Run ``fn`` in a thread under the deadline. Returns its result, its exception, or
        ``_STALLED``; ``_BUSY`` when the previous probe under ``key`` is still stuck."""
        previous = self._probes.get(key)
        if previous is not None:
            if not previous.future.done():
                return _BUSY
            del self._probes[key]
        probe = _Probe(key, fn, asyncio.get_running_loop(), self._worker(key))
        self._probes[key] = probe
        return await self._await_probe(probe)

    def _worker(self, key: str) -> _Worker:
        worker = self._workers.get(key)
        if worker is None:
            worker = self._workers[key] = _Worker(f"ftd-nvml-{key}")
        return worker

    async def _await_probe(self, probe: _Probe) -> object:
        done, _ = await asyncio.wait({probe.future}, timeout=self.cfg.call_timeout_s)
        if not done:
            return _STALLED
        del self._probes[probe.key]
        exc = probe.future.exception()
        return exc if exc is not None else probe.future.result()

    def _read_inventory(self, tracker: _Tracker) -> list[GpuIdentity]:
        tracker.call = "device_count"
        count = self.backend.device_count()
        out = []
        for index in range(count):
            tracker.call = "identity"
            try:
                out.append(self.backend.identity(index))
            except NvmlGpuLost:
                continue
        return out

    async def _probe_gpu(self, state: _GpuState) -> Any:
        key = f"gpu-{state.ident.uuid}"
        stuck = self._probes.get(key)
        if stuck is not None:
            if not stuck.future.done():
                return _BUSY  # still stuck: do not start a second thread for this GPU
            # the stuck probe came back since the last poll: close the episode, then probe afresh
            del self._probes[key]
            await self._stall_over(state, stuck)
        index = state.ident.index
        probe = _Probe(
            key,
            lambda t: sample_gpu(self.backend, index, state.unsupported, t),
            asyncio.get_running_loop(),
            self._worker(key),
        )
        self._probes[key] = probe
        result = await self._await_probe(probe)
        if result is _STALLED and not probe.stalled_reported:
            probe.stalled_reported = True
            await self._send(
                Kind.GPU_HEALTH,
                Severity.ERROR,
                state.ident,
                {
                    "stalled": True,
                    "call": probe.tracker.call,
                    "gpu": state.ident.index,
                    "deadline_s": self.cfg.call_timeout_s,
                },
            )
        return result

    async def _stall_over(self, state: _GpuState, probe: _Probe) -> None:
        await self._send(
            Kind.GPU_HEALTH,
            Severity.INFO,
            state.ident,
            {
                "stalled": False,
                "call": probe.tracker.call,
                "gpu": state.ident.index,
                "stalled_for_s": round(time.monotonic() - probe.started, 3),
            },
        )

    # --- inventory --------------------------------------------------------------------------------

    async def _check_inventory(self, found: list[GpuIdentity]) -> None:
        by_uuid = {g.uuid: g for g in found}
        self._present = list(by_uuid)
        first = not self.inventory
        if first:
            self.inventory = dict(by_uuid)
            log.info("nvml_inventory", gpus=[dataclasses.asdict(g) for g in found])
        for uuid, ident in by_uuid.items():
            state = self.gpus.get(uuid)
            if state is None:
                self.gpus[uuid] = _GpuState(ident=ident)
            else:
                state.ident = ident  # index may change after a re-enumeration (lost clears on a good probe)
        for uuid in self.inventory:
            state = self.gpus.get(uuid)
            if uuid not in by_uuid and state is not None and not state.lost:
                await self._gpu_lost(state, "UUID no longer enumerated by NVML")
        expected = self.cfg.expected_gpus
        if expected is not None:
            low = len(found) < expected
            if low and not self._count_low:
                missing = [g.uuid for u, g in self.inventory.items() if u not in by_uuid]
                await self._send_node(
                    Kind.GPU_MISSING,
                    Severity.CRITICAL,
                    {
                        "expected": expected,
                        "found": len(found),
                        "missing_uuids": missing,
                        "uuids": sorted(by_uuid),
                    },
                )
            self._count_low = low

    async def _gpu_lost(self, state: _GpuState, reason: str) -> None:
        if state.lost:
            return
        state.lost = True
        await self._send(
            Kind.GPU_MISSING, Severity.CRITICAL, state.ident, {"reason": reason, "gpu": state.ident.index}
        )

    # --- diffing ----------------------------------------------------------------------------------

    async def _diff(self, state: _GpuState, new: GpuSample) -> None:
        old, state.last = state.last, new
        ident, cfg = state.ident, self.cfg
        initial = old is None
        # ECC
        if new.ecc is not None:
            if initial:
                if new.ecc.get("volatile_dbe", 0) > 0:
                    await self._send(
                        Kind.ECC, Severity.ERROR, ident, {"initial": True, "counters": new.ecc, "dbe": True}
                    )
            elif old is not None and old.ecc is not None:
                deltas = {k: v - old.ecc.get(k, 0) for k, v in new.ecc.items() if v > old.ecc.get(k, 0)}
                if deltas:
                    dbe = any("_dbe" in k for k in deltas)
                    await self._send(
                        Kind.ECC,
                        Severity.ERROR if dbe else Severity.WARNING,
                        ident,
                        {"deltas": deltas, "counters": new.ecc, "dbe": dbe},
                    )
        # row remapping
        if new.remap is not None:
            prev = None if old is None else old.remap
            reasons: list[str] = []
            if new.remap.failure and (prev is None or not prev.failure):
                reasons.append("failure")
            if new.remap.pending and (prev is None or not prev.pending):
                reasons.append("pending")
            if prev is not None:
                if new.remap.uncorrected > prev.uncorrected:
                    reasons.append("uncorrectable_grew")
                if new.remap.corrected > prev.corrected:
                    reasons.append("correctable_grew")
            if reasons:
                severity = (
                    Severity.CRITICAL
                    if "failure" in reasons
                    else Severity.ERROR
                    if ({"pending", "uncorrectable_grew"} & set(reasons))
                    else Severity.WARNING
                )
                data: dict[str, Any] = {
                    "reasons": reasons,
                    **dataclasses.asdict(new.remap),
                    "histogram": new.histogram,
                }
                if prev is not None:
                    data["uncorrected_delta"] = new.remap.uncorrected - prev.uncorrected
                    data["corrected_delta"] = new.remap.corrected - prev.corrected
                else:
                    data["initial"] = True
                await self._send(Kind.ROW_REMAP, severity, ident, data)
        # retired pages pending (older GPUs; H100 remaps rows instead)
        if new.retired_pending and (old is None or not old.retired_pending):
            await self._send(
                Kind.GPU_HEALTH,
                Severity.ERROR,
                ident,
                {"retired_pages_pending": True, "initial": initial, "gpu": ident.index},
            )
        # thermal
        if new.temperature_c is not None:
            if not state.hot and new.temperature_c >= cfg.temperature_c:
                state.hot = True
                await self._send(
                    Kind.THERMAL,
                    Severity.WARNING,
                    ident,
                    {"active": True, "temperature_c": new.temperature_c, "threshold_c": cfg.temperature_c},
                )
            elif state.hot and new.temperature_c < cfg.temperature_c - cfg.temperature_hysteresis_c:
                state.hot = False
                await self._send(
                    Kind.THERMAL,
                    Severity.INFO,
                    ident,
                    {"active": False, "temperature_c": new.temperature_c, "threshold_c": cfg.temperature_c},
                )
        if new.throttle is not None:
            alert_mask = sum(THROTTLE_ALERT_REASONS)
            now_bits = new.throttle & alert_mask
            old_bits = 0 if old is None or old.throttle is None else old.throttle & alert_mask
            if now_bits & ~old_bits or (old_bits and not now_bits):
                await self._send(
                    Kind.THERMAL,
                    Severity.WARNING if now_bits else Severity.INFO,
                    ident,
                    {
                        "active": bool(now_bits),
                        "throttle_reasons": throttle_names(new.throttle),
                        "new_reasons": throttle_names(now_bits & ~old_bits),
                        "throttle_mask": new.throttle,
                        "temperature_c": new.temperature_c,
                        "power_w": new.power_w,
                    },
                )
        # PCIe replays
        if new.pcie_replay is not None and old is not None and old.pcie_replay is not None:
            delta = new.pcie_replay - old.pcie_replay
            if delta >= cfg.pcie_replay_burst:
                await self._send(
                    Kind.GPU_HEALTH,
                    Severity.WARNING,
                    ident,
                    {
                        "pcie_replay_burst": delta,
                        "pcie_replay_total": new.pcie_replay,
                        "interval_s": cfg.interval_s,
                        "gpu": ident.index,
                    },
                )
        # NVLink
        if new.nvlink is not None and old is not None and old.nvlink is not None:
            deltas = {
                k: v - old.nvlink.get(k, 0)
                for k, v in new.nvlink.items()
                if k != "active_links" and v > old.nvlink.get(k, 0)
            }
            if sum(deltas.values()) >= cfg.nvlink_error_burst:
                await self._send(
                    Kind.GPU_HEALTH,
                    Severity.WARNING,
                    ident,
                    {"nvlink_errors": deltas, "nvlink_totals": new.nvlink, "gpu": ident.index},
                )

    # --- Xid events -------------------------------------------------------------------------------

    async def _start_xid_thread(self, queue: asyncio.Queue[XidRecord]) -> None:
        started = await self._guarded("xid_start", lambda _t: self.backend.xid_events_start())
        if started is not None:
            self.xid_supported = False
            reason = "xid_events_start did not return" if started is _STALLED else str(started)
            log.info("nvml_xid_events_unavailable", reason=reason)
            return
        self.xid_supported = True
        loop = asyncio.get_running_loop()
        stop = self._xid_stop
        backend = self.backend

        def put(record: XidRecord) -> None:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(record)

        def reader() -> None:
            failures = 0
            while not stop.is_set():
                try:
                    record = backend.xid_wait(500)
                except NvmlError as exc:
                    failures += 1
                    if failures in (1, 10, 100):
                        log.warning("nvml_xid_wait_failed", error=str(exc), failures=failures)
                    stop.wait(min(5.0, 0.1 * failures))
                    continue
                failures = 0
                if record is not None and not stop.is_set():
                    with contextlib.suppress(RuntimeError):  # loop closed
                        loop.call_soon_threadsafe(put, record)

        self._xid_thread = threading.Thread(target=reader, name="ftd-nvml-xid", daemon=True)
        self._xid_thread.start()

    async def _handle_xid(self, record: XidRecord) -> None:
        ident: GpuIdentity | None = None
        if record.uuid is not None:
            state = self.gpus.get(record.uuid)
            ident = state.ident if state else None
        if ident is None and record.index is not None:
            ident = next((s.ident for s in self.gpus.values() if s.ident.index == record.index), None)
        if ident is None:
            ident = GpuIdentity(
                index=-1 if record.index is None else record.index, uuid=record.uuid or "", pci=""
            )
        info = load_xid_catalog().get(record.code)
        data = {
            "code": record.code,
            "source": "nvml",
            "action": info.action,
            "catalog_version": load_xid_catalog().version,
        }
        await self._send(Kind.XID, Severity(info.severity), ident, data)

    # --- plumbing ---------------------------------------------------------------------------------

    async def _send(self, kind: Kind, severity: Severity, ident: GpuIdentity, data: dict[str, Any]) -> None:
        payload = {"uuid": ident.uuid, "index": ident.index, "pci": ident.pci, **data}
        if ident.name:
            payload.setdefault("name", ident.name)
        await self._emit_event(make_event(self.node, kind, severity=severity, source="nvml", data=payload))

    async def _send_node(self, kind: Kind, severity: Severity, data: dict[str, Any]) -> None:
        payload = {"uuid": None, "index": None, "pci": None, **data}
        await self._emit_event(make_event(self.node, kind, severity=severity, source="nvml", data=payload))

    async def _emit_event(self, event: Event) -> None:
        self.events += 1
        await self._emit(event)

    def _close(self) -> None:
        """Stop the Xid reader and shut NVML down from a helper thread (never block the loop, never
        shut down while a probe is stuck inside NVML)."""
        self._xid_stop.set()
        xid_thread = self._xid_thread
        stuck = [p.finished for p in self._probes.values() if not p.finished.is_set()]
        workers, self._workers = list(self._workers.values()), {}
        for worker in workers:
            worker.close()  # idle workers exit now; a stuck one after its NVML call returns
        backend = self.backend

        def closer() -> None:
            if xid_thread is not None:
                xid_thread.join(timeout=5.0)
                if xid_thread.is_alive():
                    return
                with contextlib.suppress(Exception):
                    backend.xid_events_stop()
            for finished in stuck:
                if not finished.wait(timeout=1.0):
                    return
            with contextlib.suppress(Exception):
                backend.shutdown()

        threading.Thread(target=closer, name="ftd-nvml-close", daemon=True).start()


_STALLED = object()
_BUSY = object()
