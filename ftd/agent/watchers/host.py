"""Host state from sysfs and procfs: what the kernel log says once, the files say all the time.

What: pure readers of a root directory (``/`` on a node, a fake tree in tests) -- the mount table's
read-only flags (``proc/self/mounts``), md arrays (``sys/block/md*/md/degraded``, ``array_state``),
NVMe controllers (``sys/class/nvme/*/state``), InfiniBand / RoCE port states
(``sys/class/infiniband/<dev>/ports/<n>/state``; their counters are the fabric watcher's,
:mod:`ftd.agent.watchers.fabric`, as rates against the hardware profile's thresholds) and EDAC
memory-controller error counts (``sys/devices/system/edac/mc/mc*/ce_count``, ``ue_count``) -- and
:class:`HostWatcher`, which samples them every ``interval_s`` and reports changes as the kernel-log
families' kinds (docs/signals.md), ``source = "host"``:

* a local block-device filesystem that was read-write and is now read-only: ``fs_readonly``;
* an md array newly degraded (``storage``, ``md``, ``disk_failed``) or broken / inactive
  (``array_failed``); an NVMe controller ``dead`` (``storage``, ``nvme``, ``dead``), also at start;
* an IB port that was ACTIVE and stays down longer than ``ib_window_s``: ``ib_link`` (a flap that
  recovers within the window is no event: nothing drains on it);
* EDAC uncorrected errors counted: ``machine_check`` (critical); corrected: ``machine_check`` (info).

Why files as well as the log: a line lost from the ring buffer, or an agent started after it,
still sees the state; and a port's recovery, which the log does not say in one line, is read here.
Reads are a few small files per sample, done in a thread (sysfs never blocks on a filesystem, but
the agent's loop must not wait on any file).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftd.agent.watchers.base import Emit
from ftd.events import Event, Kind, make_event
from ftd.logs import get_logger

__all__ = ["HostSample", "HostWatcher", "IbPort", "Mount", "read_edac", "read_ib_ports", "read_md",
           "read_mounts", "read_nvme", "sample"]  # fmt: skip

log = get_logger(__name__)

#: Filesystems that live on another machine: their read-only flag is not this node's disk.
_NETWORK_FS = frozenset({"nfs", "nfs4", "lustre", "cifs", "smb3", "gpfs", "beegfs", "fuse.glusterfs", "ceph"})


@dataclass(frozen=True)
class Mount:
    device: str
    path: str
    fstype: str
    ro: bool


@dataclass(frozen=True)
class IbPort:
    state: str  # "ACTIVE", "DOWN", "INIT", ... (the word after "4: ")
    phys_state: str


@dataclass(frozen=True)
class HostSample:
    mounts: list[Mount]
    md: dict[str, tuple[int, str]]  # md0 -> (degraded devices, array_state)
    nvme: dict[str, str]  # nvme0 -> state
    ib: dict[tuple[str, int], IbPort]
    edac: dict[str, tuple[int, int]]  # mc0 -> (ce_count, ue_count)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.lstrip("-").isdecimal() else None


def _unescape(text: str) -> str:
    """The mount table's octal escapes (``\\040`` is a space)."""
    if "\\" not in text:
        return text
    return text.encode().decode("unicode_escape")


def read_mounts(root: Path) -> list[Mount]:
    text = _read(root / "proc" / "self" / "mounts") or ""
    mounts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        options = parts[3].split(",")
        mounts.append(Mount(_unescape(parts[0]), _unescape(parts[1]), parts[2], "ro" in options))
    return mounts


def read_md(root: Path) -> dict[str, tuple[int, str]]:
    out: dict[str, tuple[int, str]] = {}
    block = root / "sys" / "block"
    for md in sorted(block.glob("md*")):
        degraded = _int(_read(md / "md" / "degraded"))
        state = _read(md / "md" / "array_state") or ""
        if degraded is not None or state:
            out[md.name] = (degraded or 0, state)
    return out


def read_nvme(root: Path) -> dict[str, str]:
    base = root / "sys" / "class" / "nvme"
    return {c.name: s for c in sorted(base.glob("nvme*")) if (s := _read(c / "state")) is not None}


def read_ib_ports(root: Path) -> dict[tuple[str, int], IbPort]:
    out: dict[tuple[str, int], IbPort] = {}
    for dev in sorted((root / "sys" / "class" / "infiniband").glob("*")):
        for port in sorted((dev / "ports").glob("*")):
            if not port.name.isdecimal():
                continue
            state = (_read(port / "state") or "").partition(":")[2].strip()
            phys = (_read(port / "phys_state") or "").partition(":")[2].strip()
            out[(dev.name, int(port.name))] = IbPort(state, phys)
    return out


def read_edac(root: Path) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for mc in sorted((root / "sys" / "devices" / "system" / "edac" / "mc").glob("mc*")):
        ce, ue = _int(_read(mc / "ce_count")), _int(_read(mc / "ue_count"))
        if ce is not None or ue is not None:
            out[mc.name] = (ce or 0, ue or 0)
    return out


