"""Thermal: a hot or throttling GPU is told to a human; sustained throttling saves the job's work.

=====================================================  ======================================================
``thermal`` event                                      actions
=====================================================  ======================================================
``data.sustained`` true and ``data.active`` true       checkpoint (save without stop, ``params.stop = false``)
(throttling for ``sustained_s``; severity error)       of the node's jobs + notify: a slow, hot GPU may be
                                                       on its way out, so keep the work safe
``data.active`` true (over ``temperature_c`` or a      notify (names the GPU, temperature, throttle reasons)
throttle reason newly set)
``data.active`` false (cleared)                        nothing
=====================================================  ======================================================

Never a drain, and never counted as a repeat offence: heat is the room's or the fan's, and a
throttled GPU still computes correctly.
"""

from __future__ import annotations

from typing import Any

from ftd.plugin import ActionRequest, ClusterView, Event, Kind, hookimpl
from ftd.plugin.helpers import already_judged, gpu_name, gpu_params, jobs_of, notify, number, save_jobs

#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset({Kind.THERMAL})


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind != Kind.THERMAL or already_judged(event) or event.data.get("active") is not True:
        return None
    data = event.data
    temp = number(data.get("temperature_c"))
    reasons = data.get("throttle_reasons")
    parts = [gpu_name(event)]
    if temp is not None:
        parts.append(f"at {temp:.0f}C")
    if isinstance(reasons, list) and reasons:
        parts.append(f"throttled ({', '.join(map(str, reasons))})")
    params: dict[str, Any] = {**gpu_params(event), "temperature_c": temp}
    if data.get("sustained") is True:
        held = number(data.get("sustained_s"))
        span = f" for {held:.0f}s" if held is not None else ""
        reason = f"sustained throttling{span}: {' '.join(parts)}: save now"
        return [*save_jobs(jobs_of(event, view), event, reason, params), notify(event, reason, params)]
    return [notify(event, f"thermal: {' '.join(parts)}", params)]
