"""Slow ranks (issue #33): a sustained change of a rank's step time against its job's own history,
and what it is attributed to.

Pure code (no I/O, no clock: every time is an argument). The coordinator feeds it the ranks' timing
counters from job presence (:class:`ftd.events.StepTiming`) and turns its findings into ``rank_slow``
events.

What is measured, and why not the plain step time: in synchronous data-parallel training every rank's
step lasts as long as the slowest rank's (they all wait in the gradient all-reduce), so the step
durations of one job are equal. What differs is the time a rank spends *before* its first collective
of the step (its own compute, data loading, a sleep): the slow rank arrives last and waits least.
The client measures that time when the training code marks its collectives (the torch helper's DDP
communication hook does: :mod:`ftd.client.torch`). So there are two series:

* per rank, with compute times: ``x = log(compute_i / median of the other ranks' compute)`` -- the
  rank's share of the job's work. Immune to a job-wide slowdown (everyone's compute rises), and to
  a rank slower from the very start (a pipeline stage: its baseline is its own history);
* per job: ``x = log(step time)`` (the median over its ranks), or, where every rank reports compute,
  ``log(least compute of any rank)``: a job-wide slowdown raises it, one slow rank does not.

Each series goes through :class:`ChangeDetector`: a warm-up of ``warmup`` samples sets the baseline
(median) and its noise (MAD, floored), then a one-sided CUSUM of the excess over the baseline of the
median of the last three samples (a lone outlier -- a save, a garbage collection, a loaded machine's
hiccup -- does not count at all), each contribution clipped so that a few can never alarm alone. It
alarms when the sum passes ``h`` and stays alarmed until the sum drains back to zero; the change
point (``since``) is the last sample at which the sum was zero.

:func:`attribute` turns the alarms into findings: ranks of at most half the job's nodes alarmed ->
each such node (``scope = "node"`` when every rank it runs is slow, ``"gpu"`` when only some are,
naming the local ranks and, where NVML says a GPU of the node throttles, that GPU and its reasons:
the one whose index is a slow rank's local rank when there is one, else every throttled GPU there);
ranks of more than half the nodes, or only the job's own series -> ``scope = "job"``: not a node,
no node is to blame.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ftd.events import RankInfo, StepTiming

__all__ = [
    "ChangeDetector",
    "DetectorSettings",
    "Finding",
    "JobSteps",
    "RankAlarm",
    "Scope",
    "Throttled",
    "attribute",
    "peer_ratio",
]

Scope = Literal["node", "gpu", "job"]
_MAX_DRIFT = math.log(2) / 2 - 0.05
Throttled = Mapping[str, Mapping["int | None", Sequence[str]]]
"""Per node, per GPU index (None: not known), the throttle reasons NVML reports on now."""


@dataclass(frozen=True)
class DetectorSettings:
    """How a series is judged. ``min_change``: the smallest sustained relative change worth finding
    (0.25: 25 % slower); ``noise_floor``: the least noise assumed (log units: 0.05 is 5 %), so a
    series that was perfectly steady in its warm-up does not alarm on the first wobble; ``h``: the
    alarm threshold of the CUSUM, in log units (at least ``h_sigmas`` times the warm-up noise)."""

    warmup: int = 30
    min_change: float = 0.25
    noise_floor: float = 0.05
    h: float = 1.5
    h_sigmas: float = 10.0
    drift_sigmas: float = 2.0

    def __post_init__(self) -> None:
        if self.warmup < 3:
            raise ValueError("warmup must be at least 3 samples")
        if not 0 < self.min_change <= 10:
            raise ValueError("min_change must be in (0, 10]")
        if self.noise_floor <= 0 or self.h <= 0 or self.h_sigmas <= 0 or self.drift_sigmas < 0:
            raise ValueError("noise_floor, h and h_sigmas must be > 0, drift_sigmas >= 0")


class ChangeDetector:
    """One series' sustained upward change against its own warm-up (see the module docstring).

    Feed it with :meth:`add` (a finite value and its time); :attr:`alarmed` says whether a change is
    on, :attr:`since` when it started and :meth:`ratio` how large it is (exp of the mean excess since
    the change point: 2.0 is twice as slow). Memory is constant after the warm-up."""

    def __init__(self, settings: DetectorSettings | None = None) -> None:
        self.settings = settings or DetectorSettings()
        self._warm: list[float] = []
        self.baseline: float | None = None
        self.scale = 0.0
        self._k = 0.0
        self._h = 0.0
        self.stat = 0.0
        self.alarmed = False
        self.since: float | None = None  # time of the last sample at which the sum was zero
        self._zero_ts: float | None = None
        self._excess = 0.0  # sum of (x - baseline) since the change point
        self._count = 0
        self._recent: list[float] = []  # the last three samples (their median is what counts)

    @property
    def warm(self) -> bool:
        return self.baseline is not None

    def add(self, x: float, ts: float) -> bool:
        """Take one sample; True when this sample starts an alarm (an episode's first sample)."""
        if not math.isfinite(x):
            return False
        if self.baseline is None:
            self._warm.append(x)
            if len(self._warm) >= self.settings.warmup:
                self._settle()
            self._zero_ts = ts
            return False
        recent = self._recent
        recent.append(x)
        if len(recent) > 3:
            del recent[0]
        excess = statistics.median(recent) - self.baseline  # a lone outlier never counts at all
        step = max(-self._h, min(excess - self._k, self._h / 3))  # one outlier can never alarm alone
        self.stat = max(0.0, self.stat + step)
        if self.stat == 0.0:
            self._zero_ts, self._excess, self._count = ts, 0.0, 0
            if self.alarmed:
                self.alarmed = False
            return False
        self._excess += excess
        self._count += 1
        if self.alarmed:
            self.stat = min(self.stat, self._h)  # a long episode drains in bounded time once over
            return False
        if self.stat >= self._h:
            self.alarmed = True
            self.since = self._zero_ts
            return True
        return False

    def ratio(self) -> float:
        """How many times the series' level is over its baseline since the change point (1.0: none)."""
        if not self._count:
            return 1.0
        return math.exp(max(0.0, self._excess / self._count))

    def _settle(self) -> None:
        warm = self._warm
        median = statistics.median(warm)
        mad = statistics.median(abs(v - median) for v in warm) * 1.4826
        s = self.settings
        self.baseline = median
        self.scale = max(mad, s.noise_floor)
        # The drift grows with the noise, but never past half of a 2x change: that one is always found.
        self._k = max(math.log1p(s.min_change) / 2, min(s.drift_sigmas * self.scale, _MAX_DRIFT))
        self._h = max(s.h, s.h_sigmas * self.scale)
        self._warm = []


def peer_ratio(mine: float, peers: Sequence[float]) -> float | None:
    """``log(mine / median(peers))``: a rank's share of the step against the others' (None when it
    cannot be said: no peers, or a time that is not positive)."""
    good = [p for p in peers if p > 0 and math.isfinite(p)]
    if not good or not (mine > 0 and math.isfinite(mine)):
        return None
    return math.log(mine / statistics.median(good))


@dataclass(frozen=True)
class RankAlarm:
    """A rank whose series is alarmed: where it runs, how much slower, since when."""

    rank: int
    node: str
    ratio: float
    since: float | None
    local_rank: int | None = None


@dataclass(frozen=True)
class Finding:
    """What a slowdown is attributed to. ``node`` is None for ``scope = "job"`` (not a node)."""

    scope: Scope
    node: str | None
    ranks: list[int]
    ratio: float
    since: float | None
    detail: dict[str, object] = field(default_factory=dict)


def attribute(
    alarms: Sequence[RankAlarm],
    ranks_by_node: Mapping[str, Sequence[int]],
    *,
    job_ratio: float | None = None,
    job_since: float | None = None,
    throttled: Throttled | None = None,
) -> list[Finding]:
    """Findings from the alarmed ranks of one job (``ranks_by_node``: every rank of the job by node)
    and the job's own alarm (``job_ratio`` set when it is on). ``throttled``: per node, per GPU index
    (None: not known), the throttle reasons NVML reports on now (named in a finding's detail).
    Sorted by node; ``[]``: nothing."""
    nodes = {n for n, ranks in ranks_by_node.items() if ranks}
    by_node: dict[str, list[RankAlarm]] = {}
    for alarm in alarms:
        by_node.setdefault(alarm.node, []).append(alarm)
    if by_node and (2 * len(by_node) <= len(nodes) or len(nodes) <= 1):
        findings = []
        for node in sorted(by_node):
            slow = sorted(by_node[node], key=lambda a: a.rank)
            everyone = set(ranks_by_node.get(node, ())) <= {a.rank for a in slow}
            starts = [a.since for a in slow if a.since is not None]
            detail: dict[str, object] = {
                "local_ranks": [a.local_rank for a in slow if a.local_rank is not None],
            }
            gpus = (throttled or {}).get(node, {})
            mine = {a.local_rank for a in slow} & set(gpus)
            named = sorted(mine if mine else gpus, key=lambda i: -1 if i is None else i)
            if named:
                detail["throttled_gpus"] = [{"gpu": i, "reasons": list(gpus[i])} for i in named]
            findings.append(
                Finding(
                    scope="node" if everyone else "gpu",
                    node=node,
                    ranks=[a.rank for a in slow],
                    ratio=max(a.ratio for a in slow),
                    since=min(starts) if starts else None,
                    detail=detail,
                )
            )
        return findings
    if by_node or job_ratio is not None:
        everyone_slow = sorted(a.rank for a in alarms)
        ratio = job_ratio if job_ratio is not None else max(a.ratio for a in alarms)
        return [
            Finding(
                scope="job",
                node=None,
                ranks=everyone_slow,
                ratio=ratio,
                since=job_since,
                detail={"nodes_slow": sorted(by_node)},
            )
        ]
    return []


@dataclass
class _Rank:
    node: str
    pid: int | None
    local_rank: int | None
    detector: ChangeDetector
    last: StepTiming | None = None
    step: float | None = None  # seconds per step over its latest interval
    compute: float | None = None  # of which its own work (None: not measured)
    seen: float = 0.0  # when its latest interval ended


class JobSteps:
    """One job's step timing history and its detectors (bounded: ``max_ranks`` ranks).

    :meth:`observe` takes one node's view of the job (its ranks with their cumulative
    :class:`~ftd.events.StepTiming`) and feeds the detectors with the intervals since the last view;
    :meth:`findings` says what is slow now (:func:`attribute`). A peer's compute older than
    ``stale_s`` is not compared against (its node went quiet); a rank whose counters went back or
    whose pid changed is a new process: its history starts again."""

    def __init__(
        self, settings: DetectorSettings | None = None, *, max_ranks: int = 4096, stale_s: float = 60.0
    ) -> None:
        self.settings = settings or DetectorSettings()
        self.max_ranks = max_ranks
        self.stale_s = stale_s
        self.ranks: dict[int, _Rank] = {}
        self.job = ChangeDetector(self.settings)
        self.updated = 0.0

    def observe(self, node: str, ranks: Sequence[RankInfo], ts: float) -> int:
        """Take ``node``'s ranks of the job at time ``ts``; return how many new intervals it fed."""
        here = {info.rank for info in ranks}
        for rank in [r for r, kept in self.ranks.items() if kept.node == node and r not in here]:
            del self.ranks[rank]  # left this node (stopped, moved)
        fresh: list[int] = []
        for info in ranks:
            kept = self.ranks.get(info.rank)
            if kept is None or kept.node != node or kept.pid != info.pid:
                if kept is None and len(self.ranks) >= self.max_ranks:
                    continue
                fresh_detector = ChangeDetector(self.settings)
                kept = self.ranks[info.rank] = _Rank(
                    node=node, pid=info.pid, local_rank=info.local_rank, detector=fresh_detector
                )
            timing = info.timing
            if timing is None:
                continue
            last, kept.last = kept.last, timing
            if last is None:
                continue
            steps = timing.steps - last.steps
            spent = timing.step_s - last.step_s
            if steps < 0 or spent < 0:  # counters went back: a new client in the same process
                kept.detector = ChangeDetector(self.settings)
                continue
            if steps == 0 or spent <= 0:
                continue
            kept.step = spent / steps
            kept.compute = None
            if timing.compute_s is not None and last.compute_s is not None:
                work = timing.compute_s - last.compute_s
                kept.compute = work / steps if work > 0 else None
            kept.seen = ts
            fresh.append(info.rank)
        for rank in fresh:
            kept = self.ranks[rank]
            if kept.compute is None:
                continue
            peers = [
                other.compute
                for r, other in self.ranks.items()
                if r != rank and other.compute is not None and ts - other.seen <= self.stale_s
            ]
            x = peer_ratio(kept.compute, peers)
            if x is not None:
                kept.detector.add(x, ts)
        if fresh:
            self.updated = ts
            level = self._job_level(ts)
            if level is not None:
                self.job.add(math.log(level), ts)
        return len(fresh)

    def _job_level(self, ts: float) -> float | None:
        """The job's own level: the least compute of any rank when every recent rank has one (a
        job-wide slowdown raises it, one slow rank does not), else the median step time."""
        recent = [r for r in self.ranks.values() if r.step is not None and ts - r.seen <= self.stale_s]
        if not recent:
            return None
        computes = [r.compute for r in recent if r.compute is not None]
        if len(computes) == len(recent) and len(recent) >= 2:
            return min(computes)
        steps = [r.step for r in recent if r.step is not None]
        return statistics.median(steps) if steps else None

    def findings(self, throttled: Throttled | None = None) -> list[Finding]:
        """What is slow in this job now (see :func:`attribute`)."""
        alarms = [
            RankAlarm(
                rank=rank,
                node=kept.node,
                ratio=kept.detector.ratio(),
                since=kept.detector.since,
                local_rank=kept.local_rank,
            )
            for rank, kept in sorted(self.ranks.items())
            if kept.detector.alarmed
        ]
        by_node: dict[str, list[int]] = {}
        for rank, kept in self.ranks.items():
            by_node.setdefault(kept.node, []).append(rank)
        job = self.job
        return attribute(
            alarms,
            by_node,
            job_ratio=job.ratio() if job.alarmed else None,
            job_since=job.since if job.alarmed else None,
            throttled=throttled,
        )

    def warm(self) -> bool:
        """Whether the job's own series and every rank's with compute times have their baseline."""
        ranks = [r.detector for r in self.ranks.values() if r.compute is not None]
        return self.job.warm and all(d.warm for d in ranks)

    def measured(self) -> bool:
        """Whether every rank reports its compute (the torch helper): ranks can be told apart."""
        return bool(self.ranks) and all(r.compute is not None for r in self.ranks.values())
