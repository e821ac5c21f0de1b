"""The fabric's files: IB/RoCE ports, their counters, network devices and PCI places, PCIe links.

What: pure readers of a root directory (``/`` on a node, a tree a test's process wrote):

* :func:`read_ports`: every ``sys/class/infiniband/<dev>/ports/<n>/`` -- ``state``, ``phys_state``,
  ``link_layer``, ``rate`` (``iblinkinfo``'s view), ``counters/*`` and ``hw_counters/*`` -- with the
  port's network devices (``<dev>/device/net/<netdev>``, their ``dev_port`` choosing the port:
  ``ibdev2netdev``'s view) and its PCI function (where the ``device`` link points);
* :func:`gpu_functions`: NVIDIA display / 3D controllers under ``sys/bus/pci/devices`` (vendor
  ``0x10de``, class ``0x03....``);
* :func:`read_pcie_link`: ``current_link_speed``, ``max_link_speed``, ``current_link_width``,
  ``max_link_width`` of one PCI function;
* :func:`nearest_gpus`: the GPUs closest to a NIC in the PCI tree (same switch, same root port, same
  host bridge), as ``nvidia-smi topo`` would group them.

A file that is missing or unreadable is recorded as such (``missing`` / ``unreadable`` with its
error), never read as zero: the watcher reports that check as skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ftd.fabric.links import PcieLink, parse_pcie_speed, parse_width
from ftd.pci import normalize_pci

__all__ = ["IbPortFacts", "Locality", "gpu_functions", "nearest_gpus", "pci_path", "read_pcie_link",
           "read_ports"]  # fmt: skip

_NVIDIA = "0x10de"
_LINK_FILES = ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width")


class Unreadable(Exception):
    """A file that exists and cannot be read (permission, I/O error), with the error."""


def _read(path: Path) -> str | None:
    """The file's text; ``None`` when it does not exist; :class:`Unreadable` when it cannot be read."""
    try:
        return path.read_text(errors="replace").strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Unreadable(f"{path.name}: {exc.strerror or exc}") from None


def _read_quiet(path: Path) -> str | None:
    try:
        return _read(path)
    except Unreadable:
        return None


def _word(text: str | None) -> str | None:
    """``"4: ACTIVE"`` -> ``"ACTIVE"``; ``"InfiniBand"`` stays."""
    if text is None:
        return None
    return (text.partition(":")[2] if ":" in text else text).strip() or None


@dataclass
class IbPortFacts:
    device: str
    port: int
    state: str | None = None
    phys_state: str | None = None
    link_layer: str | None = None
    rate: str | None = None
    bdf: str | None = None
    netdevs: list[str] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)  # counters/
    hw_counters: dict[str, int] = field(default_factory=dict)  # hw_counters/
    problems: dict[str, str] = field(default_factory=dict)  # "ib:NAME" / "hw:NAME" -> why unread

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"


def _counters(
    folder: Path, source: str, problems: dict[str, str], wanted: Collection[str] | None
) -> dict[str, int]:
    """The counters in ``folder`` (only the ``wanted`` names when given: a port has dozens)."""
    out: dict[str, int] = {}
    try:
        names = sorted(p.name for p in folder.iterdir())
    except FileNotFoundError:
        problems[f"{source}:*"] = f"no {folder.name}/ directory"
        return out
    except OSError as exc:
        problems[f"{source}:*"] = f"{folder.name}/: {exc.strerror or exc}"
        return out
    if wanted is not None:
        names = [n for n in names if n in wanted]
    for entry in (folder / n for n in names):
        try:
            text = _read(entry)
        except Unreadable as exc:
            problems[f"{source}:{entry.name}"] = str(exc)
            continue
        if text is None:
            continue
        if text.isdecimal():
            out[entry.name] = int(text)
        else:
            problems[f"{source}:{entry.name}"] = f"{entry.name}: not a counter: {text[:40]!r}"
    return out


def _netdevs(device_dir: Path, port: int) -> list[str]:
    """The network devices of ``port``: those whose ``dev_port`` is ``port - 1``, or every one when
    none says (a single-port function)."""
    try:
        names = sorted(p.name for p in (device_dir / "net").iterdir())
    except OSError:
        return []
    mine = [n for n in names if (_read_quiet(device_dir / "net" / n / "dev_port") or "") == str(port - 1)]
    return mine or (names if len(names) == 1 else [])


