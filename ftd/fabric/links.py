"""Link health: a PCIe link's width and speed against its maximum, an IB port's rate against its profile.

What: parsers of the kernel's words (sysfs ``current_link_speed`` "16.0 GT/s PCIe", ``rate`` "400 Gb/sec
(4X NDR)", the kernel log's "limited by 8.0 GT/s PCIe x4 link") and judges that say what is degraded
and by how much: :func:`judge_pcie` compares a :class:`PcieLink`'s current width and speed with its
maximum (lanes lost, generation lost, the share of the link's bandwidth left); :func:`judge_port`
compares an IB port's :class:`PortRate` with the hardware profile's expected rate and width.

Why pure: the agent reads sysfs and NVML, the kmsg parser reads the log; all three judge the same way.
A value that cannot be parsed is ``None`` (unknown), and an unknown is never judged healthy: the
caller reports the check as skipped with its reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["PcieLink", "PortRate", "judge_pcie", "judge_port", "parse_ib_rate", "parse_pcie_speed",
           "parse_width", "pcie_gen", "pcie_lane_gbps"]  # fmt: skip

#: PCIe generation by transfer rate (GT/s).
_GEN_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
_SPEED_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s")
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec(?:\s*\((\d+)X\s*([A-Za-z0-9]*)\))?")


def parse_pcie_speed(text: str | None) -> float | None:
    """GT/s of ``"16.0 GT/s PCIe"`` (also ``"16 GT/s"``, NVML's generation is converted by the
    caller); ``None`` for ``"Unknown"``, empty or junk."""
    match = _SPEED_RE.match(text or "")
    return float(match.group(1)) if match else None


def parse_width(text: str | None) -> int | None:
    """Lanes of ``"16"`` or ``"x16"``; ``None`` for junk. ``0`` is a real answer (a link that is down)."""
    value = (text or "").strip().removeprefix("x").removeprefix("X")
    return int(value) if value.isdecimal() and len(value) <= 3 else None


def pcie_gen(gts: float | None) -> int | None:
    """The PCIe generation of a transfer rate (16.0 -> 4), ``None`` for an unknown rate."""
    return None if gts is None else _GEN_BY_GTS.get(gts)


def pcie_lane_gbps(gts: float) -> float:
    """One lane's payload bandwidth in Gb/s (8b/10b up to 5 GT/s, 128b/130b from 8 GT/s; PAM4/FLIT
    at 64 GT/s counted as 242/256)."""
    if gts <= 5.0:
        return gts * 0.8
    if gts >= 64.0:
        return gts * 242 / 256
    return gts * 128 / 130


GTS_BY_GEN = {gen: gts for gts, gen in _GEN_BY_GTS.items()}


@dataclass(frozen=True, slots=True)
class PcieLink:
    cur_gts: float | None
    max_gts: float | None
    cur_width: int | None
    max_width: int | None


@dataclass(frozen=True, slots=True)
class PcieVerdict:
    degraded: bool
    unknown: str  # why it cannot be judged ("" when it can)
    lanes_lost: int = 0
    gens_lost: int = 0
    bandwidth_pct: float = 100.0  # the current link's bandwidth as a share of its maximum's
    what: str = ""  # "width", "speed", "width+speed" or "down"


def judge_pcie(link: PcieLink) -> PcieVerdict:
    """Current against maximum: lanes and generations lost, and the bandwidth left (in percent)."""
    missing = [
        name
        for name, value in (
            ("current speed", link.cur_gts),
            ("max speed", link.max_gts),
            ("current width", link.cur_width),
            ("max width", link.max_width),
        )
        if value is None
    ]
    if missing:
        return PcieVerdict(False, "unreadable: " + ", ".join(missing))
    assert link.cur_gts is not None and link.max_gts is not None
    assert link.cur_width is not None and link.max_width is not None
    if link.max_width <= 0 or link.max_gts <= 0:
        return PcieVerdict(False, "no maximum link reported")
    if link.cur_width == 0:
        return PcieVerdict(True, "", link.max_width, 0, 0.0, "down")
    lanes_lost = max(0, link.max_width - link.cur_width)
    cur_gen, max_gen = pcie_gen(link.cur_gts), pcie_gen(link.max_gts)
    gens_lost = max(0, max_gen - cur_gen) if cur_gen is not None and max_gen is not None else 0
    slower = link.cur_gts < link.max_gts
    have = pcie_lane_gbps(link.cur_gts) * link.cur_width
    full = pcie_lane_gbps(link.max_gts) * link.max_width
    pct = round(min(100.0, 100.0 * have / full), 1)
    what = "+".join(w for w, bad in (("width", lanes_lost > 0), ("speed", slower)) if bad)
    return PcieVerdict(bool(what), "", lanes_lost, gens_lost, pct, what)


@dataclass(frozen=True, slots=True)
class PortRate:
    gbps: float
    width: str | None  # "4X"
    speed: str | None  # "NDR", "HDR", "EDR" (RoCE ports report none)


def parse_ib_rate(text: str | None) -> PortRate | None:
    """``"400 Gb/sec (4X NDR)"`` -> ``PortRate(400.0, "4X", "NDR")``; ``"100 Gb/sec"`` (RoCE) has no
    width; ``None`` for junk."""
    match = _RATE_RE.match(text or "")
    if match is None:
        return None
    lanes, speed = match.group(2), match.group(3)
    return PortRate(float(match.group(1)), f"{lanes}X" if lanes else None, speed or None)


@dataclass(frozen=True, slots=True)
class PortVerdict:
    degraded: bool
    unknown: str
    expected_gbps: float | None = None
    expected_width: str | None = None
    pct: float = 100.0


def judge_port(rate: PortRate | None, expected_gbps: float | None, expected_width: str | None) -> PortVerdict:
    """A port's rate and width against the profile's (``None``: the profile says nothing: unknown)."""
    if rate is None:
        return PortVerdict(False, "rate unreadable")
    if expected_gbps is None or expected_gbps <= 0:
        return PortVerdict(False, "the hardware profile names no port rate")
    slow = rate.gbps < expected_gbps
    narrow = expected_width is not None and rate.width is not None and rate.width != expected_width
    pct = round(min(100.0, 100.0 * rate.gbps / expected_gbps), 1)
    return PortVerdict(slow or narrow, "", expected_gbps, expected_width, pct)
