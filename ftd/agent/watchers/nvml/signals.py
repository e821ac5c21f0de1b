"""What changed between two samples of one GPU: one small pure function per signal.

Each function compares the previous sample (``None`` for the first, the baseline) with the new one
and returns a :data:`Finding` (event kind, severity, data) or ``None``. The watcher sends the
findings of :func:`diff` in its fixed order: ECC, the SRAM replacement threshold, correctable-ECC
rate, row remapping, retired pages, temperature, throttle reasons, sustained throttling, PCIe
replays, NVLink errors, NVLink links down, SM clocks. Power is read but is not a signal of its own: it
is part of the throttle event's data.

SM clocks (:func:`sm_clocks`): an ``info`` ``thermal`` finding with ``signal = "sm_clocks"``,
``sm_mhz`` and ``max_mhz`` (no ``active``: it alerts nobody), on the first sample and whenever the
SM clock moved by :data:`CLOCKS_CHANGE` of its maximum since the one last sent, at most one per
:data:`CLOCKS_MIN_GAP_S` per GPU: the coordinator's slow-rank findings say each GPU's latest clock
against its maximum (issue #33 item 3), and a GPU whose clock holds steady sends nothing more.

Counters are reported when they *rise* (the baseline is not reported), but states that need a human
(volatile DBE > 0, remap pending/failure, retired pages pending, a GPU past the SRAM replacement
threshold) are reported on the first sample too, with ``initial=true``. Signals that need memory
beyond the previous sample (temperature hysteresis, the NVLink baseline, the correctable-ECC window,
how long throttling has lasted) keep it in the GPU's :class:`GpuMemory`, which :func:`diff` updates.

Every ``gpu_health`` finding carries ``data.signal``: ``retired_pages``, ``pcie_replay``,
``nvlink_errors`` or ``nvlink_down`` (and ``nvlink_up``, an info, when downed links come back).
The correctable-ECC rate is an ``ecc`` finding with ``signal = "correctable_rate"``; a GPU past
NVIDIA's SRAM replacement threshold (more than 4 uncorrectable SRAM errors over its life, or the
driver's own flag: :mod:`ftd.catalog.gpu_limits`) a critical ``ecc`` finding with ``signal =
"sram_threshold"``, on the first sample and whenever the threshold is crossed (a node condition).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from ftd.agent.watchers.nvml.backend import THROTTLE_ALERT_REASONS, throttle_names
from ftd.agent.watchers.nvml.probe import GpuSample
from ftd.catalog.gpu_limits import SRAM_UNCORRECTABLE_LIMIT, sram_over_limit
from ftd.config import NvmlConfig
from ftd.events import Kind, Severity

__all__ = [
    "Finding",
    "GpuMemory",
    "diff",
    "ecc",
    "ecc_correctable_rate",
    "nvlink",
    "nvlink_down",
    "pcie_replay",
    "retired_pages",
    "row_remap",
    "sm_clocks",
    "sram_threshold",
    "temperature",
    "throttle",
    "throttle_sustained",
]

Finding = tuple[Kind, Severity, dict[str, Any]]

CLOCKS_CHANGE = 0.1  # a move of the SM clock worth sending, as a fraction of its maximum
CLOCKS_MIN_GAP_S = 30.0  # at most one SM clock finding per GPU this often

_FLAGS = frozenset({"sram_threshold_exceeded"})  # states among the ECC counters, not counts that rise


@dataclasses.dataclass(slots=True)
class GpuMemory:
    """What the signals of one GPU remember between samples (kept by the watcher per GPU)."""

    hot: bool = False  # temperature at or above the threshold (until it falls below the hysteresis)
    links_baseline: frozenset[int] | None = None  # NVLink links active in the first sample
    links_down: frozenset[int] = frozenset()  # links reported down (and not back yet)
    throttle_since: float | None = None  # when an alerting throttle reason became (continuously) set
    throttle_sustained: bool = False  # the sustained-throttling event was sent for this episode
    ecc_window: collections.deque[tuple[float, int]] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=4096)
    )  # (time, volatile correctable count)
    ecc_rate_reported: bool = False  # the correctable-rate event was sent for this episode
    clocks_sent: tuple[int, float] | None = None  # the SM clock last sent (MHz) and when


def diff(old: GpuSample | None, new: GpuSample, cfg: NvmlConfig, index: int, mem: GpuMemory) -> list[Finding]:
    """Every finding between ``old`` and ``new``, in event order; updates ``mem``."""
    mem.hot, thermal = temperature(mem.hot, new, cfg)
    found = (
        ecc(old, new),
        sram_threshold(old, new, index),
        ecc_correctable_rate(new, cfg, index, mem),
        row_remap(old, new),
        retired_pages(old, new, index),
        thermal,
        throttle(old, new),
        throttle_sustained(new, cfg, index, mem),
        pcie_replay(old, new, cfg, index),
        nvlink(old, new, cfg, index),
        nvlink_down(old, new, index, mem),
        sm_clocks(new, mem),
    )
    return [finding for finding in found if finding is not None]


def ecc(old: GpuSample | None, new: GpuSample) -> Finding | None:
    """Any ECC counter rose (SBE: warning, DBE: error); on the baseline, volatile DBE > 0."""
    if new.ecc is None:
        return None
    if old is None:
        if new.ecc.get("volatile_dbe", 0) > 0:
            return Kind.ECC, Severity.ERROR, {"initial": True, "counters": new.ecc, "dbe": True}
        return None
    if old.ecc is None:
        return None
    deltas = {
        k: v - old.ecc.get(k, 0) for k, v in new.ecc.items() if v > old.ecc.get(k, 0) and k not in _FLAGS
    }
    if not deltas:
        return None
    dbe = any("_dbe" in k for k in deltas)
    severity = Severity.ERROR if dbe else Severity.WARNING
    return Kind.ECC, severity, {"deltas": deltas, "counters": new.ecc, "dbe": dbe}


def sram_threshold(old: GpuSample | None, new: GpuSample, index: int) -> Finding | None:
    """The GPU is past the SRAM replacement threshold and was not in the previous sample (or this is
    the first): critical, a condition that stays until the GPU is replaced (the counter is lifetime)."""
    if new.ecc is None or not sram_over_limit(new.ecc):
        return None
    if old is not None and sram_over_limit(old.ecc):
        return None
    data = {
        "signal": "sram_threshold",
        "sram_uncorrectable": new.ecc.get("aggregate_dbe_sram"),
        "threshold": SRAM_UNCORRECTABLE_LIMIT,
        "threshold_exceeded": bool(new.ecc.get("sram_threshold_exceeded", 0)),
        "initial": old is None,
        "counters": new.ecc,
        "gpu": index,
    }
    return Kind.ECC, Severity.CRITICAL, data


def ecc_correctable_rate(new: GpuSample, cfg: NvmlConfig, index: int, mem: GpuMemory) -> Finding | None:
    """The volatile correctable (SBE) count grows faster than ``ecc_correctable_rate_per_hour``.

    The rate is measured over the samples of the last ``ecc_correctable_window_s`` (at least two,
    spanning ``ecc_correctable_min_span_s``): growth between the oldest and the newest, per hour.
    Once per episode; re-armed when the rate falls below half the threshold. A count that goes down
    (the volatile counters reset with the GPU or the driver) starts the window afresh.
    """
    if new.ecc is None or "volatile_sbe" not in new.ecc:
        return None
    count = new.ecc["volatile_sbe"]
    window = mem.ecc_window
    if window and count < window[-1][1]:
        window.clear()
    window.append((new.t, count))
    while len(window) > 2 and window[1][0] <= new.t - cfg.ecc_correctable_window_s:
        window.popleft()  # keep the newest sample at or before the window's start
    (t0, c0), (t1, c1) = window[0], window[-1]
    span = t1 - t0
    if len(window) < 2 or span < cfg.ecc_correctable_min_span_s:
        return None
    rate = (c1 - c0) * 3600.0 / span
    threshold = cfg.ecc_correctable_rate_per_hour
    if rate < threshold / 2:
        mem.ecc_rate_reported = False
    if rate <= threshold or mem.ecc_rate_reported:
        return None
    mem.ecc_rate_reported = True
    data = {
        "signal": "correctable_rate",
        "rate_per_hour": round(rate, 1),
        "threshold_per_hour": threshold,
        "window_s": round(span, 1),
        "correctable_delta": c1 - c0,
        "volatile_sbe": count,
        "gpu": index,
    }
    return Kind.ECC, Severity.WARNING, data


def row_remap(old: GpuSample | None, new: GpuSample) -> Finding | None:
    """Remap pending or failure newly set, or uncorrectable/correctable remaps grew; with histogram."""
    if new.remap is None:
        return None
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
    if not reasons:
        return None
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
        "no_spare_rows": new.remap.failure,  # NVML's remap failure bit: the GPU ran out of spare rows
        "histogram": new.histogram,
    }
    if prev is not None:
        data["uncorrected_delta"] = new.remap.uncorrected - prev.uncorrected
        data["corrected_delta"] = new.remap.corrected - prev.corrected
    else:
        data["initial"] = True
    return Kind.ROW_REMAP, severity, data


def retired_pages(old: GpuSample | None, new: GpuSample, index: int) -> Finding | None:
    """Retired pages pending newly set (older GPUs; H100 remaps rows instead)."""
    if not new.retired_pending or (old is not None and old.retired_pending):
        return None
    data = {"signal": "retired_pages", "retired_pages_pending": True, "initial": old is None, "gpu": index}
    return Kind.GPU_HEALTH, Severity.ERROR, data


def temperature(hot: bool, new: GpuSample, cfg: NvmlConfig) -> tuple[bool, Finding | None]:
    """Reaching ``temperature_c`` sets ``hot``; falling below it minus the hysteresis clears it."""
    temp = new.temperature_c
    if temp is None:
        return hot, None
    if not hot and temp >= cfg.temperature_c:
        data = {"active": True, "sustained": False, "temperature_c": temp, "threshold_c": cfg.temperature_c}
        return True, (Kind.THERMAL, Severity.WARNING, data)
    if hot and temp < cfg.temperature_c - cfg.temperature_hysteresis_c:
        data = {"active": False, "sustained": False, "temperature_c": temp, "threshold_c": cfg.temperature_c}
        return False, (Kind.THERMAL, Severity.INFO, data)
    return hot, None


def throttle(old: GpuSample | None, new: GpuSample) -> Finding | None:
    """An alerting throttle reason newly set (warning), or the last one cleared (info)."""
    if new.throttle is None:
        return None
    alert_mask = sum(THROTTLE_ALERT_REASONS)
    now_bits = new.throttle & alert_mask
    old_bits = 0 if old is None or old.throttle is None else old.throttle & alert_mask
    if not (now_bits & ~old_bits or (old_bits and not now_bits)):
        return None
    data = {
        "active": bool(now_bits),
        "sustained": False,
        "throttle_reasons": throttle_names(new.throttle),
        "new_reasons": throttle_names(now_bits & ~old_bits),
        "throttle_mask": new.throttle,
        "temperature_c": new.temperature_c,
        "power_w": new.power_w,
    }
    return Kind.THERMAL, Severity.WARNING if now_bits else Severity.INFO, data


def throttle_sustained(new: GpuSample, cfg: NvmlConfig, index: int, mem: GpuMemory) -> Finding | None:
    """An alerting throttle reason stayed set (any of them, without a gap) for ``thermal_sustained_s``.

    Once per episode (error); re-armed when no alerting reason is set. A sample without the throttle
    answer keeps the episode as it is."""
    if new.throttle is None:
        return None
    bits = new.throttle & sum(THROTTLE_ALERT_REASONS)
    if not bits:
        mem.throttle_since, mem.throttle_sustained = None, False
        return None
    if mem.throttle_since is None:
        mem.throttle_since = new.t
    lasted = new.t - mem.throttle_since
    if mem.throttle_sustained or lasted < cfg.thermal_sustained_s:
        return None
    mem.throttle_sustained = True
    data = {
        "active": True,
        "sustained": True,
        "sustained_s": round(lasted, 1),
        "threshold_s": cfg.thermal_sustained_s,
        "throttle_reasons": throttle_names(new.throttle),
        "alert_reasons": throttle_names(bits),
        "throttle_mask": new.throttle,
        "temperature_c": new.temperature_c,
        "power_w": new.power_w,
        "gpu": index,
    }
    return Kind.THERMAL, Severity.ERROR, data


def sm_clocks(new: GpuSample, mem: GpuMemory) -> Finding | None:
    """The SM clock against its maximum, when first known and when it moved (module docstring)."""
    if new.sm_clocks is None:
        return None
    now, top = new.sm_clocks
    if top <= 0 or now < 0:
        return None  # no maximum to weigh it against: not a reading
    sent = mem.clocks_sent
    if sent is not None and (abs(now - sent[0]) < CLOCKS_CHANGE * top or new.t - sent[1] < CLOCKS_MIN_GAP_S):
        return None
    mem.clocks_sent = (now, new.t)
    return Kind.THERMAL, Severity.INFO, {"signal": "sm_clocks", "sm_mhz": now, "max_mhz": top}


def pcie_replay(old: GpuSample | None, new: GpuSample, cfg: NvmlConfig, index: int) -> Finding | None:
    """At least ``pcie_replay_burst`` PCIe replays since the previous sample."""
    if new.pcie_replay is None or old is None or old.pcie_replay is None:
        return None
    delta = new.pcie_replay - old.pcie_replay
    if delta < cfg.pcie_replay_burst:
        return None
    data = {
        "signal": "pcie_replay",
        "pcie_replay_burst": delta,
        "pcie_replay_total": new.pcie_replay,
        "interval_s": cfg.interval_s,
        "gpu": index,
    }
    return Kind.GPU_HEALTH, Severity.WARNING, data


def nvlink(old: GpuSample | None, new: GpuSample, cfg: NvmlConfig, index: int) -> Finding | None:
    """NVLink error counters rose by at least ``nvlink_error_burst`` in total since the previous sample."""
    if new.nvlink is None or old is None or old.nvlink is None:
        return None
    deltas = {
        k: v - old.nvlink.get(k, 0)
        for k, v in new.nvlink.items()
        if k != "active_links" and v > old.nvlink.get(k, 0)
    }
    if sum(deltas.values()) < cfg.nvlink_error_burst:
        return None
    return (
        Kind.GPU_HEALTH,
        Severity.WARNING,
        {"signal": "nvlink_errors", "nvlink_errors": deltas, "nvlink_totals": new.nvlink, "gpu": index},
    )


def nvlink_down(old: GpuSample | None, new: GpuSample, index: int, mem: GpuMemory) -> Finding | None:
    """NVLink links that were active (in the first sample or the previous one) and are now inactive.

    An error, ``signal = "nvlink_down"``, with every link now down (``links_down``, and
    ``new_links_down`` for this drop). When reported links come back: an info with its own signal,
    ``nvlink_up`` (``links_up``, and ``still_down`` for those not back yet; no ``links_down`` key,
    so nothing that acts on a link going down can mistake it for one). A link whose state was not
    read this time is neither down nor back. A GPU whose first sample has no active link has no
    NVLink in use: nothing is reported for it.
    """
    links = new.nvlink_links
    if links is None:
        return None
    active = frozenset(link for link, up in links.items() if up)
    if mem.links_baseline is None:
        mem.links_baseline = active
    prev = None if old is None else old.nvlink_links
    prev_active = frozenset(link for link, up in (prev or {}).items() if up)
    expected = mem.links_baseline | prev_active
    inactive = frozenset(link for link, up in links.items() if not up)
    newly_down = (expected & inactive) - mem.links_down
    back = mem.links_down & active
    if not newly_down and not back:
        return None
    mem.links_down = (mem.links_down | newly_down) - back
    data: dict[str, Any] = {
        "active_links": len(active),
        "previous_active_links": len(prev_active) if prev is not None else len(mem.links_baseline),
        "baseline_active_links": len(mem.links_baseline),
        "gpu": index,
    }
    if newly_down:
        data.update(signal="nvlink_down", links_down=sorted(mem.links_down))
        data["new_links_down"] = sorted(newly_down)
        if back:
            data["links_up"] = sorted(back)
        return Kind.GPU_HEALTH, Severity.ERROR, data
    data.update(signal="nvlink_up", links_up=sorted(back), still_down=sorted(mem.links_down), recovered=True)
    return Kind.GPU_HEALTH, Severity.INFO, data