def sample(root: Path) -> HostSample:
    return HostSample(read_mounts(root), read_md(root), read_nvme(root), read_ib_ports(root), read_edac(root))


class HostWatcher:
    """Samples :func:`sample` every ``interval_s`` and emits what changed (module docstring)."""

    name = "host"

    def __init__(
        self,
        node: str,
        emit: Emit,
        *,
        root: Path = Path("/"),
        interval_s: float = 30.0,
        ib_window_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self._emit = emit
        self.root = root
        self.interval_s = interval_s
        self.ib_window_s = ib_window_s
        self._clock = clock
        self._last: HostSample | None = None
        self._was_active: set[tuple[str, int]] = set()  # ports seen ACTIVE (unused ports never are)
        self._down_since: dict[tuple[str, int], float] = {}
        self._reported_down: set[tuple[str, int]] = set()
        self.last_progress = time.monotonic()

    async def run(self) -> None:
        while True:
            now_sample = await asyncio.to_thread(sample, self.root)
            for event in self.check(now_sample, self._clock()):
                await self._emit(event)
            self.last_progress = time.monotonic()
            await asyncio.sleep(self.interval_s)

    def _event(self, kind: Kind, severity: str, data: dict[str, Any], now: float) -> Event:
        return make_event(self.node, kind, severity=severity, source="host", data=data, ts=now)

    def check(self, new: HostSample, now: float) -> list[Event]:
        """The events between the previous sample and ``new`` (taken at ``now``); keeps ``new``."""
        old, self._last = self._last, new
        events = [*self._storage(old, new, now), *self._ib(new, now), *self._edac(old, new, now)]
        if old is not None:
            events += self._readonly(old, new, now)
        return events

    def _readonly(self, old: HostSample, new: HostSample, now: float) -> list[Event]:
        was_rw = {(m.device, m.path) for m in old.mounts if not m.ro}
        return [
            self._event(
                Kind.FS_READONLY,
                "critical",
                {
                    "device": Path(m.device).name,
                    "fstype": m.fstype,
                    "mount": m.path,
                    "extra": {"from": "mounts"},
                },
                now,
            )
            for m in new.mounts
            if m.ro
            and (m.device, m.path) in was_rw
            and m.device.startswith("/dev/")
            and m.fstype not in _NETWORK_FS
        ]

    def _storage(self, old: HostSample | None, new: HostSample, now: float) -> list[Event]:
        events = []
        for name, (degraded, state) in new.md.items():
            before = old.md.get(name, (0, "")) if old is not None else (0, "")
            if state in ("broken", "inactive") and before[1] not in ("broken", "inactive") and before[1]:
                data = {
                    "device": name,
                    "subsystem": "md",
                    "fault": "array_failed",
                    "extra": {"array_state": state},
                }
                events.append(self._event(Kind.STORAGE, "critical", data, now))
            elif degraded > before[0]:
                data = {
                    "device": name,
                    "subsystem": "md",
                    "fault": "disk_failed",
                    "extra": {"degraded": degraded},
                }
                events.append(self._event(Kind.STORAGE, "error", data, now))
        for ctrl, state in new.nvme.items():
            before_state = old.nvme.get(ctrl) if old is not None else None
            if state == "dead" and before_state != "dead":
                data = {"device": ctrl, "subsystem": "nvme", "fault": "dead", "extra": {"state": state}}
                events.append(self._event(Kind.STORAGE, "critical", data, now))
        return events

    def _ib(self, new: HostSample, now: float) -> list[Event]:
        events = []
        for key, port in new.ib.items():
            device, number = key
            if port.state == "ACTIVE":
                if key in self._reported_down:
                    log.info("ib_port_recovered", device=device, port=number)
                self._was_active.add(key)
                self._down_since.pop(key, None)
                self._reported_down.discard(key)
            elif key in self._was_active:
                since = self._down_since.setdefault(key, now)
                if now - since >= self.ib_window_s and key not in self._reported_down:
                    self._reported_down.add(key)
                    extra = {
                        "interface": f"{device} port {number}",  # what rule nccl_ib's reason names
                        "device": device,
                        "port": number,
                        "state": port.state,
                        "phys_state": port.phys_state,
                        "down_s": round(now - since, 1),
                        "from": "sysfs",
                    }
                    events.append(self._event(Kind.IB_LINK, "error", {"extra": extra}, now))
        return events

    def _edac(self, old: HostSample | None, new: HostSample, now: float) -> list[Event]:
        if old is None:
            return []
        events = []
        for mc, (ce, ue) in new.edac.items():
            ce0, ue0 = old.edac.get(mc, (ce, ue))
            if ue > ue0:
                extra = {"edac": mc, "count": ue - ue0, "uncorrected": True, "from": "edac"}
                events.append(self._event(Kind.MACHINE_CHECK, "critical", {"extra": extra}, now))
            elif ce > ce0:
                extra = {"edac": mc, "count": ce - ce0, "uncorrected": False, "from": "edac"}
                events.append(self._event(Kind.MACHINE_CHECK, "info", {"extra": extra}, now))
        return events
