"""One contract, three buses: MemoryBus, MqttBus on a real Mosquitto, MqttBus on the embedded broker.

The in-process fake is only trustworthy if it behaves like the real thing; every test here runs
against all of them.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ftd.bus.base import BusUnavailable, LastWill, Message
from ftd.bus.embedded import EmbeddedBroker
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.bus.mqtt import MqttBus
from tests.realparts import Mosquitto

_ids = itertools.count()


@dataclass
class Harness:
    make: Callable[..., Any]
    outage: Callable[[], Awaitable[None]]  # take the broker down and bring it back
    external: bool = False  # a broker in its own process: any event loop may connect to it
    #: what makes a bus acknowledge only when told (``Bus.ack``), as the coordinator's does; the
    #: memory bus delivers each message exactly once and has nothing to hold in flight
    acked: dict[str, Any] = field(default_factory=lambda: {"manual_ack": True})


@pytest.fixture(params=["memory", "mosquitto", "embedded"])
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    buses: list[Any] = []
    kind = request.param

    if kind == "memory":
        broker = MemoryBroker()

        def make(**kw: Any) -> Any:
            bus = MemoryBus(broker, client_id=f"c{next(_ids)}", **kw)
            buses.append(bus)
            return bus

        async def outage() -> None:
            broker.go_down()
            await asyncio.sleep(0.05)
            broker.come_up()

        yield Harness(make, outage, acked={})
    elif kind == "mosquitto":
        mosq = Mosquitto(tmp_path / "mosq").start()

        def make(**kw: Any) -> Any:
            bus = MqttBus(
                host="127.0.0.1", port=mosq.port, client_id=f"c{next(_ids)}", reconnect_max_s=0.5, **kw
            )
            buses.append(bus)
            return bus

        async def outage() -> None:
            await asyncio.to_thread(mosq.restart)

        try:
            yield Harness(make, outage, external=True)
        finally:
            for bus in buses:
                await bus.stop()
            mosq.stop()
        return
    else:
        embedded = await EmbeddedBroker().start()

        def make(**kw: Any) -> Any:
            bus = MqttBus(
                host="127.0.0.1", port=embedded.port, client_id=f"c{next(_ids)}", reconnect_max_s=0.5, **kw
            )
            buses.append(bus)
            return bus

        async def outage() -> None:
            await embedded.stop()
            await asyncio.sleep(0.1)
            await embedded.start()

        try:
            yield Harness(make, outage)
        finally:
            for bus in buses:
                await bus.stop()
            await embedded.stop()
        return
    for bus in buses:
        await bus.stop()


async def started(bus: Any) -> Any:
    await bus.start()
    assert await bus.wait_connected(10), "bus did not connect"
    return bus


async def next_message(bus: Any, timeout: float = 5.0) -> Message:
    async def first() -> Message:
        async for message in bus.messages():
            return message
        raise AssertionError("message stream ended")

    return await asyncio.wait_for(first(), timeout)


async def no_message(bus: Any, wait: float = 0.3) -> None:
    with pytest.raises(TimeoutError):
        await next_message(bus, wait)


async def test_publish_reaches_matching_subscribers_only(harness: Harness) -> None:
    sub_all = await started(harness.make())
    sub_other = await started(harness.make())
    pub = await started(harness.make())
    await sub_all.subscribe("ftd/v1/nodes/+/events/#")
    await sub_other.subscribe("ftd/v1/nodes/node-9/events/+")
    await asyncio.sleep(0.1)

    await pub.publish("ftd/v1/nodes/node-1/events/xid", b'{"x":1}')
    got = await next_message(sub_all)
    assert got.topic == "ftd/v1/nodes/node-1/events/xid"
    assert got.payload == b'{"x":1}'
    assert got.retain is False
    await no_message(sub_other)


async def test_retained_message_reaches_late_subscriber_and_empty_payload_clears(harness: Harness) -> None:
    pub = await started(harness.make())
    await pub.publish("ftd/v1/nodes/node-1/status", b"online", retain=True)
    late = await started(harness.make())
    await late.subscribe("ftd/v1/nodes/+/status")
    got = await next_message(late)
    assert (got.topic, got.payload, got.retain) == ("ftd/v1/nodes/node-1/status", b"online", True)

    await pub.publish("ftd/v1/nodes/node-1/status", b"", retain=True)
    await asyncio.sleep(0.1)
    later = await started(harness.make())
    await later.subscribe("ftd/v1/nodes/+/status")
    await no_message(later)


async def test_fresh_subscribers_get_the_retained_message_and_stop_every_time(harness: Harness) -> None:
    """Subscribe, start, read the retained message, stop -- ten buses in a row, each bounded: a bus
    whose stop waits forever for its disconnect, or that misses the retained message now and then
    (as a replaced socket reader once did), fails here instead of in an end-to-end test."""
    pub = await started(harness.make())
    await pub.publish("ftd/v1/nodes/node-1/jobs/7", b'{"rank":0}', retain=True)

    async def cycle() -> None:
        bus = harness.make()
        await bus.subscribe("ftd/v1/nodes/node-1/jobs/7")
        await bus.start()
        seen: list[tuple[str, bytes]] = []
        async with asyncio.timeout(5):
            async for message in bus.messages():  # as a watcher reads: the first message, then stop
                seen.append((message.topic, message.payload))
                break
        assert seen == [("ftd/v1/nodes/node-1/jobs/7", b'{"rank":0}')]
        async with asyncio.timeout(5):
            await bus.stop()

    for _ in range(5):
        await cycle()
    if harness.external:  # each in an event loop of its own, as a test's or a tool's asyncio.run does
        for _ in range(5):
            await asyncio.to_thread(asyncio.run, cycle())


async def test_retained_messages_on_several_patterns_do_not_hold_up_a_manual_ack_connection(
    harness: Harness,
) -> None:
    """The coordinator acknowledges a message once it has handled it, and handles nothing before its
    bus is connected. Retained messages waiting on several of its patterns must not keep it from
    connecting: amqtt sends a pattern's retained messages after its SUBACK and reads the client's next
    SUBSCRIBE only once they are acknowledged (or after 5 s each), so one SUBSCRIBE per pattern cost 5 s
    per pattern, the set-up's 10 s ran out, and every reconnect met the same wait -- ``ftd demo
    --serve`` under CI load, when the agents' retained presence came before the coordinator."""
    publisher = await started(harness.make())
    retained = {
        "ftd/v1/nodes/node-1/status": b"online",
        "ftd/v1/nodes/node-1/jobs/7": b'{"rank":0}',
        "ftd/v1/nodes/node-1/conditions/disk": b"full",
    }
    for topic, payload in retained.items():
        await publisher.publish(topic, payload, retain=True)
    bus = harness.make(**harness.acked)
    for pattern in ("ftd/v1/nodes/+/status", "ftd/v1/nodes/+/jobs/+", "ftd/v1/nodes/+/conditions/+"):
        await bus.subscribe(pattern)
    await bus.start()
    assert await bus.wait_connected(40), "the bus did not connect while retained messages waited"
    assert getattr(bus, "connects", 1) == 1, "connected only after retrying"
    seen: dict[str, bytes] = {}
    for _ in retained:
        message = await next_message(bus, 10)
        bus.ack(message)
        seen[message.topic] = message.payload
    assert seen == retained


