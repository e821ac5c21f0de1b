"""What changed between two samples of one GPU: one small pure function per signal.

Each function compares the previous sample (``None`` for the first, the baseline) with the new one
and returns a :data:`Finding` (event kind, severity, data) or ``None``. The watcher sends the
findings of :func:`diff` in its fixed order: ECC, row remapping, retired pages, temperature,
throttle reasons, PCIe replays, NVLink. Power is read but is not a signal of its own: it is part of
the throttle event's data.

Counters are reported when they *rise* (the baseline is not reported), but states that need a human
(volatile DBE > 0, remap pending/failure, retired pages pending) are reported on the first sample
too, with ``initial=true``. Temperature has a threshold with hysteresis, so it needs one bit of
memory (``hot``), passed in and returned.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ftd.agent.watchers.nvml.backend import THROTTLE_ALERT_REASONS, throttle_names
from ftd.agent.watchers.nvml.probe import GpuSample
from ftd.config import NvmlConfig
from ftd.events import Kind, Severity

__all__ = [
    "Finding",
    "diff",
    "ecc",
    "nvlink",
    "pcie_replay",
    "retired_pages",
    "row_remap",
    "temperature",
    "throttle",
]

Finding = tuple[Kind, Severity, dict[str, Any]]


def diff(
    old: GpuSample | None, new: GpuSample, cfg: NvmlConfig, index: int, hot: bool
) -> tuple[list[Finding], bool]:
    """Every finding between ``old`` and ``new``, in event order, and whether the GPU is now hot."""
    hot, thermal = temperature(hot, new, cfg)
    found = (
        ecc(old, new),
        row_remap(old, new),
        retired_pages(old, new, index),
        thermal,
        throttle(old, new),
        pcie_replay(old, new, cfg, index),
        nvlink(old, new, cfg, index),
    )
    return [finding for finding in found if finding is not None], hot


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
    deltas = {k: v - old.ecc.get(k, 0) for k, v in new.ecc.items() if v > old.ecc.get(k, 0)}
    if not deltas:
        return None
    dbe = any("_dbe" in k for k in deltas)
    severity = Severity.ERROR if dbe else Severity.WARNING
    return Kind.ECC, severity, {"deltas": deltas, "counters": new.ecc, "dbe": dbe}


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
    data: dict[str, Any] = {"reasons": reasons, **dataclasses.asdict(new.remap), "histogram": new.histogram}
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
    data = {"retired_pages_pending": True, "initial": old is None, "gpu": index}
    return Kind.GPU_HEALTH, Severity.ERROR, data


def temperature(hot: bool, new: GpuSample, cfg: NvmlConfig) -> tuple[bool, Finding | None]:
    """Reaching ``temperature_c`` sets ``hot``; falling below it minus the hysteresis clears it."""
    temp = new.temperature_c
    if temp is None:
        return hot, None
    if not hot and temp >= cfg.temperature_c:
        data = {"active": True, "temperature_c": temp, "threshold_c": cfg.temperature_c}
        return True, (Kind.THERMAL, Severity.WARNING, data)
    if hot and temp < cfg.temperature_c - cfg.temperature_hysteresis_c:
        data = {"active": False, "temperature_c": temp, "threshold_c": cfg.temperature_c}
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
        "throttle_reasons": throttle_names(new.throttle),
        "new_reasons": throttle_names(now_bits & ~old_bits),
        "throttle_mask": new.throttle,
        "temperature_c": new.temperature_c,
        "power_w": new.power_w,
    }
    return Kind.THERMAL, Severity.WARNING if now_bits else Severity.INFO, data


def pcie_replay(old: GpuSample | None, new: GpuSample, cfg: NvmlConfig, index: int) -> Finding | None:
    """At least ``pcie_replay_burst`` PCIe replays since the previous sample."""
    if new.pcie_replay is None or old is None or old.pcie_replay is None:
        return None
    delta = new.pcie_replay - old.pcie_replay
    if delta < cfg.pcie_replay_burst:
        return None
    data = {
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
        {"nvlink_errors": deltas, "nvlink_totals": new.nvlink, "gpu": index},
    )
