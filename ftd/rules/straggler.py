"""Stragglers and slow ranks: a rank far behind its peers, or slower than its own history, slows the
whole job (every rank waits for it in the all-reduce).

====================  ==========================================================================
event                 actions
====================  ==========================================================================
``rank_straggler``    notify (target the node; params ``job``, ``rank``, ``lag_steps`` when the
                      event carries them) — no restart: a slow rank is not a failed one
``rank_slow``         (issue #33; the coordinator's, :mod:`ftd.coordinator.intake.slow_ranks`)
                      notify, always. Then the cost model, for a node (``scope`` ``node`` or
                      ``gpu``): when the job's expected loss, ``expected_loss_s`` = (1 - 1/slowdown)
                      x its remaining time, exceeds ``swap_cost_s`` (what swapping the node for a hot
                      spare costs, the recovery bench's figure), save and restart the job excluding
                      the node (``checkpoint_restart``: the save first, then a spare takes the slot);
                      once the node's slow episodes reach ``exclude_after`` (> 0), also drain it.
                      The whole job slower (``scope = "job"``, ``not_node``): notify only, never a
                      node's exclusion
====================  ==========================================================================
"""

from __future__ import annotations

from typing import Any

from ftd.plugin import ActionRequest, ClusterView, Event, Kind, hookimpl
from ftd.plugin.helpers import drain, notify, number, restart_jobs

#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset({Kind.RANK_STRAGGLER, Kind.RANK_SLOW})


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind == Kind.RANK_SLOW:
        return _slow(event)
    if event.kind != Kind.RANK_STRAGGLER:
        return None
    keys = ("job", "rank", "lag_steps", "step")
    params: dict[str, Any] = {k: event.data[k] for k in keys if k in event.data}
    who = f"rank {params['rank']} of job {params.get('job', '?')}" if "rank" in params else "a rank"
    lag = f", {params['lag_steps']} steps behind" if "lag_steps" in params else ""
    return [notify(event, f"straggler: {who} on {event.node}{lag}", params)]


def _slow(event: Event) -> list[ActionRequest]:
    data = event.data
    job = data.get("job")
    slowdown = number(data.get("slowdown")) or 1.0
    loss, cost = number(data.get("expected_loss_s")), number(data.get("swap_cost_s"))
    repeats, limit = number(data.get("repeats")) or 0, number(data.get("exclude_after")) or 0
    keys = ("job", "scope", "ranks", "slowdown", "since", "expected_loss_s", "swap_cost_s", "repeats")
    params: dict[str, Any] = {k: data[k] for k in keys if k in data}
    if data.get("not_node") or data.get("scope") == "job" or not isinstance(job, str) or not job:
        why = f"job {job or '?'} is {slowdown:.2f}x slower, every node alike: not a node"
        return [notify(event, f"slow job: {why}", params)]
    where = f"{data.get('scope', 'node')} on {event.node}"
    figures = (
        f"{slowdown:.2f}x slower; expected loss {loss or 0:.0f} s against a swap cost of {cost or 0:.0f} s"
    )
    out = [notify(event, f"slow rank(s) {data.get('ranks')} of job {job}: {where}, {figures}", params)]
    if loss is not None and cost is not None and loss > cost:
        out += restart_jobs(
            [job], event, f"slow rank: swap for a spare, {figures}", exclude=True, params=params
        )
    if limit > 0 and repeats >= limit:
        out.append(drain(event, f"slow {int(repeats)} times (exclude_after {int(limit)})", params))
    return out