def read_ports(root: Path, wanted: Mapping[str, Collection[str]] | None = None) -> list[IbPortFacts]:
    """Every IB / RoCE port under ``root`` (module docstring); ``wanted``: the counter names to read
    per source (``ib``, ``hw``), every counter when ``None``."""
    out: list[IbPortFacts] = []
    base = root / "sys" / "class" / "infiniband"
    try:
        devices = sorted(base.iterdir())
    except OSError:
        return out
    for dev in devices:
        device_dir = dev / "device"
        bdf = None
        with contextlib.suppress(OSError):
            bdf = normalize_pci(os.path.basename(os.path.realpath(device_dir)))
        try:
            ports = sorted((dev / "ports").iterdir())
        except OSError:
            continue
        for port_dir in ports:
            if not port_dir.name.isdecimal():
                continue
            facts = IbPortFacts(dev.name, int(port_dir.name), bdf=bdf)
            for attr in ("state", "phys_state", "link_layer", "rate"):
                try:
                    text = _read(port_dir / attr)
                except Unreadable as exc:
                    facts.problems[attr] = str(exc)
                    continue
                setattr(facts, attr, text if attr == "rate" else _word(text))
            ib = None if wanted is None else wanted.get("ib", ())
            hw = None if wanted is None else wanted.get("hw", ())
            facts.counters = _counters(port_dir / "counters", "ib", facts.problems, ib)
            facts.hw_counters = _counters(port_dir / "hw_counters", "hw", facts.problems, hw)
            facts.netdevs = _netdevs(device_dir, facts.port)
            out.append(facts)
    return out


def gpu_functions(root: Path) -> list[str]:
    """The PCI addresses of NVIDIA GPUs under ``sys/bus/pci/devices``, sorted."""
    out: list[str] = []
    try:
        entries = sorted((root / "sys" / "bus" / "pci" / "devices").iterdir())
    except OSError:
        return out
    for entry in entries:
        vendor = _read_quiet(entry / "vendor")
        klass = _read_quiet(entry / "class") or ""
        if vendor == _NVIDIA and klass.startswith("0x03") and (bdf := normalize_pci(entry.name)):
            out.append(bdf)
    return out


def read_pcie_link(root: Path, bdf: str) -> tuple[PcieLink | None, str]:
    """One PCI function's link, or ``None`` and why it cannot be read."""
    folder = root / "sys" / "bus" / "pci" / "devices" / bdf
    if not folder.exists():
        return None, f"no PCI function {bdf} in sysfs"
    try:
        texts = [_read(folder / name) for name in _LINK_FILES]
    except Unreadable as exc:
        return None, f"unreadable: {exc}"
    if all(t is None for t in texts):
        return None, "no link files (not a PCIe function, or a kernel without them)"
    cur_speed, max_speed, cur_width, max_width = texts
    return PcieLink(
        parse_pcie_speed(cur_speed),
        parse_pcie_speed(max_speed),
        parse_width(cur_width),
        parse_width(max_width),
    ), ""


def pci_path(root: Path, bdf: str) -> list[str]:
    """The chain of PCI functions from the host bridge down to ``bdf`` (``["pci0000:00",
    "0000:00:01.0", "0000:01:00.0", "0000:17:00.0"]``), from the real path of its sysfs link."""
    link = root / "sys" / "bus" / "pci" / "devices" / bdf
    try:
        real = Path(os.path.realpath(link))
    except OSError:
        return []
    parts = real.parts
    for i, part in enumerate(parts):
        if part.startswith("pci") and ":" in part:
            return list(parts[i:])
    return []


Locality = str  # "switch" | "root_port" | "host_bridge" | "none"


def nearest_gpus(root: Path, nic_bdf: str, gpus: list[str]) -> tuple[list[str], Locality]:
    """The GPUs that share the longest stretch of ``nic_bdf``'s PCI path, and how near they are:
    ``switch`` (a bridge below the root port in common), ``root_port``, ``host_bridge``, ``none``."""
    nic = pci_path(root, nic_bdf)
    if not nic:
        return [], "none"
    best: list[str] = []
    depth = 0
    for gpu in gpus:
        path = pci_path(root, gpu)
        common = 0
        for a, b in zip(nic[:-1], path[:-1], strict=False):
            if a != b:
                break
            common += 1
        if common > depth:
            best, depth = [gpu], common
        elif common == depth and common > 0:
            best.append(gpu)
    names = {0: "none", 1: "host_bridge", 2: "root_port"}
    return best, names.get(depth, "switch")
