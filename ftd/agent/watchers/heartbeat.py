"""Trainer heartbeats: a silent rank and a rank far behind its peers are events.

Every ``check_interval_s`` (0.25 s) the watcher asks the local API (:class:`ftd.agent.local_api.LocalApi`)

* which ranks have been silent too long (``silent_ranks``): ``timeout_s`` since their last heartbeat,
  or, before their first, ``startup_timeout_s`` (or the rank's own, from its ``register``) since
  registration: silence counts from a rank's first heartbeat, so a rank still importing torch is
  not a hung one, and a hang after start-up is caught within ``timeout_s`` as before. Each newly
  silent rank yields one ``rank_heartbeat_lost`` event (data: job, rank, pid, step = the last step
  it reported, silent_s, timeout_s = the timeout that applied, never_beat, phase = ``startup`` or
  ``training``), so the event goes out at most one check interval after the deadline. It is not
  repeated while the silence lasts; a heartbeat (or the rank leaving) ends the episode and re-arms it;
* for every job with at least two ranks on this node that report a step, which ranks are
  ``straggler_steps`` or more behind the fastest one *and* at least ``straggler_fraction`` of its
  step behind. Each yields one ``rank_straggler`` event (data: job, rank, pid, step, max_step,
  median_step, behind) per episode; the episode ends when the rank is back within half the step
  threshold (hysteresis, so a rank hovering at the threshold does not flap).

Ranks are identified by (job, rank, pid): a restarted rank with a new pid is a new rank.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Protocol

from ftd.agent.watchers.base import Emit
from ftd.config import HeartbeatConfig
from ftd.events import Kind, RankInfo, Severity, make_event

__all__ = ["HeartbeatWatcher"]

_RankKey = tuple[str, int, int | None]


class RankSource(Protocol):
    """What the watcher needs of the local API."""

    def jobs(self) -> dict[str, list[RankInfo]]: ...

    def silent_ranks(
        self, timeout_s: float, startup_timeout_s: float | None = None
    ) -> list[tuple[str, RankInfo, float]]: ...


_IDLE_CHECK_S = 1.0


class HeartbeatWatcher:
    name = "heartbeat"

    def __init__(self, cfg: HeartbeatConfig, node: str, emit: Emit, *, local_api: RankSource) -> None:
        self.cfg = cfg
        self.node = node
        self._emit = emit
        self._api = local_api
        self._silent: set[_RankKey] = set()
        self._straggling: set[_RankKey] = set()
        self.last_progress = time.monotonic()

    async def run(self) -> None:
        while True:
            self.last_progress = time.monotonic()
            await self.check()
            # No ranks, nothing to miss: an idle node checks once a second, not four times.
            idle = not any(self._api.jobs().values())
            await asyncio.sleep(
                max(self.cfg.check_interval_s, _IDLE_CHECK_S) if idle else self.cfg.check_interval_s
            )

    async def check(self) -> None:
        """One pass: report newly silent ranks and new stragglers."""
        await self._check_silence()
        if self.cfg.straggler_steps > 0:
            await self._check_stragglers()

    async def _check_silence(self) -> None:
        silent_now: set[_RankKey] = set()
        now = time.time()
        for job, info, limit in self._api.silent_ranks(self.cfg.timeout_s, self.cfg.startup_timeout_s):
            key = (job, info.rank, info.pid)
            silent_now.add(key)
            if key in self._silent:
                continue
            silent_s = now - info.last_beat if info.last_beat is not None else limit
            await self._emit(
                make_event(
                    self.node,
                    Kind.RANK_HEARTBEAT_LOST,
                    severity=Severity.ERROR,
                    source="heartbeat",
                    data={
                        "job": job,
                        "rank": info.rank,
                        "pid": info.pid,
                        "step": info.step,
                        "silent_s": round(silent_s, 3),
                        "timeout_s": limit,
                        "never_beat": info.last_beat is None,
                        "phase": "startup" if info.last_beat is None else "training",
                    },
                )
            )
        self._silent = silent_now  # ranks that beat again (or left) are re-armed

    async def _check_stragglers(self) -> None:
        straggling_now: set[_RankKey] = set()
        for job, ranks in self._api.jobs().items():
            stepped = [r for r in ranks if r.step is not None]
            if len(stepped) < 2:
                continue
            steps = [r.step for r in stepped if r.step is not None]
            top = max(steps)
            median = statistics.median(steps)
            for info in stepped:
                assert info.step is not None
                behind = top - info.step
                key = (job, info.rank, info.pid)
                threshold = (
                    self.cfg.straggler_steps if key not in self._straggling else self.cfg.straggler_steps / 2
                )
                if behind < threshold or behind < self.cfg.straggler_fraction * top:
                    continue
                straggling_now.add(key)
                if key in self._straggling:
                    continue
                await self._emit(
                    make_event(
                        self.node,
                        Kind.RANK_STRAGGLER,
                        severity=Severity.WARNING,
                        source="heartbeat",
                        data={
                            "job": job,
                            "rank": info.rank,
                            "pid": info.pid,
                            "step": info.step,
                            "max_step": top,
                            "median_step": median,
                            "behind": behind,
                        },
                    )
                )
        self._straggling = straggling_now
