"""Receipts: telling each node which of its events the coordinator has committed (or rejected).

An agent keeps an event in its spool until a :class:`~ftd.events.Receipt` names it, so neither a
broker that loses its queue nor a coordinator that dies loses an event. Receipts are gathered for
:data:`RECEIPT_BATCH_S` and sent as one message per node on ``ftd/v1/nodes/{node}/receipts``; one
that cannot be published (the bus is down) is kept and sent again once the bus is back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from ftd.bus import topics
from ftd.bus.base import Bus
from ftd.events import Receipt, encode

RECEIPT_BATCH_S = 0.02  # receipts gathered this long go out as one message per node
# publishes in flight at once: a few coroutines take turns through a batch, not one per node (a
# storm's batch names 10,000 nodes: as many coroutines kept the collector busy, issue #25)
RECEIPT_SENDERS = 64


@dataclass
class PendingReceipt:
    """What a node's next receipt will say."""

    ids: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)


class ReceiptOutbox:
    """Receipts waiting to be sent, per node, and the task that sends them (:meth:`run`)."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.pending: dict[str, PendingReceipt] = {}  # node -> what to tell it next
        self.sent = 0
        self._ready = asyncio.Event()

    def add(self, node: str, ids: list[str], rejected: Mapping[str, str] | None = None) -> None:
        """Receipt ``ids`` as committed and ``rejected`` (id -> why) as refused, with the next send."""
        pending = self.pending.get(node)
        if pending is None:
            pending = self.pending[node] = PendingReceipt()
        pending.ids.extend(ids)
        if rejected:
            pending.rejected.update(rejected)
        self._ready.set()

    async def run(self) -> None:
        """Publish pending receipts, one message per node, until cancelled."""
        while True:
            await self._ready.wait()
            await asyncio.sleep(RECEIPT_BATCH_S)
            self._ready.clear()
            pending, self.pending = self.pending, {}
            ts = time.time()
            receipts = {n: Receipt(node=n, ts=ts, ids=r.ids, rejected=r.rejected) for n, r in pending.items()}
            failed = await self._send(receipts)
            for node, receipt in failed:
                self.add(node, receipt.ids, receipt.rejected)  # try again once reconnected
            if failed:
                await self.bus.wait_connected(timeout=1.0)

    async def _send(self, receipts: Mapping[str, Receipt]) -> list[tuple[str, Receipt]]:
        """Publish each receipt (:data:`RECEIPT_SENDERS` at a time); those that failed."""
        failed: list[tuple[str, Receipt]] = []
        todo = iter(receipts.items())

        async def sender() -> None:
            for node, receipt in todo:  # shared: each sender takes the next receipt
                try:
                    await self.bus.publish(topics.node_receipts(node), encode(receipt))
                except Exception:  # the bus is down (BusUnavailable) or the publish broke
                    failed.append((node, receipt))
                else:
                    self.sent += 1

        await asyncio.gather(*(sender() for _ in range(min(RECEIPT_SENDERS, len(receipts)))))
        return failed
