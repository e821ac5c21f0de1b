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

Health (issue #32: nothing broken looks healthy): a watcher whose task runs may still not watch.
One that can say so exposes ``health() -> WatcherHealth``: ``running`` (it watches), ``idle``
(nothing to watch here: no mounts configured, no GPU on the node; not a problem) or
``unavailable`` (it should watch and cannot: NVML broken on a GPU node), with a one-line reason.
:func:`health_of` gives the others ``running``. The agent's metrics show it
(``ftd_agent_watcher_up`` is 0 for an unavailable watcher, ``ftd_agent_watcher_state`` has the
state and the reason).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from ftd.events import Event

__all__ = ["RUNNING", "Emit", "Watcher", "WatcherHealth", "health_of"]

Emit = Callable[[Event], Awaitable[None]]


@runtime_checkable
class Watcher(Protocol):
    name: str

    async def run(self) -> None: ...


WatcherState = Literal["running", "idle", "unavailable", "down"]  # down: the agent's word (task gone)


@dataclass(frozen=True, slots=True)
class WatcherHealth:
    state: WatcherState
    reason: str = ""


RUNNING = WatcherHealth("running")


def health_of(watcher: object) -> WatcherHealth:
    """What ``watcher`` says of itself (its ``health()``), else ``running``."""
    health = getattr(watcher, "health", None)
    if callable(health):
        value = health()
        if isinstance(value, WatcherHealth):
            return value
    inner = getattr(watcher, "inner", None)  # supervision.Named around a watcher
    return health_of(inner) if inner is not None else RUNNING
