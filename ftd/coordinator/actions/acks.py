"""Acknowledgements from trainer ranks, collected per directive, with waiting by deadline."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from ftd.events import Ack


@dataclass(frozen=True)
class AckOutcome:
    acked: dict[int, Ack]  # rank -> positive ack
    nacked: dict[int, Ack]  # rank -> negative ack (could not save)
    missing: frozenset[int]  # ranks that said nothing before the deadline

    @property
    def complete(self) -> bool:
        return not self.nacked and not self.missing


class AckBook:
    def __init__(self) -> None:
        self._acks: dict[str, dict[int, Ack]] = defaultdict(dict)
        self._changed = asyncio.Event()

    def record(self, ack: Ack) -> None:
        self._acks[ack.directive_id][ack.rank] = ack
        self._changed.set()

    def acked(self, directive_id: str) -> int:
        """How many ranks acknowledged ``directive_id`` positively so far (the API's live count)."""
        return sum(1 for ack in self._acks.get(directive_id, {}).values() if ack.ok)

    def forget(self, directive_id: str) -> None:
        self._acks.pop(directive_id, None)

    def outcome(self, directive_id: str, ranks: Iterable[int]) -> AckOutcome:
        got = self._acks.get(directive_id, {})
        wanted = set(ranks)
        return AckOutcome(
            acked={r: a for r, a in got.items() if a.ok and r in wanted},
            nacked={r: a for r, a in got.items() if not a.ok and r in wanted},
            missing=frozenset(wanted - set(got)),
        )

    async def wait(self, directive_id: str, ranks: Iterable[int], timeout: float) -> AckOutcome:
        """Wait until every rank answered (positively or not) or ``timeout`` seconds pass."""
        wanted = set(ranks)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            outcome = self.outcome(directive_id, wanted)
            remaining = deadline - loop.time()
            if not outcome.missing or remaining <= 0:
                return outcome
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._changed.wait()
