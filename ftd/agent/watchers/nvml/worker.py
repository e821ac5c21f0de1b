"""Blocking NVML calls off the event loop, each on its key's own thread and awaited under a deadline.

NVML can block for seconds or forever on a sick GPU, so every backend call runs in a dedicated
daemon thread, never the loop's default executor (a stuck call would hold one of its few workers
forever). Work is grouped by *key* (one GPU's whole probe, the inventory, NVML init, the Xid
registration): one :class:`Worker` thread per key, reused poll after poll, runs one job at a time.
:class:`ProbeRunner` submits a job and waits for it at most ``deadline_s``; a job that misses the
deadline is *stalled* (:data:`STALLED`) and stays recorded under its key, so the caller can say which
call it is stuck in (:class:`Tracker`) and, once it returns, that it came back. While a key's job is
stuck, asking again under that key answers :data:`BUSY` instead of queueing a second job behind it,
so threads and jobs never pile up.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["BUSY", "STALLED", "Probe", "ProbeRunner", "Tracker", "Worker"]

STALLED = object()
"""The job did not return within the deadline."""
BUSY = object()
"""The previous job under this key is still stuck: none was started."""


class Tracker:
    """Which call a probe thread is in (read by the loop when the deadline passes)."""

    __slots__ = ("call",)

    def __init__(self) -> None:
        self.call = ""


class Worker:
    """One daemon thread per probe key (a GPU, the inventory), reused poll after poll.

    Polling then creates no threads (8 GPUs at 1 Hz would otherwise start 8 threads a second), and a
    probe stuck inside NVML blocks only its own GPU's worker; the runner never queues a second
    probe behind a stuck one (:data:`BUSY`), so jobs never pile up either.
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def close(self) -> None:
        self._jobs.put(None)


class Probe:
    """One outstanding blocking job on its key's worker thread, awaitable from the loop."""

    def __init__(
        self, key: str, fn: Callable[[Tracker], Any], loop: asyncio.AbstractEventLoop, worker: Worker
    ) -> None:
        self.key = key
        self.tracker = Tracker()
        self.future: asyncio.Future[Any] = loop.create_future()
        self.finished = threading.Event()  # set by the worker thread, whatever the outcome
        self.started = time.monotonic()
        self.stalled_reported = False

        def target() -> None:
            try:
                result: Any = fn(self.tracker)
                error: BaseException | None = None
            except BaseException as exc:
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, self.future, result, error)
            except RuntimeError:
                # The loop closed while the call ran (the agent stopped mid-probe): nobody awaits
                # the answer any more, and the worker thread must not die of telling it.
                pass
            finally:
                self.finished.set()

        worker.submit(target)


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


class ProbeRunner:
    """Runs blocking jobs by key on per-key :class:`Worker` threads, each awaited under ``deadline_s``.

    Only jobs that have not come back within the deadline stay recorded (:meth:`get`); a job that
    returns in time is forgotten as soon as it is awaited.
    """

    def __init__(self, deadline_s: float, thread_prefix: str = "ftd-nvml-") -> None:
        self.deadline_s = deadline_s
        self._thread_prefix = thread_prefix
        self._probes: dict[str, Probe] = {}
        self._workers: dict[str, Worker] = {}

    def get(self, key: str) -> Probe | None:
        """The stalled job recorded under ``key`` (it may have returned since), if any."""
        return self._probes.get(key)

    def busy(self, key: str) -> bool:
        """True while the job recorded under ``key`` is still stuck."""
        probe = self._probes.get(key)
        return probe is not None and not probe.future.done()

    def forget(self, key: str) -> Probe | None:
        """Drop (and return) the job recorded under ``key``."""
        return self._probes.pop(key, None)

    def start(self, key: str, fn: Callable[[Tracker], Any]) -> Probe:
        """Submit ``fn`` to ``key``'s worker (started on first use) and record it under ``key``."""
        worker = self._workers.get(key)
        if worker is None:
            worker = self._workers[key] = Worker(f"{self._thread_prefix}{key}")
        probe = self._probes[key] = Probe(key, fn, asyncio.get_running_loop(), worker)
        return probe

    async def wait(self, probe: Probe) -> object:
        """The job's result, its exception, or :data:`STALLED` after the deadline (it stays recorded)."""
        done, _ = await asyncio.wait({probe.future}, timeout=self.deadline_s)
        if not done:
            return STALLED
        del self._probes[probe.key]
        exc = probe.future.exception()
        return exc if exc is not None else probe.future.result()

    async def call(self, key: str, fn: Callable[[Tracker], Any]) -> object:
        """Run ``fn`` under the deadline: its result, its exception, :data:`STALLED`, or :data:`BUSY`
        when the previous job under ``key`` is still stuck (a stuck one that came back is dropped)."""
        if self.busy(key):
            return BUSY
        self.forget(key)
        return await self.wait(self.start(key, fn))

    def outstanding(self) -> int:
        """Jobs still running in their threads."""
        return sum(1 for p in self._probes.values() if not p.finished.is_set())

    def close(self) -> list[threading.Event]:
        """Let every worker thread exit (idle ones now, a stuck one after its call returns); return
        the ``finished`` events of the jobs still running."""
        stuck = [p.finished for p in self._probes.values() if not p.finished.is_set()]
        workers, self._workers = list(self._workers.values()), {}
        for worker in workers:
            worker.close()
        return stuck
