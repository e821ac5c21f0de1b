"""GPU thermal throttling that comes and goes: save the jobs' work when it lasts on and off.

Install: copy this file into a directory named in ``coordinator.rule_dirs`` (for example
``/etc/ftd/rules/python/thermal_throttle.py`` with ``rule_dirs = ["/etc/ftd/rules/python"]``),
replay recorded events through it (``ftd rules test --events events.jsonl --config
/etc/ftd/coordinator.toml``), then restart the coordinator. The plugin's name is the file's stem,
``thermal_throttle``: list it in ``coordinator.policy.dry_run_rules`` to run it in shadow mode first,
or in ``coordinator.disabled_rules`` to turn it off. It imports :mod:`ftd.plugin` and the standard
library only.

What it adds to the built-in ``thermal`` rule, and what it leaves to it: the built-in rule already
notifies when a GPU starts throttling or crosses ``agent.nvml.temperature_c``, and saves the node's
jobs (plus a notify) when the agent reports a throttle that stayed set without a gap for
``agent.nvml.thermal_sustained_s`` (``data.sustained = true``). This rule never notifies about an
onset (that paged twice for every hot GPU, issue #32) and never repeats the built-in's save: it
covers the case the agent's own measure misses, a GPU hovering at its slowdown temperature, in and
out of throttling every few minutes, which never stays set long enough to be "sustained" for the
agent but costs the job as much.

What the agent reports (its NVML watcher, ``source = "nvml"``, data ``uuid``, ``index``, ``pci``):
a ``thermal`` event when a throttle reason worth an alert is newly set (severity warning,
``active = true``, ``throttle_reasons`` = every reason now set, ``new_reasons``), and an ``info``
one with ``active = false`` when they have all cleared. Changes only: while a GPU stays throttled,
nothing more is sent. A ``thermal`` event without ``throttle_reasons`` is the temperature crossing
``agent.nvml.temperature_c``: not throttling, so it opens nothing here.

=============================================  ====================================================
situation                                      action
=============================================  ====================================================
a GPU starts throttling for heat (a reason in  nothing here: an episode opens (the built-in
:data:`THERMAL_REASONS`)                       ``thermal`` rule notifies)
the same GPU's episode has lasted              checkpoint (save, keep running) of every job on the
:data:`SUSTAINED_S`, as seen at any later      node, or a notify when none runs there; once per
event from that node                           episode
the agent said the episode is sustained        nothing more here, for this episode: the built-in
(``data.sustained``)                           rule saved the jobs and notified
=============================================  ====================================================

An episode starts with the first throttling event of a GPU and ends once the GPU has been free of
thermal throttling for :data:`REARM_S`: a GPU hovering at its slowdown temperature, in and out of
throttling every minute, is one sustained episode, not many short ones.

Why "as seen at a later event": a rule is a pure function of the events it is given (no clock, no
timers: the hook contract in :mod:`ftd.plugin.hookspecs`), and the agent sends nothing while a
throttle merely persists. So the rule judges the duration whenever the node speaks again: the GPU
flapping in and out of throttling, another GPU heating up, the slowed rank reported as a straggler,
a log pattern.

Why checkpoint and not restart or drain: throttling is most often the room or the airflow (a failed
fan, a hot aisle), not the GPU; the job only runs slower. Saving now makes a later failure cheap.

State: one small record per throttling GPU, kept here by node (the contract allows state that
depends only on the events seen); a record is dropped when its episode ends, so memory is bounded by
the GPUs that throttled recently. A coordinator restart starts with none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ftd.plugin import ActionKind, ActionRequest, ClusterView, Event, Kind, hookimpl

#: NVML throttle reasons (as the agent names them) that mean "too hot". ``hw_slowdown`` is set for
#: heat or a power brake; a power brake alone (``hw_power_brake_slowdown``) is not heat.
THERMAL_REASONS = frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown"})
#: Throttled this long (seconds, by the events' own timestamps) is "sustained".
SUSTAINED_S = 600.0
#: Free of thermal throttling this long ends an episode; a throttle back sooner continues it.
REARM_S = 300.0


@dataclass
class _Episode:
    started: float
    reasons: list[str]
    gpu: dict[str, Any]  # uuid / index / pci of the GPU, for reasons and params
    throttled: bool = True
    cleared_at: float = 0.0
    escalated: bool = False

    def over(self, now: float) -> bool:
        return not self.throttled and now - self.cleared_at >= REARM_S


@dataclass
class ThermalThrottle:
    """The rule's memory: open episodes by node, then by GPU."""

    episodes: dict[str, dict[str, _Episode]] = field(default_factory=dict)

    def evaluate(self, event: Event, view: ClusterView) -> list[ActionRequest]:
        out: list[ActionRequest] = []
        if event.kind == Kind.THERMAL and isinstance(event.data.get("throttle_reasons"), list):
            out += self._throttle_changed(event)
        out += self._escalate_sustained(event, view)
        return out

    def _throttle_changed(self, event: Event) -> list[ActionRequest]:
        data = event.data
        gpu_key = _gpu_key(data)
        if gpu_key is None:
            return []
        hot = (
            [r for r in data["throttle_reasons"] if r in THERMAL_REASONS]
            if data.get("active") is True
            else []
        )
        node_episodes = self.episodes.setdefault(event.node, {})
        episode = node_episodes.get(gpu_key)
        if episode is not None and episode.over(event.ts):
            del node_episodes[gpu_key]
            episode = None
        if not hot:
            if episode is not None and episode.throttled:
                episode.throttled, episode.cleared_at = False, event.ts
            if not node_episodes:
                del self.episodes[event.node]
            return []
        if episode is None:  # a new episode: the built-in thermal rule tells a human, not this one
            gpu = {k: data[k] for k in ("uuid", "index", "pci") if data.get(k) is not None}
            episode = node_episodes[gpu_key] = _Episode(started=event.ts, reasons=hot, gpu=gpu)
        else:  # back within REARM_S, or a reason added: the same episode
            episode.throttled, episode.reasons = True, hot
        if data.get("sustained") is True:
            episode.escalated = True  # the agent measured it: the built-in rule saved and notified
        return []

    def _escalate_sustained(self, event: Event, view: ClusterView) -> list[ActionRequest]:
        node_episodes = self.episodes.get(event.node)
        if not node_episodes:
            return []
        out: list[ActionRequest] = []
        for gpu_key, episode in list(node_episodes.items()):
            if episode.over(event.ts):
                del node_episodes[gpu_key]
                continue
            lasted = event.ts - episode.started
            if episode.escalated or not episode.throttled or lasted < SUSTAINED_S:
                continue
            episode.escalated = True
            what = (
                f"sustained thermal throttling: {_name(episode.gpu)} of {event.node} throttled for "
                f"{lasted:.0f}s ({', '.join(episode.reasons)})"
            )
            params = {**episode.gpu, "node": event.node, "throttled_s": round(lasted, 1)}
            jobs = view.jobs_on_node(event.node)
            out += [
                ActionRequest(
                    kind=ActionKind.CHECKPOINT, target=job, reason=f"{what}: save {job} now", params=params
                )
                for job in jobs
            ]
            if not jobs:
                out.append(_notify(event.node, f"{what}: no job to save", params))
        if not node_episodes:
            del self.episodes[event.node]
        return out


def _gpu_key(data: dict[str, Any]) -> str | None:
    for key in ("uuid", "pci", "index"):
        value = data.get(key)
        if value is not None and value != "":
            return f"{key}:{value}"
    return None


def _name(gpu: dict[str, Any]) -> str:
    index, uuid = gpu.get("index"), gpu.get("uuid") or gpu.get("pci")
    if index is not None and uuid:
        return f"GPU {index} ({uuid})"
    return f"GPU {index if index is not None else uuid or '?'}"


def _notify(node: str, reason: str, params: dict[str, Any]) -> ActionRequest:
    return ActionRequest(kind=ActionKind.NOTIFY, target=node, reason=reason, params=params)


_rule = ThermalThrottle()


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    return _rule.evaluate(event, view) or None
