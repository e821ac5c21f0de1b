"""Helpers shared by the tests: waiting for a condition, counting the event loop's turns, recording
the local API's callbacks, a rank supervisor's reported state."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from ftd.events import Ack, RankInfo, SupervisorInfo


def supervisor_info(
    role: str = "active",
    slot: int | None = None,
    gen: int = 0,
    state: str = "running",
    *,
    nodes: int = 3,
    run: str = "slurm-restart-0",
    **fields: Any,
) -> SupervisorInfo:
    """A job's rank supervisor on one node as its agent reports it (``ftd run``), for the tests of
    the coordinator's side; ``fields`` are any other :class:`SupervisorInfo` fields."""
    return SupervisorInfo(
        role=role,  # type: ignore[arg-type]
        slot=slot,
        generation=gen,
        state=state,  # type: ignore[arg-type]
        nodes=nodes,
        run=run,
        **fields,
    )


class Recorder:
    """The LocalApi's callbacks, recorded."""

    def __init__(self) -> None:
        self.presence: list[tuple[str, list[RankInfo]]] = []
        self.acks: list[Ack] = []

    async def on_presence(self, job: str, ranks: list[RankInfo]) -> None:
        self.presence.append((job, ranks))

    async def on_ack(self, ack: Ack) -> None:
        self.acks.append(ack)


async def until(predicate: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


class LoopTurns:
    """How often the event loop came round to a task that counts and sleeps ``interval`` seconds: a
    test's evidence that nothing blocked the loop meanwhile."""

    def __init__(self) -> None:
        self.count = 0


@contextlib.asynccontextmanager
async def loop_turns(interval: float = 0.0) -> AsyncIterator[LoopTurns]:
    turns = LoopTurns()

    async def count() -> None:
        while True:
            turns.count += 1
            await asyncio.sleep(interval)

    task = asyncio.create_task(count())
    try:
        yield turns
    finally:
        task.cancel()
