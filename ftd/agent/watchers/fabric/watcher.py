"""The fabric watcher: counters as rates against the hardware profile, PCIe links, IB port rates.

What: every ``agent.fabric.interval_s`` it reads (in a thread, bounded by ``read_timeout_s``) a
:class:`Snapshot` -- the IB/RoCE ports and their ``counters/`` and ``hw_counters/``
(:mod:`.sysfs`), the ``*_phy`` counters of each Ethernet port's network device (:mod:`.ethtool`), the
GPUs' PCIe links (sysfs, and NVML where sysfs has none) and NVLink error counters (NVML) -- and
:meth:`FabricWatcher.check` judges it:

* each counter that has a rule in the profile's ``fabric`` section (:mod:`ftd.fabric.thresholds`)
  gets its sample added to its history (:mod:`ftd.fabric.rates`); a rule crossed opens a ``fabric``
  event (``check = "counter"``; severity ``critical`` for class ``fatal``, else ``warning``), once;
  when the rate is back under it, an ``info`` event clears it (``status = "cleared"``);
* each active port's ``rate`` against the profile's ``ib_rate_gbps`` / ``ib_width``: ``fabric``
  ``check = "port_rate"`` (warning), cleared when it is back;
* each GPU's and NIC's PCIe link, current against maximum: ``pcie_link`` (warning; ``error`` for a
  link at width 0), cleared by an ``info`` ``status = "recovered"``. A GPU's speed alone below its
  maximum is not judged: GPUs lower their PCIe generation when idle; its width is.

Every check that cannot be made says so once (a ``fabric`` ``info`` event, ``check = "skipped"``,
with ``what`` and ``reason``, again when the reason changes; on a node with no IB/RoCE port and no
GPU, where there is nothing to check, only logged, and the watcher is ``idle``): no hardware
profile, a counter file missing or unreadable, ethtool missing, NVML unavailable, a rule the catalog
cannot read. None of them is a pass. Counter histories and the conditions reported open are kept
in ``fabric.json`` in the agent's state dir (:mod:`.state`): a counter that rose while the agent was
down is judged at the first poll after the restart, and a condition opened before it is cleared
after it.

Why here and not in the host watcher: the thresholds are per hardware profile and per rate, and the
sources (sysfs, ethtool, NVML) are the fabric's; docs/fabric.md lists every check.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftd.agent.watchers.base import RUNNING, Emit, WatcherHealth
from ftd.agent.watchers.fabric import ethtool, sysfs
from ftd.agent.watchers.fabric.state import FabricState, load_state, save_state
from ftd.agent.watchers.nvml.backend import NvmlBackend, NvmlError, NvmlNotSupported, PcieLinkInfo
from ftd.catalog.hardware_profiles import HardwareCatalog, HardwareCatalogError, load_hardware_catalog
from ftd.config.schema import FabricConfig, HardwareConfig
from ftd.events import Event, Kind, make_event
from ftd.fabric.links import GTS_BY_GEN, PcieLink, judge_pcie, judge_port, parse_ib_rate
from ftd.fabric.rates import CounterHistory, Rate, saturated
from ftd.fabric.thresholds import CounterRule, judge, rules_from_section
from ftd.logs import get_logger
from ftd.pci import normalize_pci

__all__ = ["FabricWatcher", "GpuFacts", "Snapshot"]

log = get_logger(__name__)

_SEVERITY = {"fatal": "critical", "warning": "warning", "congestion": "warning"}
#: Longest time between two saves of the state file when no counter moved.
SAVE_EVERY_S = 300.0
#: What makes an open link condition worth a new event (a GPU's idle speed changes are not).
_CHANGES = ("what", "cur_width", "max_width", "rate_gbps", "width")


@dataclass
class GpuFacts:
    bdf: str
    index: int | None = None  # NVML's index (None: seen in sysfs only)
    name: str = ""
    uuid: str = ""
    nvml_pcie: PcieLinkInfo | None = None
    nvml_pcie_why: str = ""
    nvlink: dict[str, int] | None = None
    nvlink_why: str = ""


@dataclass
class Snapshot:
    ports: list[sysfs.IbPortFacts] = field(default_factory=list)
    phy: dict[str, tuple[dict[str, int], str]] = field(default_factory=dict)  # netdev -> counters, why
    gpus: dict[str, GpuFacts] = field(default_factory=dict)  # by PCI address
    links: dict[str, tuple[PcieLink | None, str]] = field(default_factory=dict)  # sysfs, by PCI address
    nearest: dict[str, tuple[list[str], str]] = field(default_factory=dict)  # NIC PCI -> GPUs, locality
    nvml_why: str = ""  # why NVML answered nothing ("" when it did)


class FabricWatcher:
    """Reads and judges the fabric every ``interval_s`` (module docstring)."""

    name = "fabric"

    def __init__(
        self,
        cfg: FabricConfig,
        node: str,
        emit: Emit,
        *,
        hardware: HardwareConfig | None = None,
        state_path: Path | None = None,
        root: Path = Path("/"),
        backend: NvmlBackend | None = None,
        clock: Callable[[], float] = time.time,
        boot: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.node = node
        self._emit = emit
        self.hardware = hardware or HardwareConfig()
        self.state_path = state_path
        self.root = root
        self.backend = backend
        self._clock = clock
        self.state: FabricState = load_state(state_path, cfg.window_s, boot)
        self.skipped: dict[str, str] = {}  # what -> why, as last reported
        self.profile: str | None = None
        self.profile_why = ""
        self.polls = 0
        self.last_progress = time.monotonic()
        self._nvml_ready = False
        self._reading = False
        self._quiet = False  # this node has nothing to check (no port, no GPU)
        self._wanted: dict[str, set[str]] | None = None  # counter names the rules read (None: all)
        self._nearest: dict[tuple[str, tuple[str, ...]], tuple[list[str], str]] = {}
        self._saved_at: float | None = None
        self._dirty = False  # a counter moved or a condition changed since the last save
        self.port_map: dict[str, dict[str, Any]] = {}  # port -> netdevs, pci, nearest GPUs, rate
        self._health = RUNNING
        self._catalog: HardwareCatalog | None = None
        self._catalog_why = ""
        try:
            self._catalog = load_hardware_catalog(
                Path(self.hardware.catalog) if self.hardware.catalog else None
            )
        except HardwareCatalogError as exc:
            self._catalog_why = f"hardware catalog unreadable: {exc}"

    def health(self) -> WatcherHealth:
        return self._health

    # --- reading (blocking: called in a thread) ---------------------------------------------------

    def read(self) -> Snapshot:
        snap = Snapshot(ports=sysfs.read_ports(self.root, self._wanted))
        for port in snap.ports:
            if port.link_layer == "Ethernet":
                for netdev in port.netdevs:
                    snap.phy[netdev] = ethtool.phy_counters(
                        self.cfg.ethtool, netdev, self.cfg.ethtool_timeout_s
                    )
        gpu_bdfs = sysfs.gpu_functions(self.root)
        snap.gpus = {bdf: GpuFacts(bdf) for bdf in gpu_bdfs}
        self._read_nvml(snap)
        for bdf in sorted({*snap.gpus, *(p.bdf for p in snap.ports if p.bdf)}):
            snap.links[bdf] = sysfs.read_pcie_link(self.root, bdf)
        gpus = sorted(snap.gpus)
        for port in snap.ports:
            if port.bdf and port.bdf not in snap.nearest:
                key = (port.bdf, tuple(gpus))  # the PCI tree does not change while the node runs
                if key not in self._nearest:
                    self._nearest[key] = sysfs.nearest_gpus(self.root, port.bdf, gpus)
                snap.nearest[port.bdf] = self._nearest[key]
        return snap

    def _read_nvml(self, snap: Snapshot) -> None:
        backend = self.backend
        if backend is None:
            snap.nvml_why = "NVML not used (agent.fabric.nvml = false, or agent.nvml disabled)"
            return
        try:
            if not self._nvml_ready:
                backend.init()
                self._nvml_ready = True
            count = backend.device_count()
        except NvmlError as exc:
            snap.nvml_why = f"NVML unavailable: {exc}"[:300]
            return
        for index in range(count):
            try:
                ident = backend.identity(index)
            except NvmlError as exc:
                log.warning("fabric_nvml_identity_failed", index=index, error=str(exc)[:200])
                continue
            bdf = normalize_pci(ident.pci) or ident.pci
            gpu = snap.gpus.setdefault(bdf, GpuFacts(bdf))
            gpu.index, gpu.name, gpu.uuid = index, ident.name, ident.uuid
            try:
                gpu.nvml_pcie = backend.pcie_link(index)
            except NvmlError as exc:
                gpu.nvml_pcie_why = f"NVML PCIe link: {exc}"[:200]
            try:
                gpu.nvlink = backend.nvlink_errors(index)
            except NvmlNotSupported:
                gpu.nvlink_why = "no NVLink (NVML: not supported)"
            except NvmlError as exc:
                gpu.nvlink_why = f"NVML NVLink counters: {exc}"[:200]

    # --- the loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        if not self.cfg.enabled:
            self._health = WatcherHealth("idle", "agent.fabric.enabled = false")
            await asyncio.Event().wait()
        while True:
            await self.poll_once()
            self.last_progress = time.monotonic()
            await asyncio.sleep(self.cfg.interval_s)

    async def poll_once(self) -> list[Event]:
        """One read and its judgement; the events are emitted and returned."""
        if self._reading:  # the previous read is still stuck in its thread (a hung NVML or ethtool)
            events: list[Event] = []
            self._skip(
                events, "read", f"the previous read has not returned after {self.cfg.read_timeout_s:g} s"
            )
            await self._send(events)
            return events
        self._reading = True
        task = asyncio.ensure_future(asyncio.to_thread(self.read))
        task.add_done_callback(lambda _t: setattr(self, "_reading", False))
        try:
            async with asyncio.timeout(self.cfg.read_timeout_s):
                snap = await asyncio.shield(task)
        except TimeoutError:
            events = []
            self._skip(events, "read", f"reading the fabric took over {self.cfg.read_timeout_s:g} s")
            await self._send(events)
            return events
        self._skip([], "read", "")
        events = self.check(snap, self._clock())
        await self._send(events)
        return events

    async def _send(self, events: list[Event]) -> None:
        for event in events:
            await self._emit(event)

    # --- judgement --------------------------------------------------------------------------------

    def _resolve_profile(self, snap: Snapshot) -> None:
        if self._catalog is None:
            self.profile, self.profile_why = None, self._catalog_why
            return
        if self.hardware.profile:
            known = self.hardware.profile in self._catalog.profiles
            self.profile = self.hardware.profile if known else None
            self.profile_why = (
                "" if known else f"hardware.profile {self.hardware.profile!r} is not in the catalog"
            )
            return
        names = [g.name for g in snap.gpus.values() if g.name]
        if not names:
            self.profile = None
            self.profile_why = "no hardware profile: hardware.profile is unset and NVML named no GPU to match"
            return
        self.profile = self._catalog.profile_for_gpu(names[0])
        self.profile_why = "" if self.profile else f"no hardware profile matches GPU {names[0]!r}"

    def check(self, snap: Snapshot, now: float) -> list[Event]:
        """The events ``snap`` (read at ``now``) makes; keeps the state and saves it."""
        self.polls += 1
        events: list[Event] = []
        self._quiet = not snap.ports and not snap.gpus  # nothing to check: skips are logged, not sent
        self._resolve_profile(snap)
        section: Mapping[str, Any] | None = None
        if self._catalog is not None and self.profile is not None:
            section = self._catalog.section("fabric", self.profile)
        if section is None:
            self._skip(events, "thresholds", self.profile_why or "no hardware profile")
            rules: dict[str, CounterRule] = {}
        else:
            self._skip(events, "thresholds", "")
            rules, problems = rules_from_section(section)
            self._wanted = {}
            for rule in rules.values():
                self._wanted.setdefault(rule.source, set()).add(rule.counter)
            for problem in problems:
                self._skip(
                    events, f"rule {problem.partition(':')[0]}", f"catalog fabric rule unusable: {problem}"
                )
            self._counters(events, snap, rules, now)
            self._port_rates(events, snap, section, now)
        self._pcie(events, snap, now)
        self._skip(events, "nvml", snap.nvml_why)
        self._map(snap)
        if not snap.ports and not snap.gpus:
            self._health = WatcherHealth("idle", "no InfiniBand/RoCE port and no GPU on this node")
        else:
            self._health = RUNNING
        # Saved when a counter moved or a condition changed, else every SAVE_EVERY_S: a counter that
        # did not move loses nothing by a staler last sample (the same value, an older time).
        if (
            self._dirty
            or self._saved_at is None
            or now - self._saved_at >= SAVE_EVERY_S
            or now < self._saved_at
        ):
            save_state(self.state_path, self.state)
            self._saved_at, self._dirty = now, False
        return events

    def _map(self, snap: Snapshot) -> None:
        """``port_map``: each port's network devices, PCI function, nearest GPUs, layer, state and rate
        (``ibdev2netdev`` and ``iblinkinfo``'s views together); logged when it changes."""
        ports = {}
        for port in snap.ports:
            gpus, locality = snap.nearest.get(port.bdf or "", ([], "none"))
            ports[port.name] = {
                "netdevs": port.netdevs,
                "pci": port.bdf,
                "gpus": gpus,
                "gpu_locality": locality,
                "link_layer": port.link_layer,
                "state": port.state,
                "rate": port.rate,
            }
        if ports != self.port_map:
            self.port_map = ports
            log.info("fabric_ports", ports=ports, profile=self.profile)

    def _event(self, kind: Kind, severity: str, data: dict[str, Any], now: float) -> Event:
        return make_event(self.node, kind, severity=severity, source="fabric", data=data, ts=now)

    def _skip(self, events: list[Event], what: str, why: str) -> None:
        """Report ``what`` as skipped with ``why`` when that is new ("" : no longer skipped)."""
        if self.skipped.get(what, "") == why:
            return
        if not why:
            self.skipped.pop(what, None)
            log.info("fabric_check_resumed", what=what)
            return
        self.skipped[what] = why
        log.info("fabric_check_skipped", what=what, reason=why)
        if self._quiet:
            return
        data = {
            "check": "skipped",
            "subject": f"skipped:{what}",
            "what": what,
            "reason": why,
            "profile": self.profile,
        }
        events.append(self._event(Kind.FABRIC, "info", data, self._clock()))

    def _readings(
        self, events: list[Event], snap: Snapshot, rules: dict[str, CounterRule]
    ) -> list[tuple[CounterRule, str, int, dict[str, Any]]]:
        """(rule, where, value, context) of every counter a rule names; the missing ones skipped."""
        out: list[tuple[CounterRule, str, int, dict[str, Any]]] = []
        by_source: dict[str, list[CounterRule]] = {}
        for rule in rules.values():
            by_source.setdefault(rule.source, []).append(rule)

        def take(
            source: str,
            where: str,
            values: dict[str, int],
            why: str,
            ctx: dict[str, Any],
            problems: Mapping[str, str],
        ) -> None:
            wanted = by_source.get(source, [])
            if not wanted:
                return
            if why:
                self._skip(events, f"{source}:{where}", why)
                return
            missing = []
            for rule in wanted:
                if rule.counter in values:
                    out.append((rule, where, values[rule.counter], ctx))
                else:
                    missing.append(problems.get(rule.key) or f"{rule.counter}: no such counter")
            self._skip(events, f"{source}:{where}", "; ".join(missing))

        for port in snap.ports:
            nearest, locality = snap.nearest.get(port.bdf or "", ([], "none"))
            ctx = {
                "device": port.device,
                "port": port.port,
                "link_layer": port.link_layer,
                "netdevs": port.netdevs,
                "pci": port.bdf,
                "gpus": nearest,
                "gpu_locality": locality,
            }
            take("ib", port.name, port.counters, port.problems.get("ib:*", ""), ctx, port.problems)
            take("hw", port.name, port.hw_counters, port.problems.get("hw:*", ""), ctx, port.problems)
            if port.link_layer != "Ethernet":
                why = f"link layer {port.link_layer or 'unknown'}: the PHY counters are an Ethernet port's"
                take("phy", port.name, {}, why, ctx, {})
                continue
            if not port.netdevs:
                take("phy", port.name, {}, "no network device for this port", ctx, {})
                continue
            for netdev in port.netdevs:
                counters, why = snap.phy.get(netdev, ({}, "not read"))
                take("phy", f"{port.name}:{netdev}", counters, why, {**ctx, "netdev": netdev}, {})
        for bdf, gpu in sorted(snap.gpus.items()):
            if gpu.index is None:
                continue  # seen in sysfs only: NVML's skip says why
            ctx = {"device": f"gpu{gpu.index}", "pci": bdf, "uuid": gpu.uuid}
            values = {k: v for k, v in (gpu.nvlink or {}).items() if k != "active_links"}
            take("nvlink", bdf, values, gpu.nvlink_why, ctx, {})
        return out

    def _counters(
        self, events: list[Event], snap: Snapshot, rules: dict[str, CounterRule], now: float
    ) -> None:
        for rule, where, value, ctx in self._readings(events, snap, rules):
            subject = f"{rule.source}:{where}:{rule.counter}"
            history = self.state.counters.get(subject)
            if saturated(rule.source, rule.counter, value):  # it counts nothing more: not a pass
                why = f"{rule.counter} saturated at {value}: reset the port's counters (perfquery -R)"
                self._skip(events, f"saturated:{subject}", why)
                if history is not None and history.samples and history.samples[-1][1] == value:
                    continue  # stopped there: judged when it got there, not read as quiet since
            else:
                self._skip(events, f"saturated:{subject}", "")
            if history is None:
                history = self.state.counters[subject] = CounterHistory(self.cfg.window_s)
            rate = history.add(now, value)
            self._dirty = self._dirty or rate.delta > 0 or rate.reset
            if rate.reset:
                log.info("fabric_counter_reset", counter=subject, value=value)
                continue  # a new baseline: the previous verdict stands until a rate says otherwise
            verdict = judge(rule, rate)
            is_open = subject in self.state.open
            if verdict.crossed and not is_open:
                data = self._counter_data(rule, subject, rate, ctx, "crossed", verdict.why)
                self.state.open[subject] = data
                self._dirty = True
                events.append(self._event(Kind.FABRIC, _SEVERITY[rule.klass], data, now))
            elif not verdict.crossed and is_open:
                del self.state.open[subject]
                self._dirty = True
                data = self._counter_data(rule, subject, rate, ctx, "cleared", "")
                events.append(self._event(Kind.FABRIC, "info", data, now))

    def _counter_data(
        self, rule: CounterRule, subject: str, rate: Rate, ctx: dict[str, Any], status: str, why: str
    ) -> dict[str, Any]:
        return {
            **ctx,
            "check": "counter",
            "subject": subject,
            "status": status,
            "source": rule.source,
            "counter": rule.counter,
            "class": rule.klass,
            "value": rate.value,
            "delta": rate.delta,
            "per_s": round(rate.per_s, 3),
            "per_hour": round(rate.per_hour, 1),
            "span_s": round(rate.span_s, 1),
            "threshold": rule.describe(),
            "crossed": why,
            "profile": self.profile,
        }

    def _port_rates(
        self, events: list[Event], snap: Snapshot, section: Mapping[str, Any], now: float
    ) -> None:
        expected = section.get("ib_rate_gbps")
        gbps = (
            float(expected) if isinstance(expected, int | float) and not isinstance(expected, bool) else None
        )
        width = section.get("ib_width") if isinstance(section.get("ib_width"), str) else None
        for port in snap.ports:
            subject = f"port_rate:{port.name}"
            if port.state != "ACTIVE":
                self._skip(events, subject, "")  # a down port is the host watcher's ib_link
                continue
            rate = parse_ib_rate(port.rate)
            verdict = judge_port(rate, gbps, width)
            if verdict.unknown:
                why = verdict.unknown
                if rate is None:
                    why = port.problems.get("rate") or f"rate unreadable: {port.rate!r}"
                self._skip(events, subject, f"{why} (profile {self.profile})")
                continue
            self._skip(events, subject, "")
            assert rate is not None
            data = {
                "check": "port_rate",
                "subject": subject,
                "device": port.device,
                "port": port.port,
                "netdevs": port.netdevs,
                "pci": port.bdf,
                "rate_gbps": rate.gbps,
                "width": rate.width,
                "speed": rate.speed,
                "expected_gbps": gbps,
                "expected_width": width,
                "pct": verdict.pct,
                "class": "warning",
                "profile": self.profile,
            }
            self._open_or_clear(events, subject, verdict.degraded, Kind.FABRIC, "warning", data, now)

    def _open_or_clear(
        self,
        events: list[Event],
        subject: str,
        bad: bool,
        kind: Kind,
        severity: str,
        data: dict[str, Any],
        now: float,
        *,
        cleared: str = "cleared",
        opened: str = "degraded",
    ) -> None:
        """Open ``subject`` (or report its change) while ``bad``; clear it with an ``info`` after."""
        before = self.state.open.get(subject)
        if bad:
            data = {**data, "status": opened}
            if before is None or any(before.get(k) != data.get(k) for k in _CHANGES):
                self.state.open[subject] = data
                self._dirty = True
                events.append(self._event(kind, severity, data, now))
        elif before is not None:
            del self.state.open[subject]
            self._dirty = True
            events.append(self._event(kind, "info", {**data, "status": cleared}, now))

    def _pcie(self, events: list[Event], snap: Snapshot, now: float) -> None:
        nics = {p.bdf: p for p in snap.ports if p.bdf}
        for bdf in sorted({*snap.gpus, *nics}):
            gpu = snap.gpus.get(bdf)
            link, why = snap.links.get(bdf, (None, "not read"))
            source = "sysfs"
            if link is None and gpu is not None and gpu.nvml_pcie is not None:
                info = gpu.nvml_pcie
                link = PcieLink(
                    GTS_BY_GEN.get(info.cur_gen), GTS_BY_GEN.get(info.max_gen), info.cur_width, info.max_width
                )
                source = "nvml"
            subject = f"pcie:{bdf}"
            if link is None:
                extra = f"; {gpu.nvml_pcie_why}" if gpu is not None and gpu.nvml_pcie_why else ""
                self._skip(events, subject, why + extra)
                continue
            verdict = judge_pcie(link)
            if verdict.unknown:
                self._skip(events, subject, f"{verdict.unknown} ({source})")
                continue
            self._skip(events, subject, "")
            what = verdict.what
            if gpu is not None and what == "speed":
                what = ""  # a GPU lowers its generation when idle: its width is what is judged
            port = nics.get(bdf)
            device = (
                f"gpu{gpu.index}"
                if gpu is not None and gpu.index is not None
                else ("gpu" if gpu is not None else f"nic {port.device}" if port is not None else bdf)
            )
            data = {
                "subject": subject,
                "device": device,
                "pci": bdf,
                "cur_width": link.cur_width,
                "max_width": link.max_width,
                "cur_speed_gts": link.cur_gts,
                "max_speed_gts": link.max_gts,
                "lanes_lost": verdict.lanes_lost,
                "gens_lost": verdict.gens_lost,
                "bandwidth_pct": verdict.bandwidth_pct,
                "what": what,
                "from": source,
            }
            severity = "error" if what == "down" else "warning"
            self._open_or_clear(
                events, subject, bool(what), Kind.PCIE_LINK, severity, data, now, cleared="recovered"
            )
