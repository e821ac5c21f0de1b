"""Host memory pressure and per-trainer RSS growth (slow leaks): save before the OOM killer strikes.

Every ``interval_s``:

* **Host**: ``/proc/meminfo`` ``MemAvailable / MemTotal`` and, when the kernel has PSI,
  ``/proc/pressure/memory`` ``some avg10`` (percent of the last 10 s in which some task stalled on
  memory). Level ``warning`` below ``available_warn_pct`` or at ``psi_some_avg10_pct``,
  ``critical`` below ``available_critical_pct``. A level change is one ``mem_pressure`` event
  (``info`` when it clears); leaving a level needs 2 points of head-room (and PSI below 3/4 of its
  threshold), so a host at the line does not flap. Host events have ``leak=false``, ``job`` and
  ``rank`` ``None`` (the whole node is short, not one rank), ``jobs`` (every job with a registered
  rank here) and ``top_rank`` (the rank with the largest RSS: ``job``, ``rank``, ``pid``,
  ``rss_mb``; ``None`` when no rank is registered).
* **Trainers**: ``RssAnon`` from ``/proc/PID/status`` (the process's own memory; ``VmRSS`` also
  counts mapped file pages, such as a memory-mapped dataset being read, which are not a leak; a
  kernel without ``RssAnon``, before 4.5, falls back to ``VmRSS`` with a warning log, and the event's
  ``rss_field`` says which) for each pid ``pids()`` returns (the agent passes
  its local API's registered ranks: ``{pid: (job, rank)}``). A least-squares line through the
  samples of the last ``leak_window_s`` (at least ``leak_min_samples``) gives the growth rate
  (:func:`ftd.agent.watchers.fs.fill_rate`: one jump, such as loading a data shard, is not a
  trend). A rank growing faster than ``leak_min_growth_mb_per_min`` whose growth would exhaust the
  host's available memory within ``leak_horizon_s`` is reported as ``mem_pressure`` with
  ``leak=true``, ``pid``, ``job``, ``rank``, ``rss_mb``, ``rss_field``, ``growth_mb_per_min`` and
  ``time_to_exhaustion_s``: a ``warning`` (``critical`` when already within a quarter of the
  horizon), then, if the leak goes on into that last quarter, one ``critical`` with
  ``escalated=true`` (save first, stop if it continues). The episode re-arms when growth falls
  below half the threshold.

All /proc reads go through ``read_text`` (injectable; tests feed fake /proc text). A vanished pid is
forgotten; a missing PSI file just means no PSI.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ftd.agent.watchers.base import Emit
from ftd.agent.watchers.fs import fill_rate
from ftd.config import MemoryConfig
from ftd.events import Kind, Severity, make_event
from ftd.logs import get_logger

__all__ = ["MemoryWatcher", "parse_meminfo", "parse_psi_some_avg10", "parse_rss_kb"]

log = get_logger(__name__)

PidsFn = Callable[[], dict[int, tuple[str, int]]]
_ORDER = {"ok": 0, "warning": 1, "critical": 2}


def _read_text(path: str) -> str:
    return Path(path).read_text()


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` -> ``{"MemTotal": kB, ...}``."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep:
            continue
        parts = rest.split()
        if parts and parts[0].isdecimal():
            out[key.strip()] = int(parts[0])
    return out


def parse_psi_some_avg10(text: str) -> float | None:
    for line in text.splitlines():
        if line.startswith("some "):
            for field in line.split()[1:]:
                key, _, value = field.partition("=")
                if key == "avg10":
                    try:
                        return float(value)
                    except ValueError:
                        return None
    return None


def parse_rss_kb(text: str) -> tuple[int, str] | None:
    """A process's own resident memory from /proc/PID/status: (kB, the field it came from).

    ``RssAnon`` (anonymous pages: heap, tensors, Python objects) is what a leak grows. ``VmRSS``
    adds file pages the process has mapped, which a memory-mapped dataset fills as it is read (and
    the kernel reclaims under pressure): read as a leak, it restarts healthy jobs. Kernels before
    4.5 have no ``RssAnon``; then ``VmRSS``, and the field is named in the event (``rss_field``)."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("RssAnon", "VmRSS") and name not in fields:  # the first of each counts
            parts = rest.split()
            if parts and parts[0].isdecimal():
                fields[name] = int(parts[0])
    for name in ("RssAnon", "VmRSS"):
        if name in fields:
            return fields[name], name
    return None


class _Trainer:
    def __init__(self, job: str, rank: int) -> None:
        self.job, self.rank = job, rank
        self.samples: collections.deque[tuple[float, float]] = collections.deque(maxlen=4096)
        self.reported: Severity | None = None  # the leak severity sent in this episode
        self.rss_kb: int | None = None
        self.rss_field = "RssAnon"  # the status field rss_kb is read from (VmRSS: old kernels)


