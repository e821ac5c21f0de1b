"""The agent's outbox: nothing lost across a broker outage; bounded, dropping low severity first."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from ftd.agent.spool import Outbox, Outgoing
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.bus.mqtt import MqttBus
from tests.realparts import Mosquitto


async def collect(
    bus: MemoryBus | MqttBus,
    count: int,
    timeout: float = 15.0,
    distinct: bool = False,
    sink: list[bytes] | None = None,
) -> list[bytes]:
    """The first ``count`` payloads (or, with ``distinct``, every payload until ``count`` distinct ones)."""
    got: list[bytes] = [] if sink is None else sink

    async def run() -> None:
        async for message in bus.messages():
            got.append(message.payload)
            if len(set(got) if distinct else got) == count:
                return

    await asyncio.wait_for(run(), timeout)
    return got


async def test_memory_outage_delays_but_loses_nothing_and_keeps_order() -> None:
    broker = MemoryBroker()
    sub, pub = MemoryBus(broker, client_id="sub"), MemoryBus(broker, client_id="pub")
    await sub.subscribe("t/#")
    await sub.start()
    await pub.start()
    outbox = Outbox(pub, max_entries=100)
    task = asyncio.create_task(outbox.run())
    broker.go_down()
    for i in range(20):
        outbox.put(Outgoing("t/x", str(i).encode()))
    await asyncio.sleep(0.1)
    assert len(outbox) == 20  # held while the broker is down
    broker.come_up()
    assert await collect(sub, 20) == [str(i).encode() for i in range(20)]
    task.cancel()


def test_full_outbox_drops_lowest_priority_oldest_first_and_counts() -> None:
    outbox = Outbox(MemoryBus(MemoryBroker()), max_entries=3)
    outbox.put(Outgoing("t", b"info-1", priority=0))
    outbox.put(Outgoing("t", b"crit-1", priority=3))
    outbox.put(Outgoing("t", b"info-2", priority=0))
    outbox.put(Outgoing("t", b"crit-2", priority=3))  # evicts info-1
    outbox.put(Outgoing("t", b"info-3", priority=0))  # evicts info-2 (oldest of the lowest)
    assert [item.payload for item in outbox._queue] == [b"crit-1", b"crit-2", b"info-3"]
    outbox.put(Outgoing("t", b"warn-1", priority=1))  # evicts info-3
    outbox.put(Outgoing("t", b"info-4", priority=0))  # lower than everything queued: dropped itself
    assert [item.payload for item in outbox._queue] == [b"crit-1", b"crit-2", b"warn-1"]
    assert outbox.dropped == 4


@pytest.mark.real
async def test_real_mosquitto_restart_mid_stream_loses_nothing(tmp_path: Path) -> None:
    broker = Mosquitto(tmp_path / "mosq").start()
    sub = MqttBus(host="127.0.0.1", port=broker.port, client_id="sub", reconnect_max_s=0.3)
    pub = MqttBus(host="127.0.0.1", port=broker.port, client_id="pub", reconnect_max_s=0.3)
    try:
        await sub.subscribe("t/#")
        await sub.start()
        await pub.start()
        assert await sub.wait_connected(10) and await pub.wait_connected(10)
        outbox = Outbox(pub, max_entries=10_000)
        runner = asyncio.create_task(outbox.run())
        partial: list[bytes] = []
        received = asyncio.create_task(collect(sub, 300, timeout=60, distinct=True, sink=partial))
        for i in range(100):
            outbox.put(Outgoing("t/x", f"{i}".encode()))
        await asyncio.sleep(0.2)
        await asyncio.to_thread(broker.stop)  # persistent sessions survive a clean broker stop
        for i in range(100, 200):  # generated while the broker is down
            outbox.put(Outgoing("t/x", f"{i}".encode()))
            await asyncio.sleep(0.001)
        await asyncio.to_thread(broker.start)
        for i in range(200, 300):
            outbox.put(Outgoing("t/x", f"{i}".encode()))
        try:
            got = await received
        except TimeoutError:
            missing = sorted(set(range(300)) - {int(p) for p in partial})
            raise AssertionError(
                f"missing {len(missing)} of 300 after 60 s (first: {missing[:10]}); "
                f"outbox holds {len(outbox)}, "
                f"pub connected={pub.connected} connects={pub.connects}, sub connected={sub.connected} "
                f"connects={sub.connects}"
            ) from None
        # At-least-once: duplicates are allowed (the coordinator drops them by id), gaps are not.
        assert {int(p) for p in got} == set(range(300))
        runner.cancel()
    finally:
        for bus in (sub, pub):
            with contextlib.suppress(Exception):
                await bus.stop()
        broker.stop()
