"""ECC and row-remap policy (events from the agent's NVML watcher).

==============================================  =========================================================
event                                           actions
==============================================  =========================================================
``row_remap`` with ``data.failure`` true        checkpoint_restart excluding the node + drain_node: the
                                                GPU ran out of spare rows and must be replaced
``ecc`` with ``data.sram_uncorrectable`` (or   same (aggregate uncorrectable SRAM errors over the GPU's
``data.counters.aggregate_dbe_sram``) > 4      life: NVIDIA's replacement threshold)
``row_remap`` with ``data.pending`` true        gpu_reset at the next checkpoint: checkpoint_restart of
(and no failure)                                the jobs on the node, excluding it, then gpu_reset of the
                                                GPU (``pci``/``uuid``) — the remap lands at reset
anything else                                   nothing (recorded)
==============================================  =========================================================

Data contract (tolerant): ``pending``/``failure`` are booleans or counts (> 0 means yes); the
``ecc`` event may carry ``remap_pending``/``remap_failure`` too; GPU identity in ``uuid``/``pci``.
"""

from __future__ import annotations

from typing import Any

from ftd.plugin import ActionKind, ActionRequest, ClusterView, Event, Kind, hookimpl
from ftd.plugin.helpers import already_judged, drain, gpu_params, jobs_of, number, restart_jobs

SRAM_UNCORRECTABLE_LIMIT = 4


def _yes(value: Any) -> bool:
    n = number(value)
    return value is True or (n is not None and n > 0)


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind not in (Kind.ROW_REMAP, Kind.ECC) or already_judged(event):
        return None
    data = event.data
    gpu = gpu_params(event)
    name = f"gpu {gpu.get('uuid') or gpu.get('pci') or '?'}"
    failure = _yes(data.get("failure")) or _yes(data.get("remap_failure"))
    pending = _yes(data.get("pending")) or _yes(data.get("remap_pending"))
    counters = data.get("counters")
    sram = number(data.get("sram_uncorrectable"))
    if sram is None and isinstance(counters, dict):
        sram = number(counters.get("aggregate_dbe_sram"))  # the NVML watcher's counter name
    jobs = jobs_of(event, view)
    if failure or (sram is not None and sram > SRAM_UNCORRECTABLE_LIMIT):
        limit = SRAM_UNCORRECTABLE_LIMIT
        why = "row remap failure" if failure else f"{sram:.0f} uncorrectable SRAM errors (> {limit})"
        reason = f"{why} on {name}: replace the GPU"
        params = {**gpu, "replace_gpu": True}
        return [*restart_jobs(jobs, event, reason, exclude=True, params=params), drain(event, reason, params)]
    if pending:
        reason = f"row remap pending on {name}: reset at the next checkpoint"
        reset = ActionRequest(kind=ActionKind.GPU_RESET, target=event.node, reason=reason, params=gpu)
        return [*restart_jobs(jobs, event, reason, exclude=True, params=gpu), reset]
    return None
