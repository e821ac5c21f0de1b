"""Helpers shared by the unit tests: waiting for a condition, recording the local API's callbacks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ftd.events import Ack, RankInfo


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