class MemoryWatcher:
    """See the module docstring."""

    name = "memory"

    def __init__(
        self,
        cfg: MemoryConfig,
        node: str,
        emit: Emit,
        *,
        pids: PidsFn | None = None,
        read_text: Callable[[str], str] = _read_text,
        clock: Callable[[], float] = time.monotonic,
        proc: str = "/proc",
    ) -> None:
        self.cfg = cfg
        self.node = node
        self._emit = emit
        self._pids = pids or dict
        self._read = read_text
        self._clock = clock
        self._proc = proc.rstrip("/")
        self.level = "ok"
        self.trainers: dict[int, _Trainer] = {}
        self.psi_available: bool | None = None
        self.last_progress = time.monotonic()

    async def run(self) -> None:
        if not self.cfg.enabled:
            log.info("memory_watcher_disabled")
            await asyncio.Event().wait()
        while True:
            await self.poll_once()
            self.last_progress = time.monotonic()
            await asyncio.sleep(self.cfg.interval_s)

    async def poll_once(self) -> None:
        now = self._clock()
        try:
            info = parse_meminfo(self._read(f"{self._proc}/meminfo"))
        except OSError as exc:
            log.warning("meminfo_unreadable", error=str(exc))
            return
        total = info.get("MemTotal", 0)
        available = info.get("MemAvailable", info.get("MemFree", 0))
        avail_pct = 100.0 * available / total if total else 100.0
        psi: float | None = None
        if self.psi_available is not False:
            try:
                psi = parse_psi_some_avg10(self._read(f"{self._proc}/pressure/memory"))
                self.psi_available = psi is not None
            except OSError:
                self.psi_available = False
        current = self._pids()
        await self._trainers(now, available, current)
        await self._host(avail_pct, psi, total, available, current)

    def _top_rank(self) -> dict[str, Any] | None:
        sized = [(t.rss_kb, pid, t) for pid, t in self.trainers.items() if t.rss_kb is not None]
        if not sized:
            return None
        rss_kb, pid, top = max(sized, key=lambda item: (item[0], -item[1]))
        return {"job": top.job, "rank": top.rank, "pid": pid, "rss_mb": round((rss_kb or 0) / 1024, 1)}

    async def _host(
        self,
        avail_pct: float,
        psi: float | None,
        total_kb: int,
        avail_kb: int,
        current: dict[int, tuple[str, int]],
    ) -> None:
        cfg = self.cfg
        level = "ok"
        if avail_pct < cfg.available_critical_pct:
            level = "critical"
        elif avail_pct < cfg.available_warn_pct or (psi is not None and psi >= cfg.psi_some_avg10_pct):
            level = "warning"
        if _ORDER[level] < _ORDER[self.level]:  # leaving a level needs head-room
            psi_calm = psi is None or psi < 0.75 * cfg.psi_some_avg10_pct
            if self.level == "critical" and avail_pct < cfg.available_critical_pct + 2:
                level = "critical"
            elif avail_pct < cfg.available_warn_pct + 2 or not psi_calm:
                level = max(level, "warning", key=_ORDER.__getitem__)
        if level == self.level:
            return
        previous, self.level = self.level, level
        severity = {"ok": Severity.INFO, "warning": Severity.WARNING, "critical": Severity.CRITICAL}[level]
        await self._send(
            severity,
            {
                "leak": False,
                "level": level,
                "previous": previous,
                "mem_available_pct": round(avail_pct, 2),
                "mem_available_mb": round(avail_kb / 1024, 1),
                "mem_total_mb": round(total_kb / 1024, 1),
                "psi_some_avg10": psi,
                "job": None,
                "rank": None,
                "jobs": sorted({job for job, _ in current.values()}),
                "top_rank": self._top_rank(),
            },
        )

    async def _trainers(self, now: float, avail_kb: int, current: dict[int, tuple[str, int]]) -> None:
        cfg = self.cfg
        for pid in list(self.trainers):
            if pid not in current:
                del self.trainers[pid]
        for pid, (job, rank) in current.items():
            trainer = self.trainers.get(pid)
            if trainer is None or (trainer.job, trainer.rank) != (job, rank):
                trainer = self.trainers[pid] = _Trainer(job, rank)
            try:
                rss = parse_rss_kb(self._read(f"{self._proc}/{pid}/status"))
            except OSError:
                del self.trainers[pid]  # exited between pids() and the read
                continue
            if rss is None:
                continue
            rss_kb, rss_field = rss
            if rss_field != trainer.rss_field:
                if rss_field != "RssAnon":
                    log.warning("trainer_rss_without_rssanon", pid=pid, field=rss_field)
                trainer.samples.clear()  # two fields' samples make no trend
                trainer.rss_field = rss_field
            trainer.rss_kb = rss_kb
            trainer.samples.append((now, rss_kb / 1024))
            while trainer.samples and trainer.samples[0][0] < now - cfg.leak_window_s:
                trainer.samples.popleft()
            if len(trainer.samples) < cfg.leak_min_samples:
                continue
            slope = fill_rate(list(trainer.samples))  # MB per second, robust to one jump
            if slope is None:
                continue
            growth = slope * 60
            if growth < cfg.leak_min_growth_mb_per_min / 2:
                trainer.reported = None
            if growth < cfg.leak_min_growth_mb_per_min or trainer.reported is Severity.CRITICAL:
                continue
            tte = (avail_kb / 1024) / slope
            if tte > cfg.leak_horizon_s:
                continue
            severity = Severity.CRITICAL if tte < cfg.leak_horizon_s / 4 else Severity.WARNING
            if severity is trainer.reported:
                continue  # this level was sent in this episode
            escalated = trainer.reported is not None
            trainer.reported = severity
            data: dict[str, Any] = {
                "leak": True,
                "pid": pid,
                "job": job,
                "rank": rank,
                "rss_mb": round(rss_kb / 1024, 1),
                "rss_field": rss_field,
                "growth_mb_per_min": round(growth, 2),
                "time_to_exhaustion_s": round(tte, 1),
                "mem_available_mb": round(avail_kb / 1024, 1),
                "samples": len(trainer.samples),
                "escalated": escalated,
            }
            await self._send(severity, data)

    async def _send(self, severity: Severity, data: dict[str, Any]) -> None:
        event = make_event(self.node, Kind.MEM_PRESSURE, severity=severity, source="memory", data=data)
        await self._emit(event)
