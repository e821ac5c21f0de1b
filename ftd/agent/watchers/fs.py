"""Filesystem fill: bytes and inodes per configured mount, thresholds with hysteresis, time-to-full.

Every ``interval_s`` each mount is sampled with ``statvfs`` (injectable for tests). Fill is measured
the way ``df`` does (``used / (used + available-to-users)``, so root-reserved blocks count as full)
and then divided by the mount's ``capacity_factor``: a distributed filesystem that fails at 80% raw
fill has ``capacity_factor = 0.8`` and counts as 100% full there. The worse of bytes and inodes
decides the level (``ok`` / ``warning`` / ``critical``); a level is entered at its threshold and
left only below ``threshold - hysteresis_pct``, so a mount hovering at the line does not flap.

Time to full, for bytes and for inodes alike: the samples of the last ``forecast_window_s`` give a
fill rate (:func:`fill_rate`) once there are at least ``forecast_min_samples`` of them spanning at
least ``forecast_min_span_s`` (three samples 60 s apart are not a trend). The fit is robust to a
burst: the steepest and the flattest step between two samples are replaced by the median step
rate before the least-squares line, so one ``dd`` or one checkpoint write among steady samples does
not become a forecast (it is a *threshold* crossing when it fills the disk). With the effective
capacity the rate gives seconds to full; the nearer of the bytes and the inodes forecasts is the
one reported. Below ``forecast_horizon_s`` that is reported once per episode, as a ``warning``
(a forecast asks for a save; ``critical`` is only ever an actual crossing of ``critical_pct``),
re-armed when the forecast goes back above 1.5x the horizon or the fill rate turns flat.

Events: ``fs_fill`` with ``data.reason``:

* ``job_arrived``: a job registered on this node while a mount is still critical (the level does
  not change, so nothing else would be said): the critical event again, with ``job``;
* ``threshold``: a level change (``warning`` / ``critical`` entered, ``info`` when it clears back to
  ``ok``); ``resource`` is ``bytes`` or ``inodes``, whichever is fuller; ``previous`` level.
* ``forecast``: full within the horizon; ``resource`` is the one that fills first, ``horizon_s``.
* ``stalled``: ``statvfs`` did not return within the deadline (``stalled=true``).

Every ``threshold`` and ``forecast`` event carries ``path``, ``level``, ``used_pct``,
``inodes_used_pct`` (both of the effective capacity), ``bytes_free``, ``inodes_free``,
``fill_rate_bytes_per_s``, ``inode_fill_rate_per_s``, ``time_to_full_s`` (the nearer of
``bytes_time_to_full_s`` and ``inodes_time_to_full_s``; ``None`` when neither fills) and
``capacity_factor``.

``statvfs`` runs in a daemon thread: a hung network mount must not block the agent. While a mount's
call is still outstanding that mount is skipped (one stuck thread per mount at most) and, once,
reported as ``fs_fill`` with ``stalled=true``.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ftd.agent.watchers.base import Emit
from ftd.config import FsConfig, FsMount
from ftd.events import Kind, Severity, make_event
from ftd.logs import get_logger

__all__ = ["FsWatcher", "StatvfsResult", "fill_rate", "linear_slope"]

log = get_logger(__name__)

_LEVELS = ("ok", "warning", "critical")


class StatvfsResult(Protocol):
    @property
    def f_frsize(self) -> int: ...
    @property
    def f_blocks(self) -> int: ...
    @property
    def f_bfree(self) -> int: ...
    @property
    def f_bavail(self) -> int: ...
    @property
    def f_files(self) -> int: ...
    @property
    def f_ffree(self) -> int: ...
    @property
    def f_favail(self) -> int: ...


def linear_slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``(x, y)`` points; ``None`` with fewer than 2 distinct x."""
    n = len(points)
    if n < 2:
        return None
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    if sxx <= 0:
        return None
    return sum((p[0] - mx) * (p[1] - my) for p in points) / sxx


