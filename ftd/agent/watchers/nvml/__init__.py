"""GPU health through NVML, as a package of small modules (docs/architecture.md §5 "NVML").

* :mod:`.backend`: the seam, the synchronous questions the watcher asks (:class:`NvmlBackend`), their
  answer types and errors.
* :mod:`.real`: :class:`RealNvml`, the seam through pynvml; the only module that imports it.
* :mod:`.fake`: ``FakeNvml``, a scriptable backend for tests, benches and the simulator.
* :mod:`.worker`: blocking calls on per-GPU threads, each awaited under a deadline.
* :mod:`.probe`: one GPU's probe (:func:`sample_gpu`): every question, in order.
* :mod:`.signals`: what changed between two samples, one small function per signal.
* :mod:`.watcher`: :class:`NvmlWatcher`, which polls, diffs and emits events.

The names below are re-exported so ``from ftd.agent.watchers.nvml import NvmlWatcher`` keeps
working; code in ftd imports them from their modules. ``FakeNvml`` is not re-exported: import it
from :mod:`ftd.agent.watchers.nvml.fake`.
"""

from __future__ import annotations

from ftd.agent.watchers.nvml.backend import (
    THROTTLE_ALERT_REASONS,
    GpuIdentity,
    NvmlBackend,
    NvmlError,
    NvmlGpuLost,
    NvmlNotSupported,
    NvmlUnavailable,
    RemapInfo,
    XidRecord,
    throttle_names,
)
from ftd.agent.watchers.nvml.probe import GpuSample, sample_gpu
from ftd.agent.watchers.nvml.real import RealNvml
from ftd.agent.watchers.nvml.watcher import NvmlWatcher

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
    "throttle_names",
]
