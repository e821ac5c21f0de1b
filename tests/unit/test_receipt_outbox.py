"""The coordinator's receipt outbox: a batch naming more nodes than it has senders reaches every node
once, with exactly its ids (a few coroutines take turns, not one per node: issue #25); receipts the
bus could not publish are kept and sent once it is back."""

from __future__ import annotations

import asyncio

from ftd.bus import topics
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.coordinator.intake.receipts import RECEIPT_SENDERS, ReceiptOutbox
from ftd.events import Receipt, decode
from tests.unit.helpers import until


async def _take(bus: MemoryBus, n: int) -> list[Receipt]:
    out: list[Receipt] = []
    async with asyncio.timeout(10):
        async for message in bus.messages():
            out.append(decode(message.payload, Receipt))
            if len(out) == n:
                return out
    return out


async def test_a_batch_for_many_nodes_reaches_each_node_once_and_a_lost_bus_loses_none() -> None:
    broker = MemoryBroker()
    agents = MemoryBus(broker, client_id="agents")
    await agents.subscribe(f"{topics.PREFIX}/nodes/+/receipts")
    await agents.start()
    bus = MemoryBus(broker, client_id="coordinator")
    await bus.start()
    outbox = ReceiptOutbox(bus)
    task = asyncio.create_task(outbox.run())
    try:
        nodes = [f"node-{i:04d}" for i in range(3 * RECEIPT_SENDERS + 5)]
        for node in nodes:
            outbox.add(node, [f"{node}-a", f"{node}-b"], {f"{node}-c": "bad"} if node.endswith("7") else None)
        got = await _take(agents, len(nodes))
        assert sorted(r.node for r in got) == nodes  # each node once
        for receipt in got:
            assert receipt.ids == [f"{receipt.node}-a", f"{receipt.node}-b"]
            assert receipt.rejected == ({f"{receipt.node}-c": "bad"} if receipt.node.endswith("7") else {})
        await until(lambda: outbox.sent == len(nodes))  # counted once the publish returns
        assert outbox.pending == {}

        broker.go_down()
        outbox.add("node-x", ["x-1"])
        outbox.add("node-y", ["y-1"])
        for _ in range(50):  # the outbox tries, fails and keeps both
            await asyncio.sleep(0.01)
        assert outbox.sent == len(nodes)
        assert sorted(outbox.pending) == ["node-x", "node-y"]
        broker.come_up()
        again = await _take(agents, 2)
        assert sorted((r.node, r.ids) for r in again) == [("node-x", ["x-1"]), ("node-y", ["y-1"])]
        await until(lambda: outbox.sent == len(nodes) + 2)
        assert outbox.pending == {}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await bus.stop()
        await agents.stop()
