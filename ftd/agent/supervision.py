"""Watcher supervision: a watcher that crashes or stalls is reported and restarted, never fatal.

What: :class:`WatcherSupervisor` runs each watcher's ``run()`` in its own task. A ``run()`` that
raises is reported (through the ``report`` callback: the agent's ``agent_health`` event,
``problem = "watcher_restart"``) and restarted with exponential backoff (0.5 s doubling to 30 s;
reset after a minute of good running). A watcher exposing ``last_progress`` (monotonic time of its
last loop pass) that has not progressed for ``stall_s`` is cancelled by :meth:`check_stalls` and
restarted the same way; it is judged only once it completed a pass in the current run, so an idle,
disabled watcher is never "stalled" (a probe that hangs on its very first pass is the watcher's own
business). A ``run()`` that returns is done. :class:`Named` gives a watcher without a ``name`` one.

Why apart: the restart policy is independent of what the agent does with events and directives;
the agent only starts one :meth:`supervise` task per watcher and calls :meth:`check_stalls` from its
health loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from ftd.agent.watchers.base import Watcher
from ftd.events import Event, Kind, Severity, make_event
from ftd.logs import get_logger

log = get_logger(__name__)

__all__ = ["Named", "WatcherSupervisor", "health_reporter"]

_BACKOFF_MIN_S = 0.5
_BACKOFF_MAX_S = 30.0
_GOOD_RUN_S = 60.0  # a watcher that ran this long before failing starts its backoff afresh

Report = Callable[..., Awaitable[None]]
"""``report(severity, **data)``: the agent's ``health_event``."""


def health_reporter(node: str, emit: Callable[[Event], Awaitable[None]]) -> Report:
    """``report(severity, **data)``: the agent's own trouble as an ``agent_health`` event, through
    ``emit`` like any other (a stalled watcher, a spool outage, events dropped)."""

    async def report(severity: Severity, **data: Any) -> None:
        await emit(make_event(node, Kind.AGENT_HEALTH, severity=severity, source="agent", data=data))

    return report


class Named:
    """Gives a watcher without a ``name`` attribute (the kmsg watcher) one."""

    def __init__(self, name: str, inner: Any) -> None:
        self.name = name
        self.inner = inner

    async def run(self) -> None:
        await self.inner.run()

    @property
    def last_progress(self) -> float | None:
        value = getattr(self.inner, "last_progress", None)
        return value if isinstance(value, float) else None


class WatcherSupervisor:
    """Runs, restarts and stall-checks watchers; ``restarts`` counts restarts by watcher name."""

    def __init__(self, stall_s: float, report: Report) -> None:
        self.stall_s = stall_s
        self._report = report
        self.restarts: dict[str, int] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._started: dict[str, float] = {}
        self._stall_cancelled: set[str] = set()

    async def supervise(self, watcher: Watcher) -> None:
        """Run ``watcher`` until its ``run()`` returns, restarting it after a crash or a stall."""
        name = watcher.name
        failures = 0
        me = asyncio.current_task()
        while True:
            started = time.monotonic()
            self._started[name] = started
            inner = asyncio.create_task(watcher.run(), name=f"watcher:{name}")
            self._tasks[name] = inner
            try:
                await inner
                log.info("watcher_finished", watcher=name)
                return
            except asyncio.CancelledError:
                if (me is not None and me.cancelling()) or name not in self._stall_cancelled:
                    inner.cancel()
                    raise
                self._stall_cancelled.discard(name)
                reason = f"stalled: no progress for {self.stall_s:g} s"
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"[:500]
            if time.monotonic() - started > _GOOD_RUN_S:
                failures = 0
            failures += 1
            backoff = min(_BACKOFF_MAX_S, _BACKOFF_MIN_S * 2 ** (failures - 1))
            self.restarts[name] = self.restarts.get(name, 0) + 1
            log.error("watcher_failed_restarting", watcher=name, reason=reason, backoff_s=backoff)
            await self._report(
                Severity.ERROR,
                problem="watcher_restart",
                watcher=name,
                reason=reason,
                restarts=self.restarts[name],
                backoff_s=backoff,
            )
            await asyncio.sleep(backoff)

    def running(self, name: str) -> bool:
        """Whether the watcher ``name`` has a task running now (not crashed, not backing off)."""
        task = self._tasks.get(name)
        return task is not None and not task.done()

    def check_stalls(self, watchers: Iterable[Watcher], now: float) -> None:
        """Cancel (for :meth:`supervise` to restart) every watcher with no progress for ``stall_s``."""
        for watcher in watchers:
            progress = getattr(watcher, "last_progress", None)
            task = self._tasks.get(watcher.name)
            if not isinstance(progress, float) or task is None or task.done():
                continue
            started = self._started.get(watcher.name, 0.0)
            if progress < started:
                continue  # no pass completed in this run yet (or an idle, disabled watcher): not judged
            since = progress
            if now - since > self.stall_s and watcher.name not in self._stall_cancelled:
                log.error("watcher_stalled", watcher=watcher.name, idle_s=round(now - since, 1))
                self._stall_cancelled.add(watcher.name)
                task.cancel()
