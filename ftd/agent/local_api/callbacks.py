"""The local API's callbacks to the agent, run one at a time, in order, off the connection handlers.

Why a queue: a trainer's connection handler must never wait on the bus (an ack or a job's presence
goes out through the agent's spool and session, which may be slow or reconnecting), and the
callbacks must keep their order (an ack after the presence that registered its rank). A failing
callback is counted and logged, never fatal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ftd.logs import get_logger

log = get_logger(__name__)

Call = Callable[[], Awaitable[None]]


class CallbackQueue:
    """Calls queued by the handlers (:meth:`put`), run in order by :meth:`run` (a task)."""

    def __init__(self, counters: dict[str, int]) -> None:
        self._queue: asyncio.Queue[Call] = asyncio.Queue()
        self._counters = counters  # the local API's: "callback_errors" counts the failures
        self._counters.setdefault("callback_errors", 0)

    def put(self, call: Call) -> None:
        self._queue.put_nowait(call)

    async def drain(self) -> None:
        """Return once every call queued so far has run (the caller bounds the wait)."""
        await self._queue.join()

    async def run(self) -> None:
        """Run the calls, one at a time, until cancelled."""
        while True:
            call = await self._queue.get()
            try:
                await call()
            except Exception:
                self._counters["callback_errors"] += 1
                log.exception("local_api_callback_failed")
            finally:
                self._queue.task_done()
