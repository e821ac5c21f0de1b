"""NVIDIA's field limits for a GPU's memory errors, as data shared by the agent, preflight and rules.

What: :data:`SRAM_UNCORRECTABLE_LIMIT`, the number of uncorrectable SRAM ECC errors over a GPU's life
past which NVIDIA's guidance is to replace it (more than 4), and :func:`sram_over_limit`, which reads
it off the NVML backend's ECC counters (``aggregate_dbe_sram``: NVML's aggregate uncorrectable count
at the SRAM location, or the parity plus SEC-DED sum of ``nvmlDeviceGetSramEccErrorStatus``;
``sram_threshold_exceeded``: that call's own ``bThresholdExceeded`` flag).

Why here: the NVML watcher raises the condition, preflight fails on it and the ``ecc_remap`` rule acts
on it; one number on the ground floor keeps the three from disagreeing.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["SRAM_UNCORRECTABLE_LIMIT", "sram_over_limit"]

#: Uncorrectable SRAM errors over a GPU's life above which it is replaced (NVIDIA: more than 4).
SRAM_UNCORRECTABLE_LIMIT = 4


def sram_over_limit(counters: Mapping[str, int] | None) -> bool:
    """Whether these ECC counters put the GPU past the SRAM replacement threshold."""
    if not counters:
        return False
    return counters.get("aggregate_dbe_sram", 0) > SRAM_UNCORRECTABLE_LIMIT or bool(
        counters.get("sram_threshold_exceeded", 0)
    )