def fill_rate(points: list[tuple[float, float]]) -> float | None:
    """Growth per second of ``(time, used)`` samples (in time order), robust to one burst.

    The step between two neighbouring samples has a rate; with three steps or more the steepest
    one (and, with four or more, the flattest one too) is replaced by the median step rate over its
    own duration, then a least-squares line goes through the rebuilt series. A steady fill keeps its
    exact rate (every step is the median); a single burst (or a single large delete) among steady
    samples is not extrapolated. ``None`` without two samples at distinct times.
    """
    pts: list[tuple[float, float]] = []
    for point in points:
        if not pts or point[0] > pts[-1][0]:  # a sample not later than the last kept one is dropped
            pts.append(point)
    if len(pts) < 2:
        return None
    steps = [(b[0] - a[0], b[1] - a[1]) for a, b in itertools.pairwise(pts)]
    if len(steps) >= 3:
        rates = [dy / dt for dt, dy in steps]
        median = statistics.median(rates)
        trim = {max(range(len(rates)), key=rates.__getitem__)}
        if len(steps) >= 4:
            trim.add(min(range(len(rates)), key=rates.__getitem__))
        steps = [(dt, median * dt) if i in trim else (dt, dy) for i, (dt, dy) in enumerate(steps)]
    rebuilt = [(0.0, 0.0)]
    for dt, dy in steps:
        last_t, last_y = rebuilt[-1]
        rebuilt.append((last_t + dt, last_y + dy))
    return linear_slope(rebuilt)


def _time_to_full(free: float, rate: float | None) -> float | None:
    if rate is None or rate <= 0:
        return None
    return max(0.0, free / rate)


def _rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


class _MountState:
    def __init__(self) -> None:
        self.level = "ok"
        # (time, used bytes, used inodes)
        self.samples: collections.deque[tuple[float, float, float]] = collections.deque(maxlen=4096)
        self.forecast_armed = True
        self.stalled_reported = False
        self.last: dict[str, Any] = {}  # the last sample's figures (for a job that arrives later)
        self.thread: threading.Thread | None = None
        self.result: StatvfsResult | BaseException | None = None


