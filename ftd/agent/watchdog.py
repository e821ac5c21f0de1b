"""The agent's watchdog: a thread that notices the agent's own event loop or kernel-log reader stop.

Why a thread: a blocked event loop cannot notice that it is blocked. Everything the agent does (read
the kernel log, publish, reconnect, log, answer ``/metrics``) runs on that one loop, so a blocking
call or a lock taken twice on the loop thread stops all of it silently (issue #31: an agent stopped
after a broker kill, alive, with nothing in its log). This thread runs beside the loop:

* **Loop heartbeat.** Every ``check_s`` it schedules a beat on the loop
  (``call_soon_threadsafe``); the beat records the time and whether the agent's core tasks are alive.
  A beat older than ``stall_s`` is a stalled loop: the thread writes every thread's stack to stderr
  (``faulthandler``: no Python lock, so it works while the loop thread holds one), logs
  ``agent_loop_stalled`` and, once beats come again, ``agent_loop_recovered`` with the stall's length.
* **Kernel-log reader.** A :class:`KmsgProbe` says how many lines the reader has taken and whether
  input is waiting (a kernel-log *file* longer than the reader's saved position). No progress for
  ``kmsg_stall_s`` while input waits is a stalled reader: ``kmsg_reader_stalled``, then
  ``kmsg_reader_recovered``. (``/dev/kmsg`` and FIFOs cannot be asked from outside without reading
  them: the probe says "nothing waiting" and only the loop heartbeat covers them.)
* **systemd.** ``WATCHDOG=1`` (``sd_notify``) is sent from this thread, and only while the last
  beat is fresh and said the core tasks are alive: a frozen loop stops the pings and systemd's
  ``WatchdogSec=`` restarts the agent (``systemd/ftd-agent.service``).

The counts (:class:`WatchdogStats`) are the agent's metrics (``ftd.agent.metrics``). ``SIGUSR1``
dumps every thread's stack to stderr on demand while the watchdog runs (``kill -USR1 <pid>``).
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import os
import signal
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ftd.logs import get_logger
from ftd.sdnotify import notify, watchdog_interval_s

if TYPE_CHECKING:
    from ftd.agent.watchers.kmsg import KmsgWatcher

log = get_logger(__name__)

STACK_FD = 2  # where stalled stacks go: stderr, i.e. the journal under systemd


class KmsgProbe(Protocol):
    """What the watchdog asks of the kernel-log reader, from its own thread (plain reads only)."""

    def progress(self) -> int:
        """A count that grows whenever the reader takes input (lines read)."""
        ...

    def pending(self) -> int:
        """Bytes of input waiting to be read (0 when none, or when it cannot be known)."""
        ...


class FileKmsgProbe:
    """The probe of a :class:`~ftd.agent.watchers.kmsg.KmsgWatcher`: its ``lines`` count and, when it
    follows a regular file, the bytes past its saved position (the checkpoint's ``mark``)."""

    def __init__(self, watcher: KmsgWatcher) -> None:
        self._watcher = watcher

    def progress(self) -> int:
        return self._watcher.lines

    def pending(self) -> int:
        at = self._watcher.checkpoint
        mark = at.mark
        if at.kind != "file" or mark is None:
            return 0
        try:
            st = os.stat(self._watcher.path)
        except OSError:
            return 0
        if not stat.S_ISREG(st.st_mode) or st.st_ino != at.source:  # rotated: the reader switches
            return 0
        return max(0, st.st_size - mark)


@dataclass
class WatchdogStats:
    loop_stalls: int = 0  # stalls of the event loop seen (each counted once, when it passed stall_s)
    loop_stalled: bool = False  # a stall is going on now
    longest_loop_stall_s: float = 0.0  # the longest beat age seen in a stall (grows during one)
    kmsg_stalls: int = 0  # stalls of the kernel-log reader with input waiting
    kmsg_stalled: bool = False
    pings: int = 0  # WATCHDOG=1 sent to systemd
    stack_dumps: int = 0


def _dump_stacks() -> None:
    faulthandler.dump_traceback(file=STACK_FD, all_threads=True)


class AgentWatchdog:
    """Watches one event loop from a daemon thread; see the module docstring."""

    def __init__(
        self,
        *,
        healthy: Callable[[], bool],
        kmsg: KmsgProbe | None = None,
        stall_s: float = 5.0,
        kmsg_stall_s: float = 30.0,
        check_s: float = 0.5,
        ping_every_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        dump_stacks: Callable[[], None] = _dump_stacks,
    ) -> None:
        if ping_every_s is None:
            ping_every_s = watchdog_interval_s()  # None: systemd asked for no watchdog
        self._healthy_fn = healthy
        self._kmsg = kmsg
        self.stall_s = stall_s
        self.kmsg_stall_s = kmsg_stall_s
        # Checked often enough to ping on time and to see a stall before systemd does.
        self.check_s = min(check_s, stall_s / 4, *(() if ping_every_s is None else (ping_every_s / 2,)))
        self.ping_every_s = ping_every_s
        self._clock = clock
        self._dump_stacks = dump_stacks
        self.stats = WatchdogStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._beat_at = 0.0  # written on the loop thread, read on the watchdog thread
        self._beat_healthy = False
        self._sigusr1 = False

    # --- lifecycle (called on the loop) -----------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._beat()
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="ftd-watchdog", daemon=True)
        self._thread.start()
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, OSError, RuntimeError):
                faulthandler.register(signal.SIGUSR1, file=STACK_FD, all_threads=True)
                self._sigusr1 = True

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None:
            thread.join(timeout=5)
        if self._sigusr1:
            self._sigusr1 = False
            faulthandler.unregister(signal.SIGUSR1)

    # --- the beat (on the loop) -------------------------------------------------------------------

    def _beat(self) -> None:
        self._beat_healthy = self._healthy_fn()
        self._beat_at = self._clock()

    # --- the thread -------------------------------------------------------------------------------

    def _watch(self) -> None:
        loop = self._loop
        assert loop is not None
        last_ping = -float("inf")
        kmsg_seen = (-1, self._clock())  # (progress, when it last changed or nothing was waiting)
        while not self._stop.wait(self.check_s):
            try:
                loop.call_soon_threadsafe(self._beat)
            except RuntimeError:  # the loop is closed: nothing left to watch
                return
            now = self._clock()
            alive = self.check_loop(now)
            if self._kmsg is not None:
                kmsg_seen = self.check_kmsg(now, kmsg_seen)
            if (
                alive
                and self.ping_every_s is not None
                and self._beat_healthy
                and now - last_ping >= self.ping_every_s
                and notify("WATCHDOG=1")
            ):
                self.stats.pings += 1
                last_ping = now

    def check_loop(self, now: float) -> bool:
        """One look at the heartbeat; True while the loop is alive (its last beat is fresh)."""
        age = now - self._beat_at
        stats = self.stats
        if age >= self.stall_s:
            stats.longest_loop_stall_s = max(stats.longest_loop_stall_s, age)
            if not stats.loop_stalled:
                stats.loop_stalled = True
                stats.loop_stalls += 1
                # Stacks first: they need no Python lock, and the log may be what the loop holds.
                with contextlib.suppress(Exception):
                    self._dump_stacks()
                    stats.stack_dumps += 1
                log.error(
                    "agent_loop_stalled",
                    stalled_s=round(age, 3),
                    stalls=stats.loop_stalls,
                    detail="the event loop has not run for this long; every thread's stack is on stderr",
                )
            return False
        if stats.loop_stalled:
            stats.loop_stalled = False
            log.warning("agent_loop_recovered", stalled_s=round(stats.longest_loop_stall_s, 3))
        return True

    def check_kmsg(self, now: float, seen: tuple[int, float]) -> tuple[int, float]:
        """One look at the kernel-log reader; returns the new ``(progress, since)``."""
        probe, stats = self._kmsg, self.stats
        assert probe is not None
        progress, since = seen
        current, waiting = probe.progress(), probe.pending()
        if current != progress or waiting == 0:
            if stats.kmsg_stalled:
                stats.kmsg_stalled = False
                log.warning("kmsg_reader_recovered", stalled_s=round(now - since, 3), lines=current)
            return current, now
        if now - since >= self.kmsg_stall_s and not stats.kmsg_stalled:
            stats.kmsg_stalled = True
            stats.kmsg_stalls += 1
            log.error(
                "kmsg_reader_stalled",
                stalled_s=round(now - since, 3),
                pending_bytes=waiting,
                lines=current,
                loop_stalled=stats.loop_stalled,
            )
        return progress, since
