"""The agent's outbox: everything the agent publishes waits here until the broker acknowledged it.

Bounded and ordered. A single publisher task sends the oldest entry, waits for the PUBACK and only
then removes it; while the bus is down it waits for the reconnect and retries, so a broker outage
delays events but loses none until the bound is hit. At the bound the oldest *low-severity* entry is
dropped first (info, then warning, ...), and every drop is counted — and reported by the agent.

(In-memory for now; the on-disk spool that also survives an agent restart is issue #3's.)
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from ftd.bus.base import Bus, BusUnavailable
from ftd.logs import get_logger

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Outgoing:
    topic: str
    payload: bytes
    retain: bool = False
    priority: int = 1  # 0 info .. 3 critical; the lowest is dropped first when full


class Outbox:
    def __init__(self, bus: Bus, *, max_entries: int = 10000) -> None:
        self._bus = bus
        self._max = max_entries
        self._queue: deque[Outgoing] = deque()
        self._ready = asyncio.Event()
        self.sent = 0
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, item: Outgoing) -> None:
        if len(self._queue) >= self._max:
            index = min(range(len(self._queue)), key=lambda i: (self._queue[i].priority, i))
            self.dropped += 1
            if self._queue[index].priority > item.priority:  # everything queued matters more
                log.warning("outbox full, dropping new message", topic=item.topic, dropped=self.dropped)
                return
            log.warning(
                "outbox full, dropping oldest lowest-priority message",
                topic=self._queue[index].topic,
                dropped=self.dropped,
            )
            del self._queue[index]
        self._queue.append(item)
        self._ready.set()

    async def run(self) -> None:
        """Publish queued messages in order, forever."""
        while True:
            if not self._queue:
                self._ready.clear()
                await self._ready.wait()
                continue
            item = self._queue[0]
            try:
                await self._bus.publish(item.topic, item.payload, retain=item.retain)
            except BusUnavailable:
                await self._bus.wait_connected(timeout=1.0)
                continue
            # The head may have been dropped for space while we awaited; remove only what we sent.
            if self._queue and self._queue[0] is item:
                self._queue.popleft()
            self.sent += 1

    async def flush(self, timeout: float) -> bool:
        """Wait until everything queued so far has been published; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._queue:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True
