"""ECC and row-remap policy (events from the agent's NVML watcher).

==============================================  =========================================================
event                                           actions
==============================================  =========================================================
``row_remap`` with ``data.failure`` true        checkpoint_restart excluding the node + drain_node: the
                                                GPU ran out of spare rows and must be replaced
``ecc`` with ``data.sram_uncorrectable`` (or   same (aggregate uncorrectable SRAM errors over the GPU's
``data.counters.aggregate_dbe_sram``) > 4, or  life: NVIDIA's replacement threshold; the NVML watcher
the driver's threshold flag                    raises it at start and on crossing, ``signal =
(``data.counters.sram_threshold_exceeded``)    "sram_threshold"``)
``row_remap`` with ``data.pending`` true        gpu_reset at the next checkpoint: checkpoint_restart of
(and no failure)                                the jobs on the node, excluding it, then gpu_reset of the
                                                GPU (``pci``/``uuid``) — the remap lands at reset
``ecc`` with ``data.signal`` "correctable_rate"  notify: correctable errors per hour over the agent's
(``rate_per_hour`` > ``threshold_per_hour``)      threshold, a GPU whose memory is wearing (no action)
anything else                                   nothing (recorded)
==============================================  =========================================================

Data contract (tolerant): the NVML watcher's ``row_remap`` carries ``reasons`` (what newly
happened: "failure", "pending", ...) next to the remapper's state (``failure``/``pending``): with
``reasons`` only a new failure / pending acts (a GPU that already failed is not drained again on a
later correctable remap); without, ``pending``/``failure`` are booleans or counts (> 0 means yes); the
``ecc`` event may carry ``remap_pending``/``remap_failure`` too; GPU identity in ``uuid``/``pci``.
The drain comes after the restart of the node's jobs (save first), reason "replace the GPU" (RMA).
"""

from __future__ import annotations

from typing import Any

from ftd.catalog.gpu_limits import SRAM_UNCORRECTABLE_LIMIT
from ftd.plugin import ActionRequest, ClusterView, Event, Kind, hookimpl
from ftd.plugin.helpers import (
    already_judged,
    drain,
    gpu_params,
    gpu_reset,
    jobs_of,
    notify,
    number,
    restart_jobs,
)


def _yes(value: Any) -> bool:
    n = number(value)
    return value is True or (n is not None and n > 0)


#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset({Kind.ROW_REMAP, Kind.ECC})


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind not in (Kind.ROW_REMAP, Kind.ECC) or already_judged(event):
        return None
    data = event.data
    gpu = gpu_params(event)
    name = f"gpu {gpu.get('uuid') or gpu.get('pci') or '?'}"
    if event.kind == Kind.ECC and data.get("signal") == "correctable_rate":
        rate, limit = number(data.get("rate_per_hour")), number(data.get("threshold_per_hour"))
        if rate is None or (limit is not None and rate <= limit):
            return None
        over = f" (threshold {limit:g}/h)" if limit is not None else ""
        reason = f"correctable ECC errors at {rate:g}/h on {name}{over}: memory wearing, plan a replacement"
        return [notify(event, reason, {**gpu, "rate_per_hour": rate, "threshold_per_hour": limit})]
    reasons = data.get("reasons")
    if isinstance(reasons, list):
        failure, pending = "failure" in reasons, "pending" in reasons
    else:
        failure = _yes(data.get("failure")) or _yes(data.get("remap_failure"))
        pending = _yes(data.get("pending")) or _yes(data.get("remap_pending"))
    counters = data.get("counters")
    sram = number(data.get("sram_uncorrectable"))
    if sram is None and isinstance(counters, dict):
        sram = number(counters.get("aggregate_dbe_sram"))  # the NVML watcher's counter name
    flagged = isinstance(counters, dict) and _yes(counters.get("sram_threshold_exceeded"))
    jobs = jobs_of(event, view)
    if failure or flagged or (sram is not None and sram > SRAM_UNCORRECTABLE_LIMIT):
        limit = SRAM_UNCORRECTABLE_LIMIT
        why = (
            "row remap failure (no spare rows left)"
            if failure
            else f"{sram:.0f} uncorrectable SRAM errors (> {limit})"
            if sram is not None and sram > limit
            else "SRAM error threshold exceeded (the driver's flag)"
        )
        reason = f"{why} on {name}: replace the GPU (RMA)"
        params = {**gpu, "replace_gpu": True}
        return [*restart_jobs(jobs, event, reason, exclude=True, params=params), drain(event, reason, params)]
    if pending:
        reason = f"row remap pending on {name}: reset at the next checkpoint"
        return [*restart_jobs(jobs, event, reason, exclude=True, params=gpu), gpu_reset(event, reason, gpu)]
    return None
