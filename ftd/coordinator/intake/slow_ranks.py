"""Slow ranks (issue #33): the coordinator keeps each job's step timing history from its job presence
and turns a sustained slowdown into one ``rank_slow`` event per episode, with the figures the
``slow_rank`` rule's cost model weighs.

Where the figures come from: every rank's client sends cumulative step timing counters with its
heartbeats, its agent puts the latest in the job's presence (at most once a second per job and node,
with the step), and :meth:`SlowRanks.observe` hands each presence to the job's
:class:`~ftd.culprit.steps.JobSteps` (pure detection and attribution). Where a node's GPU reports an
alerting throttle reason (the NVML watcher's latest ``thermal`` event of that GPU says it is active,
within the last ten minutes), a finding names it: the GPU whose index is the slow rank's local rank
where there is one (``throttled_gpus``: index and reasons). Where the job's nodes' GPUs report their SM
clock (the watcher's ``thermal`` events with ``signal`` ``sm_clocks``, sent when a clock moves), the
event says each one's latest clock against its maximum, the slow rank's GPU beside the others'
(``gpu_clocks``: node -> GPU index -> ``sm_mhz``, ``max_mhz``, ``age_s``); a GPU that said nothing in
the last ten minutes is left out (not known), and without any the key is absent.

What the event carries (data): ``job``, ``scope`` (``node``: every rank of the node is slow; ``gpu``:
some of them, its GPU or NIC; ``job``: the whole job is slower, not a node -- its ``node`` is then the
job's first node, and ``not_node`` is true), ``ranks``, ``slowdown`` (2.0: twice as slow), ``since``
(when the change started), ``measured`` (whether every rank reported its compute, i.e. the torch
helper: without it only the job's own slowdown can be seen), and the cost model's inputs: ``gpus`` (the
job's ranks), ``remaining_s`` (the job's time left before its scheduler time limit, from
:class:`~ftd.coordinator.intake.time_left.JobTimeLeft`; :attr:`SlowRanksConfig.remaining_s` when the
scheduler has not said -- ``remaining_from`` says which: ``scheduler`` or ``config``),
``expected_loss_s`` = (1 - 1/slowdown) x remaining (the job's time lost if nothing is done),
``swap_cost_s`` (:attr:`SlowRanksConfig.swap_cost_s`), both also x GPUs (``*_gpu_s``), ``repeats`` (this
node's slow episodes within ``repeat_window_s``, this one included) and ``exclude_after``.

Bounded memory: at most ``max_jobs`` jobs (the least recently updated forgotten), ranks per job
bounded by :class:`~ftd.culprit.steps.JobSteps`, a job forgotten when its last presence clears, the
repeat history per node bounded by the window and a count.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence

from ftd.config.schema import SlowRanksConfig
from ftd.culprit.steps import DetectorSettings, Finding, JobSteps
from ftd.events import Event, JobPresence, Kind, Severity
from ftd.logs import get_logger
from ftd.plugin.view import FaultRecord

__all__ = ["SlowRanks"]

log = get_logger(__name__)

_REPEATS_KEPT = 64  # episodes remembered per node (the window bounds them too)
_THROTTLE_FRESH_S = 600.0  # a throttle event older than this says nothing about the GPU now

NodeEvents = Callable[[str], Sequence[FaultRecord]]


class SlowRanks:
    """Every job's step history; :meth:`observe` returns the ``rank_slow`` events a presence brings."""

    def __init__(
        self,
        cfg: SlowRanksConfig,
        *,
        node_events: NodeEvents | None = None,
        remaining_for: Callable[[str], float | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self._remaining_for = remaining_for  # job -> seconds before its time limit (None: not known)
        self.settings = DetectorSettings(warmup=cfg.warmup_samples, min_change=cfg.min_change)
        self._node_events = node_events
        self._clock = clock
        self.jobs: OrderedDict[str, JobSteps] = OrderedDict()
        self._active: dict[str, set[tuple[str, str | None]]] = {}  # job -> (scope, node) on now
        self._nodes: dict[str, dict[str, bool]] = {}  # job -> node -> has ranks
        self.repeats: dict[str, deque[float]] = {}  # node -> its slow episodes' times
        self._warm: set[str] = set()  # jobs whose baselines are set (logged once: slow_ranks_warm)

    def observe(self, node: str, job: str, presence: JobPresence | None) -> list[Event]:
        """Take one node's presence of ``job`` (None or no ranks: the job left the node)."""
        if not self.cfg.enabled:
            return []
        now = self._clock()
        ranks = presence.ranks if presence is not None else []
        steps = self.jobs.get(job)
        if not ranks:
            nodes = self._nodes.get(job)
            if nodes is not None:
                nodes.pop(node, None)
            if steps is not None:
                steps.observe(node, [], now)
                if not steps.ranks:
                    self._forget(job)
            return []
        if not any(r.timing is not None for r in ranks) and steps is None:
            return []  # an older client, or no step yet: nothing to keep
        if steps is None:
            steps = self.jobs[job] = JobSteps(self.settings)
            while len(self.jobs) > self.cfg.max_jobs:
                self._forget(next(iter(self.jobs)))
        self.jobs.move_to_end(job)
        self._nodes.setdefault(job, {})[node] = True
        if not steps.observe(node, ranks, now):
            return []
        if job not in self._warm and steps.warm():
            self._warm.add(job)
            log.info("slow_ranks_warm", job=job, ranks=len(steps.ranks), measured=steps.measured())
        return self._report(job, steps, now)

    def _forget(self, job: str) -> None:
        self.jobs.pop(job, None)
        self._warm.discard(job)
        self._active.pop(job, None)
        self._nodes.pop(job, None)

    def _report(self, job: str, steps: JobSteps, now: float) -> list[Event]:
        findings = steps.findings(self._throttled(sorted({r.node for r in steps.ranks.values()})))
        active = self._active.setdefault(job, set())
        keys = {(f.scope if f.scope != "gpu" else "node", f.node) for f in findings}
        events = []
        for finding in findings:
            key = (finding.scope if finding.scope != "gpu" else "node", finding.node)
            if key in active:
                continue  # one event per episode
            events.append(self._event(job, steps, finding, now))
        for scope, node in sorted(active - keys, key=str):
            log.info("rank_slow_over", job=job, scope=scope, node=node)
        active.clear()
        active.update(keys)  # an episode that ended re-arms
        return events

    def _throttled(self, nodes: list[str]) -> dict[str, dict[int | None, list[str]]]:
        """Per node, per GPU index, the throttle reasons its latest ``thermal`` event says are on."""
        if self._node_events is None:
            return {}
        out: dict[str, dict[int | None, list[str]]] = {}
        now = self._clock()
        for node in nodes:
            seen: set[int | None] = set()
            for record in reversed(self._node_events(node)):
                if now - record.ts > _THROTTLE_FRESH_S:
                    break  # oldest first: nothing older is fresh either
                if record.kind != Kind.THERMAL or record.data.get("signal") == "sm_clocks":
                    continue  # a clock reading says nothing about the throttle reasons
                gpu = record.data.get("index", record.data.get("gpu"))
                index = gpu if isinstance(gpu, int) and not isinstance(gpu, bool) else None
                if index in seen:
                    continue  # an older event of a GPU whose latest one was read
                seen.add(index)
                reasons = record.data.get("throttle_reasons")
                if record.data.get("active") and isinstance(reasons, list):
                    out.setdefault(node, {})[index] = [str(r)[:64] for r in reasons][:16]
                if len(seen) >= 64:
                    break
        return out

    def _clocks(self, nodes: list[str]) -> dict[str, dict[str, dict[str, float]]]:
        """Per node, per GPU index, its latest fresh SM clock reading (module docstring)."""
        if self._node_events is None:
            return {}
        out: dict[str, dict[str, dict[str, float]]] = {}
        now = self._clock()
        for node in nodes[:64]:
            for record in reversed(self._node_events(node)):
                if now - record.ts > _THROTTLE_FRESH_S:
                    break
                data = record.data
                if record.kind != Kind.THERMAL or data.get("signal") != "sm_clocks":
                    continue
                index, sm, top = data.get("index"), data.get("sm_mhz"), data.get("max_mhz")
                if not all(isinstance(v, int) and not isinstance(v, bool) for v in (index, sm, top)):
                    continue  # not a reading this code understands: unknown, not a guess
                gpus = out.setdefault(node, {})
                if str(index) in gpus or len(gpus) >= 64:
                    continue  # an older reading of a GPU whose latest one was read
                gpus[str(index)] = {"sm_mhz": sm, "max_mhz": top, "age_s": round(now - record.ts, 3)}
        return out

    def _repeats(self, node: str, now: float) -> int:
        times = self.repeats.setdefault(node, deque(maxlen=_REPEATS_KEPT))
        times.append(now)
        while times and now - times[0] > self.cfg.repeat_window_s:
            times.popleft()
        return len(times)

    def _event(self, job: str, steps: JobSteps, finding: Finding, now: float) -> Event:
        cfg = self.cfg
        gpus = len(steps.ranks)
        slowdown = round(max(finding.ratio, 1.0), 3)
        known = self._remaining_for(job) if self._remaining_for is not None else None
        remaining = known if known is not None else cfg.remaining_s
        loss = (1 - 1 / slowdown) * remaining
        node = finding.node
        data: dict[str, object] = {
            "job": job,
            "scope": finding.scope,
            "ranks": finding.ranks[:64],
            "slowdown": slowdown,
            "since": finding.since,
            "measured": steps.measured(),
            "gpus": gpus,
            "remaining_s": round(remaining, 3),
            "remaining_from": "scheduler" if known is not None else "config",
            "expected_loss_s": round(loss, 3),
            "expected_loss_gpu_s": round(loss * gpus, 3),
            "swap_cost_s": cfg.swap_cost_s,
            "swap_cost_gpu_s": round(cfg.swap_cost_s * gpus, 3),
            "exclude_after": cfg.exclude_after,
            **{k: v for k, v in finding.detail.items() if v not in ([], None)},
        }
        clocks = self._clocks(sorted(self._nodes.get(job) or {r.node for r in steps.ranks.values()}))
        if clocks:
            data["gpu_clocks"] = clocks
        if node is None:
            node = sorted(self._nodes.get(job) or {r.node for r in steps.ranks.values()})[0]
            data["not_node"] = True
        else:
            data["repeats"] = self._repeats(node, now)
        return Event(
            id=f"{node}-slow-{job}-{finding.scope}-{int(now * 1000)}",
            ts=now,
            node=node,
            kind=Kind.RANK_SLOW,
            severity=Severity.WARNING,
            source="coordinator",
            data=data,
        )