class FsWatcher:
    """Watch the mounts in :class:`FsConfig`; see the module docstring."""

    name = "fs"

    def __init__(
        self,
        cfg: FsConfig,
        node: str,
        emit: Emit,
        *,
        statvfs: Callable[[str], StatvfsResult] = os.statvfs,
        clock: Callable[[], float] = time.monotonic,
        call_timeout_s: float = 5.0,
    ) -> None:
        self.cfg = cfg
        self.node = node
        self._emit = emit
        self._statvfs = statvfs
        self._clock = clock
        self.call_timeout_s = call_timeout_s
        self.state: dict[str, _MountState] = {m.path: _MountState() for m in cfg.mounts}
        self.last_progress = time.monotonic()

    async def run(self) -> None:
        if not self.cfg.mounts:
            log.info("fs_watcher_idle", reason="no mounts configured (agent.fs.mounts)")
            await asyncio.Event().wait()
        while True:
            await self.poll_once()
            self.last_progress = time.monotonic()
            await asyncio.sleep(self.cfg.interval_s)

    async def poll_once(self) -> None:
        await asyncio.gather(*(self._poll_mount(m) for m in self.cfg.mounts))

    async def _stat(self, mount: FsMount, st: _MountState) -> StatvfsResult | BaseException | None:
        if st.thread is not None and st.thread.is_alive():
            return None  # previous call still stuck
        done = threading.Event()
        st.result = None

        def target() -> None:
            try:
                st.result = self._statvfs(mount.path)
            except BaseException as exc:
                st.result = exc
            done.set()

        st.thread = threading.Thread(target=target, name=f"ftd-statvfs-{mount.path}", daemon=True)
        st.thread.start()
        deadline = time.monotonic() + self.call_timeout_s
        pause = 0.001
        while not done.is_set():  # statvfs is microseconds when healthy: poll briefly, then back off
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)
        return st.result

    async def _poll_mount(self, mount: FsMount) -> None:
        st = self.state[mount.path]
        result = await self._stat(mount, st)
        if result is None:
            if not st.stalled_reported:
                st.stalled_reported = True
                await self._send(
                    mount,
                    Severity.ERROR,
                    {"reason": "stalled", "stalled": True, "deadline_s": self.call_timeout_s},
                )
            return
        st.stalled_reported = False
        if isinstance(result, BaseException):
            log.warning("fs_statvfs_failed", path=mount.path, error=str(result))
            return
        now = self._clock()
        frsize = result.f_frsize or 1
        used_blocks = result.f_blocks - result.f_bfree
        usable = used_blocks + result.f_bavail  # what df calls size for non-root users
        used_bytes = used_blocks * frsize
        capacity = usable * frsize * mount.capacity_factor
        used_pct = 100.0 * used_bytes / capacity if capacity > 0 else 0.0
        inodes_used = result.f_files - result.f_ffree
        inode_cap = (inodes_used + result.f_favail) * mount.capacity_factor
        inodes_pct = 100.0 * inodes_used / inode_cap if result.f_files > 0 and inode_cap > 0 else 0.0
        worst = max(used_pct, inodes_pct)
        inodes_free = max(0, int(inode_cap - inodes_used)) if result.f_files > 0 else None

        cfg = self.cfg
        st.samples.append((now, float(used_bytes), float(inodes_used)))
        while st.samples and st.samples[0][0] < now - cfg.forecast_window_s:
            st.samples.popleft()
        rate: float | None = None
        inode_rate: float | None = None
        if (
            len(st.samples) >= cfg.forecast_min_samples
            and st.samples[-1][0] - st.samples[0][0] >= cfg.forecast_min_span_s
        ):
            rate = fill_rate([(t, b) for t, b, _ in st.samples])
            if result.f_files > 0:
                inode_rate = fill_rate([(t, i) for t, _, i in st.samples])
        ttf_bytes = _time_to_full(capacity - used_bytes, rate)
        ttf_inodes = _time_to_full(inode_cap - inodes_used, inode_rate) if result.f_files > 0 else None
        known = [t for t in (ttf_bytes, ttf_inodes) if t is not None]
        ttf = min(known) if known else None
        nearer = "inodes" if ttf_inodes is not None and ttf_inodes == ttf else "bytes"
        data: dict[str, Any] = {
            "used_pct": round(used_pct, 2),
            "inodes_used_pct": round(inodes_pct, 2),
            "bytes_free": max(0, int(capacity - used_bytes)),
            "inodes_free": inodes_free,
            "capacity_factor": mount.capacity_factor,
            "fill_rate_bytes_per_s": _rounded(rate),
            "inode_fill_rate_per_s": _rounded(inode_rate, 3),
            "time_to_full_s": _rounded(ttf),
            "bytes_time_to_full_s": _rounded(ttf_bytes),
            "inodes_time_to_full_s": _rounded(ttf_inodes),
        }

        st.last = {"resource": "inodes" if inodes_pct > used_pct else "bytes", **data}
        level = self._next_level(st.level, worst, mount)
        if level != st.level:
            previous, st.level = st.level, level
            severity = {"ok": Severity.INFO, "warning": Severity.WARNING, "critical": Severity.CRITICAL}[
                level
            ]
            await self._send(
                mount,
                severity,
                {
                    "reason": "threshold",
                    "level": level,
                    "previous": previous,
                    "resource": "inodes" if inodes_pct > used_pct else "bytes",
                    **data,
                },
            )
        if ttf is not None and ttf < cfg.forecast_horizon_s:
            if st.forecast_armed:
                st.forecast_armed = False
                await self._send(
                    mount,
                    Severity.WARNING,  # a forecast asks for a save; critical is an actual crossing
                    {
                        "reason": "forecast",
                        "level": st.level,
                        "resource": nearer,
                        "horizon_s": cfg.forecast_horizon_s,
                        "samples": len(st.samples),
                        "span_s": round(st.samples[-1][0] - st.samples[0][0], 1),
                        **data,
                    },
                )
        elif ttf is None or ttf > 1.5 * cfg.forecast_horizon_s:
            st.forecast_armed = True

    async def job_arrived(self, job: str) -> int:
        """A job started on this node: each mount still at the critical level is reported again as
        a critical ``fs_fill`` naming the job (``reason`` "job_arrived"), so a job requeued onto a
        still-full filesystem is moved off it at once instead of failing there unprotected (a level
        is reported only when it changes). Returns how many mounts were reported."""
        reported = 0
        for mount in self.cfg.mounts:
            st = self.state[mount.path]
            if st.level != "critical" or not st.last:
                continue
            data = {**st.last, "reason": "job_arrived", "level": "critical", "job": job}
            await self._send(mount, Severity.CRITICAL, data)
            reported += 1
        return reported

    def _next_level(self, current: str, pct: float, mount: FsMount) -> str:
        hyst = self.cfg.hysteresis_pct
        if pct >= mount.critical_pct:
            return "critical"
        if current == "critical" and pct >= mount.critical_pct - hyst:
            return "critical"
        if pct >= mount.warn_pct:
            return "warning"
        if current in ("warning", "critical") and pct >= mount.warn_pct - hyst:
            return "warning"
        return "ok"

    async def _send(self, mount: FsMount, severity: Severity, data: dict[str, Any]) -> None:
        payload = {"path": mount.path, **data}
        await self._emit(make_event(self.node, Kind.FS_FILL, severity=severity, source="fs", data=payload))
