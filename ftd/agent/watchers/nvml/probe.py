"""One GPU's probe: every question the watcher asks per poll, in order, in one blocking call.

:func:`sample_gpu` runs on the GPU's worker thread (:mod:`ftd.agent.watchers.nvml.worker`) and
fills a :class:`GpuSample`. A question answered NotSupported is remembered in ``unsupported`` and
not asked again (its field stays ``None``); another NVML error is kept in ``errors`` and the probe
goes on; "GPU is lost" ends the probe (:class:`NvmlGpuLost` propagates). The tracker records the
question being asked, so a probe that misses its deadline can be reported with the call it hangs in.
"""

from __future__ import annotations

import dataclasses

from ftd.agent.watchers.nvml.backend import (
    NvmlBackend,
    NvmlError,
    NvmlGpuLost,
    NvmlNotSupported,
    RemapInfo,
)
from ftd.agent.watchers.nvml.worker import Tracker

__all__ = ["GpuSample", "sample_gpu"]


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
    sm_clocks: tuple[int, int] | None = None  # (SM clock now, its maximum) in MHz
    pcie_replay: int | None = None
    nvlink: dict[str, int] | None = None
    nvlink_links: dict[int, bool] | None = None  # link id -> active
    t: float = 0.0  # when the watcher received the sample (its clock); set by the watcher
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
    ("sm_clocks", "sm_clocks_mhz", "sm_clocks"),
    ("pcie_replay", "pcie_replay_count", "pcie_replay_counter"),
    ("nvlink", "nvlink_errors", "nvlink_errors"),
    ("nvlink_links", "nvlink_states", "nvlink_states"),
)


def sample_gpu(
    backend: NvmlBackend,
    index: int,
    unsupported: set[str] | None = None,
    tracker: Tracker | None = None,
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
