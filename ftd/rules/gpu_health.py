"""GPU health from NVML: a GPU gone, NVLink down, retired pages, PCIe replays, NVLink errors, stalls.

===============================================  ===========================================================
event                                            actions
===============================================  ===========================================================
``gpu_missing`` (a GPU left NVML's inventory,    checkpoint_restart of the node's jobs excluding the node,
or fewer GPUs than ``expected_gpus``)            then drain_node: a GPU off the bus needs a reboot or service
``gpu_health`` ``signal`` "nvlink_down"          checkpoint_restart excluding the node (the job cannot run on
(``links_down``: the links that went inactive)   a broken NVLink mesh), then drain_node
``gpu_health`` ``signal`` "retired_pages"        checkpoint_restart excluding the node, then gpu_reset of the
(or ``retired_pages_pending``)                   GPU after the save: retirement lands at the reset
``gpu_health`` ``signal`` "pcie_replay" /        notify (a link getting worse; a human looks)
"nvlink_errors" (or their counters), or a
stalled NVML probe (``stalled`` true)
``gpu_health`` otherwise, a stall that ended     nothing (recorded)
===============================================  ===========================================================

``signal`` is the agent's name for the finding; events from older agents are recognised by their
keys (``nvlink_errors``, ``pcie_replay_burst``, ``retired_pages_pending``).
"""

from __future__ import annotations

from typing import Any

from ftd.plugin import ActionRequest, ClusterView, Event, Kind, hookimpl
from ftd.plugin.helpers import already_judged, drain, gpu_name, gpu_params, gpu_reset, notify, restart_jobs

_NOTIFY_WORDS = {
    "pcie_replay": "pcie replays",
    "nvlink_errors": "nvlink errors",
    "stalled": "nvml probe stalled",
}


def signal_of(event: Event) -> str:
    data = event.data
    signal = data.get("signal")
    if isinstance(signal, str) and signal:
        return signal
    if data.get("retired_pages_pending") is True:
        return "retired_pages"
    if "links_down" in data:
        return "nvlink_down"
    if "pcie_replay_burst" in data:
        return "pcie_replay"
    if "nvlink_errors" in data:
        return "nvlink_errors"
    if data.get("stalled") is True:
        return "stalled"  # a stall that ended says stalled=false: nothing to do
    return ""


#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset({Kind.GPU_MISSING, Kind.GPU_HEALTH})


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind not in (Kind.GPU_MISSING, Kind.GPU_HEALTH) or already_judged(event):
        return None
    jobs = view.jobs_on_node(event.node)
    gpu = gpu_params(event)
    params: dict[str, Any] = dict(gpu)
    if event.kind == Kind.GPU_MISSING:
        missing = event.data.get("missing_uuids")
        if isinstance(missing, list) and missing:
            what = f"gpu(s) {', '.join(map(str, missing))} missing"
        elif event.data.get("expected") is not None:
            what = f"{event.data.get('found')} of {event.data.get('expected')} gpus present"
        else:
            what = f"{gpu_name(event)} missing ({event.data.get('reason') or 'not enumerated'})"
        reason = f"{what}: drain for service"
        return [*restart_jobs(jobs, event, reason, exclude=True, params=params), drain(event, reason, params)]
    signal = signal_of(event)
    if signal == "nvlink_down":
        links = event.data.get("links_down")
        which = f" links {', '.join(map(str, links))}" if isinstance(links, list) and links else ""
        reason = f"nvlink down on {gpu_name(event)}{which}: drain"
        params.update(signal=signal, links_down=links if isinstance(links, list) else [])
        return [*restart_jobs(jobs, event, reason, exclude=True, params=params), drain(event, reason, params)]
    if signal == "retired_pages":
        reason = f"retired pages pending on {gpu_name(event)}: reset after the save"
        restarts = restart_jobs(jobs, event, reason, exclude=True, params=params)
        return [*restarts, gpu_reset(event, reason, params)]
    if signal in _NOTIFY_WORDS:
        words = _NOTIFY_WORDS
        return [notify(event, f"{words[signal]} on {gpu_name(event)}", {**params, "signal": signal})]
    return None
