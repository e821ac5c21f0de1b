"""The shared watcher contract: every agent watcher is an object with a ``name`` and ``async run()``.

A watcher is constructed as ``Watcher(cfg_section, node, emit)`` and runs until cancelled, calling
``await emit(event)`` for every event it observes. ``emit`` never raises for bus trouble (the agent's
storm control and durable spool sit behind it) and returns quickly; watchers must not block the
event loop (use ``asyncio.to_thread`` for blocking calls such as NVML).

The agent supervises each watcher: if ``run()`` raises (or returns while the agent still runs) it is
reported as an ``agent_health`` event and restarted with exponential backoff. A watcher that wants
stall detection may expose ``last_progress: float`` (``time.monotonic()`` of its last loop pass);
the supervisor reports and restarts it when that is older than the stall threshold (only
once ``last_progress`` was set during the current run, so an idle disabled watcher is not judged).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from ftd.events import Event

__all__ = ["Emit", "Watcher"]

Emit = Callable[[Event], Awaitable[None]]


@runtime_checkable
class Watcher(Protocol):
    name: str

    async def run(self) -> None: ...