async def test_birth_on_connect_and_will_on_abort_but_not_on_clean_stop(harness: Harness) -> None:
    watcher = await started(harness.make())
    await watcher.subscribe("ftd/v1/nodes/+/status")
    await asyncio.sleep(0.1)
    topic = "ftd/v1/nodes/node-7/status"
    node = await started(
        harness.make(will=LastWill(topic, b"offline"), birth=Message(topic, b"online", True))
    )
    assert (await next_message(watcher)).payload == b"online"

    node.abort()
    assert (await next_message(watcher, 10)).payload == b"offline"

    clean = await started(
        harness.make(will=LastWill(topic, b"offline"), birth=Message(topic, b"online", True))
    )
    assert (await next_message(watcher)).payload == b"online"
    await clean.stop()
    await no_message(watcher, 0.5)


async def test_publish_while_disconnected_raises_bus_unavailable(harness: Harness) -> None:
    bus = harness.make()
    with pytest.raises(BusUnavailable):
        await bus.publish("ftd/v1/nodes/node-1/events/xid", b"{}")


async def test_reconnects_and_resubscribes_after_broker_outage(harness: Harness) -> None:
    sub = await started(harness.make())
    pub = await started(harness.make())
    await sub.subscribe("ftd/v1/jobs/+/directives")
    await asyncio.sleep(0.1)
    await harness.outage()
    assert await sub.wait_connected(15)
    assert await pub.wait_connected(15)
    # Reconnection is asynchronous: retry until the resubscribed session delivers.
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        try:
            await pub.publish("ftd/v1/jobs/42/directives", b"save")
            got = await next_message(sub, 0.5)
            break
        except (BusUnavailable, TimeoutError):
            assert asyncio.get_running_loop().time() < deadline, "no delivery after the outage"
            await asyncio.sleep(0.1)
    assert (got.topic, got.payload) == ("ftd/v1/jobs/42/directives", b"save")
