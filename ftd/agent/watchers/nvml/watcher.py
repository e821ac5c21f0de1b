"""The NVML watcher: polls every GPU through an NVML backend and emits on *change* only.

Every ``interval_s`` one pass (:meth:`NvmlWatcher.poll_once`) reads the inventory, then probes every
GPU concurrently (:func:`~ftd.agent.watchers.nvml.probe.sample_gpu`), each on its own thread under
``call_timeout_s`` (:mod:`~ftd.agent.watchers.nvml.worker`), and sends what changed since the GPU's
previous sample (:mod:`~ftd.agent.watchers.nvml.signals`). A stalled probe is reported as
``gpu_health`` with ``stalled=true`` and the call it hangs in; while it is stuck that GPU is skipped
(at most one outstanding probe per GPU, so threads never pile up); when it finally returns, a
``stalled=false`` event closes the episode. The inventory is probed the same way under its own key.

Events (``source="nvml"``; each carries ``uuid``, ``index``, ``pci`` as lowercase ``dddd:bb:dd.f``):

* ``ecc``: any ECC counter rose (SBE: warning, DBE: error), with deltas and all counters.
* ``row_remap``: pending or failure newly set, or uncorrectable/correctable remaps grew; histogram.
* ``ecc`` with ``signal = "correctable_rate"``: the volatile correctable count grows faster than
  ``ecc_correctable_rate_per_hour`` (warning, once per episode).
* ``ecc`` with ``signal = "sram_threshold"``: the GPU is past NVIDIA's SRAM replacement threshold
  (more than 4 uncorrectable SRAM errors over its life, or the driver's flag): critical, at start
  and whenever it is crossed; a node condition, and the ``ecc_remap`` rule drains for RMA.
* ``thermal``: temperature reached ``temperature_c`` (cleared below it minus the hysteresis), or a
  thermal / power-brake / hardware-slowdown throttle reason newly set; clearing is an ``info`` event.
  ``sustained=true`` (error, once per episode): an alerting throttle reason stayed set for
  ``thermal_sustained_s``.
* ``gpu_missing``: fewer GPUs than ``expected_gpus``, a UUID from the first inventory gone, or a
  GPU answering "GPU is lost". Once per episode.
* ``gpu_health``: stalled probes (``signal = "stalled"``; ``stall_ended``, an info, when the probe
  returns), PCIe replay bursts (``pcie_replay``), NVLink error-counter increases
  (``nvlink_errors``), NVLink links that went down (``nvlink_down``) or came back (``nvlink_up``,
  an info), retired pages pending (``retired_pages``).
* ``xid``: Xid errors from NVML's event API (``data.source = "nvml"``), read by a thread that
  waits on the event set with a short timeout so it can stop.

The first sample of a GPU is its baseline: counters are not reported, but *states* that need a
human (volatile DBE > 0, remap pending/failure, retired pages pending, SRAM past the threshold) are
reported once with ``initial=true``.

Without NVML (library missing, no driver, ``nvmlInit`` failing or hanging) the watcher logs one
line ``nvml_unavailable_watcher_disabled`` and tries again every :data:`INIT_RETRY_S`. What that
means depends on the node (issue #32: a broken NVML must not look healthy), read from what the
kernel shows (:func:`~ftd.agent.watchers.nvml.presence.find_gpus` under ``gpu_root``):

* NVIDIA GPUs there: its :meth:`~NvmlWatcher.health` is ``unavailable`` (the agent's metrics:
  ``ftd_agent_watcher_up`` 0, the reason in ``ftd_agent_watcher_state``) and it sends one
  ``agent_health`` event (error, ``problem = "watcher_unavailable"``, ``watcher = "nvml"``, the
  ``reason`` and the ``gpus`` evidence), which the node's condition book keeps as a condition
  (``ftd health``, ``ftd status``, the dashboard). When NVML comes back an ``info`` one
  (``problem = "watcher_available"``) ends it.
* none: ``idle`` (nothing to watch), not a problem.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from ftd.agent.watchers.base import RUNNING, Emit, WatcherHealth
from ftd.agent.watchers.nvml import signals
from ftd.agent.watchers.nvml.backend import GpuIdentity, NvmlBackend, NvmlError, NvmlGpuLost, XidRecord
from ftd.agent.watchers.nvml.presence import find_gpus
from ftd.agent.watchers.nvml.probe import GpuSample, sample_gpu
from ftd.agent.watchers.nvml.real import RealNvml
from ftd.agent.watchers.nvml.worker import BUSY, STALLED, Probe, ProbeRunner, Tracker
from ftd.catalog import load_xid_catalog
from ftd.config import NvmlConfig
from ftd.events import Event, Kind, Severity, make_event
from ftd.logs import get_logger

__all__ = ["INIT_RETRY_S", "WATCHER_AVAILABLE", "WATCHER_UNAVAILABLE", "NvmlWatcher"]

log = get_logger(__name__)

INIT_RETRY_S = 60.0  # how often a failed nvmlInit is tried again
WATCHER_UNAVAILABLE = "watcher_unavailable"  # agent_health problem: a GPU node's NVML does not work
WATCHER_AVAILABLE = "watcher_available"  # ... and works again


@dataclasses.dataclass(slots=True)
class _GpuState:
    ident: GpuIdentity
    last: GpuSample | None = None
    memory: signals.GpuMemory = dataclasses.field(default_factory=signals.GpuMemory)
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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self._clock = clock  # stamps samples: the ECC rate and sustained throttling are measured on it
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
        self._probes = ProbeRunner(cfg.call_timeout_s)
        self._count_low = False
        self._present: list[str] = []  # UUIDs in the latest inventory, in index order
        self._inventory_stalled = False
        self._xid_thread: threading.Thread | None = None
        self._xid_stop = threading.Event()
        self.xid_supported: bool | None = None
        self._health = RUNNING
        self.init_retry_s = INIT_RETRY_S

    # --- public -----------------------------------------------------------------------------------

    def outstanding_probes(self) -> int:
        return self._probes.outstanding()

    def health(self) -> WatcherHealth:
        """``running``; ``unavailable`` (NVML does not work on a node with GPUs) or ``idle`` (no
        NVML and no GPU, or disabled by config), with the reason."""
        return self._health

    async def run(self) -> None:
        if not self.cfg.enabled:
            log.info("nvml_watcher_disabled", reason="agent.nvml.enabled = false")
            self._health = WatcherHealth("idle", "agent.nvml.enabled = false")
            await asyncio.Event().wait()
        await self._until_available()
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

    async def _until_available(self) -> None:
        """Initialise NVML; while that fails, say what it means on this node (module docstring) and
        try again every ``init_retry_s``; the agent's other watchers go on meanwhile."""
        told = ""  # the reason the last agent_health event gave
        while True:
            init = await self._probes.call("init", lambda _t: self.backend.init())
            if not (isinstance(init, BaseException) or init is STALLED or init is BUSY):
                break
            reason = str(init) if isinstance(init, BaseException) else "nvmlInit did not return"
            if self.available is None:
                log.warning("nvml_unavailable_watcher_disabled", reason=reason)
            self.available, self.disabled_reason = False, reason
            gpus = find_gpus(self.cfg.gpu_root)
            if gpus:
                shown = ", ".join(gpus[:3]) + (f" and {len(gpus) - 3} more" if len(gpus) > 3 else "")
                sentence = f"nvml unavailable on a node with NVIDIA GPUs ({shown}): {reason}"[:300]
                self._health = WatcherHealth("unavailable", sentence)
                if sentence != told:
                    told = sentence
                    log.error("nvml_unavailable_on_gpu_node", reason=reason, gpus=gpus[:8])
                    await self._send_health(
                        Severity.ERROR,
                        {
                            "problem": WATCHER_UNAVAILABLE,
                            "reason": sentence,
                            "error": reason,
                            "gpus": gpus[:8],
                        },
                    )
            elif not told:  # (GPUs seen before and gone now: stays unavailable, the condition stays)
                where = "" if self.cfg.gpu_root == "/" else f" under {self.cfg.gpu_root}"
                self._health = WatcherHealth(
                    "idle", f"no NVIDIA GPU on this node{where}, and NVML unavailable: {reason}"[:300]
                )
            await asyncio.sleep(self.init_retry_s)
        if told:
            log.info("nvml_available_again")
            await self._send_health(
                Severity.INFO, {"problem": WATCHER_AVAILABLE, "reason": "nvml works again"}
            )
        self._health = RUNNING

    async def _send_health(self, severity: Severity, data: dict[str, Any]) -> None:
        await self._emit_event(
            make_event(
                self.node,
                Kind.AGENT_HEALTH,
                severity=severity,
                source="nvml",
                data={"watcher": self.name, **data},
            )
        )

    async def poll_once(self) -> None:
        """One pass: inventory, then one probe per GPU (concurrently, each under the deadline)."""
        self.polls += 1
        inventory = await self._probes.call("inventory", self._read_inventory)
        if isinstance(inventory, list):
            await self._check_inventory(inventory)
            self._inventory_stalled = False
        elif inventory is STALLED and not self._inventory_stalled:
            self._inventory_stalled = True
            stalled = self._probes.get("inventory")
            call = stalled.tracker.call if stalled is not None else ""
            await self._send_node(
                Kind.GPU_HEALTH,
                Severity.ERROR,
                {
                    "signal": "stalled",
                    "stalled": True,
                    "call": call,
                    "gpu": None,
                    "deadline_s": self.cfg.call_timeout_s,
                },
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

    def _read_inventory(self, tracker: Tracker) -> list[GpuIdentity]:
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
        if self._probes.busy(key):
            return BUSY  # still stuck: do not start a second thread for this GPU
        recovered = self._probes.forget(key)
        if recovered is not None:
            # the stuck probe came back since the last poll: close the episode, then probe afresh
            await self._stall_over(state, recovered)
        index = state.ident.index
        probe = self._probes.start(key, lambda t: sample_gpu(self.backend, index, state.unsupported, t))
        result = await self._probes.wait(probe)
        if result is STALLED and not probe.stalled_reported:
            probe.stalled_reported = True
            await self._send(
                Kind.GPU_HEALTH,
                Severity.ERROR,
                state.ident,
                {
                    "signal": "stalled",
                    "stalled": True,
                    "call": probe.tracker.call,
                    "gpu": state.ident.index,
                    "deadline_s": self.cfg.call_timeout_s,
                },
            )
        return result

    async def _stall_over(self, state: _GpuState, probe: Probe) -> None:
        await self._send(
            Kind.GPU_HEALTH,
            Severity.INFO,
            state.ident,
            {
                "signal": "stall_ended",
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
        new.t = self._clock()
        old, state.last = state.last, new
        found = signals.diff(old, new, self.cfg, state.ident.index, state.memory)
        for kind, severity, data in found:
            await self._send(kind, severity, state.ident, data)

    async def _start_xid_thread(self, queue: asyncio.Queue[XidRecord]) -> None:
        started = await self._probes.call("xid_start", lambda _t: self.backend.xid_events_start())
        if started is not None:
            self.xid_supported = False
            reason = "xid_events_start did not return" if started is STALLED else str(started)
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
        stuck = self._probes.close()  # idle workers exit now; a stuck one after its NVML call returns
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
