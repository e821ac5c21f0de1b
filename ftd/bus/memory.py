"""In-process bus: a tiny broker with MQTT semantics for unit tests and the simulator.

It keeps what the contract tests check of a real broker: wildcard subscriptions, retained messages
(an empty retained payload clears), delivery of retained messages on subscribe, a Last Will on
:meth:`MemoryBus.abort`, and a birth message on connect. It has no network, no QoS machinery (every
publish is delivered exactly once) and no persistence: those belong to the real thing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from ftd.bus.base import BusUnavailable, ConnectionState, LastWill, Message
from ftd.bus.topics import matches


class MemoryBroker:
    """Shared by every :class:`MemoryBus` of one test or simulation."""

    def __init__(self) -> None:
        self._clients: list[MemoryBus] = []
        self._retained: dict[str, bytes] = {}
        self.up = True

    def _route(self, message: Message) -> None:
        if message.retain:
            if message.payload:
                self._retained[message.topic] = message.payload
            else:
                self._retained.pop(message.topic, None)
        for client in self._clients:
            client._offer(message)

    def _retained_for(self, pattern: str) -> list[Message]:
        return [Message(t, p, retain=True) for t, p in self._retained.items() if matches(pattern, t)]

    def _attach(self, client: MemoryBus) -> None:
        self._clients.append(client)

    def _detach(self, client: MemoryBus) -> None:
        if client in self._clients:
            self._clients.remove(client)

    def go_down(self) -> None:
        """Simulate a broker outage: every client is disconnected until :meth:`come_up`."""
        self.up = False
        for client in list(self._clients):
            client._lost()

    def come_up(self) -> None:
        self.up = True
        for client in list(self._clients):
            client._reconnect()


class MemoryBus(ConnectionState):
    def __init__(
        self,
        broker: MemoryBroker,
        *,
        client_id: str = "memory",
        will: LastWill | None = None,
        birth: Message | None = None,
    ) -> None:
        super().__init__()
        self._broker = broker
        self.client_id = client_id
        self._will = will
        self._birth = birth
        self._patterns: list[str] = []
        self._queue: asyncio.Queue[Message] = asyncio.Queue()
        self._started = False

    async def start(self) -> None:
        self._started = True
        self._broker._attach(self)
        self._reconnect()

    def _reconnect(self) -> None:
        if not self._started or not self._broker.up:
            return
        self._connected.set()
        if self._birth is not None:
            self._broker._route(self._birth)
        for pattern in self._patterns:
            for message in self._broker._retained_for(pattern):
                self._queue.put_nowait(message)

    def _lost(self) -> None:
        self._connected.clear()

    async def stop(self) -> None:
        self._started = False
        self._connected.clear()
        self._broker._detach(self)

    def abort(self) -> None:
        """Vanish without a clean disconnect: the broker publishes the Last Will."""
        self._started = False
        self._connected.clear()
        self._broker._detach(self)
        if self._will is not None and self._broker.up:
            self._broker._route(Message(self._will.topic, self._will.payload, self._will.retain))

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        if not self.connected:
            raise BusUnavailable(f"{self.client_id}: not connected")
        self._broker._route(Message(topic, bytes(payload), retain))
        await asyncio.sleep(0)  # a publish is a suspension point on the real bus too

    async def subscribe(self, pattern: str) -> None:
        if pattern not in self._patterns:
            self._patterns.append(pattern)
        if self.connected:
            for message in self._broker._retained_for(pattern):
                self._queue.put_nowait(message)

    def _offer(self, message: Message) -> None:
        if self.connected and any(matches(p, message.topic) for p in self._patterns):
            # Live deliveries of retained publishes arrive with retain=False, as on MQTT.
            self._queue.put_nowait(Message(message.topic, message.payload, False))

    async def messages(self) -> AsyncIterator[Message]:
        while True:
            yield await self._queue.get()

    def set_birth(self, birth: Message | None) -> None:
        self._birth = birth

    def ack(self, message: Message) -> None:
        """Every delivery here is exactly once: nothing to acknowledge."""
