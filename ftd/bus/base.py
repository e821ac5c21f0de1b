"""The Bus seam: what agents and the coordinator need from a message bus, and nothing more.

Two implementations pass the same contract tests (``tests/contract/test_bus_contract.py``):
:class:`ftd.bus.mqtt.MqttBus` (paho-mqtt, the only module that imports it) and
:class:`ftd.bus.memory.MemoryBus` (in-process, for unit tests and the simulator).

Semantics, whichever the implementation:

* ``publish`` returns once the broker has the message (QoS 1 PUBACK); it raises
  :class:`BusUnavailable` while disconnected, so the caller decides whether to queue or drop.
* ``subscribe`` patterns are remembered and re-established after every reconnect.
* ``messages()`` yields every delivered message (at-least-once: duplicates are possible).
* ``ack(message)`` acknowledges a delivered message to the broker. A bus made with
  ``manual_ack=True`` sends the QoS 1 PUBACK only then, so the receiver takes responsibility for a
  message once it has *committed* it (MQTT's own rule), not when a socket read returned it: a
  receiver killed in between gets the message again from its persistent session. Every message
  must be acked, also one that is rejected (the broker holds unacked ones in flight). Without
  manual acks ``ack`` does nothing.
* ``will`` is published by the broker if the client vanishes without a clean ``stop``;
  ``birth`` is published (retained) on every (re)connect.

Both implementations keep their connected state in :class:`ConnectionState`, so ``connected`` and
``wait_connected`` are written once; :class:`ForwardingBus` only hands them on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol


class BusUnavailable(ConnectionError):
    """The bus is not connected right now; try again later."""


@dataclass(frozen=True, slots=True)
class Message:
    topic: str
    payload: bytes
    retain: bool = False
    #: The bus's handle for acknowledging this delivery (connection generation, MQTT packet id);
    #: None for a message that needs no acknowledgement (QoS 0, a bus without manual acks).
    token: tuple[int, int] | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class LastWill:
    topic: str
    payload: bytes
    retain: bool = True


class Bus(Protocol):
    @property
    def connected(self) -> bool: ...

    async def start(self) -> None:
        """Begin connecting (in the background); returns without waiting for the broker."""

    async def wait_connected(self, timeout: float | None = None) -> bool:
        """Wait until connected; False on timeout."""

    async def stop(self) -> None:
        """Disconnect cleanly (the broker does not publish the will)."""

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None: ...

    async def subscribe(self, pattern: str) -> None: ...

    def messages(self) -> AsyncIterator[Message]: ...

    def ack(self, message: Message) -> None:
        """Acknowledge a delivered message (see the module docstring); idempotent, never raises."""

    def set_birth(self, birth: Message | None) -> None:
        """From the next (re)connect on, publish ``birth`` (retained) first; None for nothing."""


class ConnectionState:
    """Whether a bus is connected, and the wait for it: the base of each :class:`Bus` implementation.

    The implementation sets ``self._connected`` when a connection is up and clears it when it is
    lost or stopped; ``connected`` and ``wait_connected`` read it."""

    def __init__(self) -> None:
        self._connected = asyncio.Event()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def wait_connected(self, timeout: float | None = None) -> bool:
        """Wait until connected; False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                await self._connected.wait()
        except TimeoutError:
            return False
        return True


class ForwardingBus:
    """A :class:`Bus` that hands every call to ``inner``: subclass it and override the calls to
    watch or guard (the HA lease's fenced bus, the failover bench's recording bus)."""

    def __init__(self, inner: Bus) -> None:
        self.inner = inner

    @property
    def connected(self) -> bool:
        return self.inner.connected

    async def start(self) -> None:
        await self.inner.start()

    async def wait_connected(self, timeout: float | None = None) -> bool:
        return await self.inner.wait_connected(timeout)

    async def stop(self) -> None:
        await self.inner.stop()

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        await self.inner.publish(topic, payload, retain=retain)

    async def subscribe(self, pattern: str) -> None:
        await self.inner.subscribe(pattern)

    def messages(self) -> AsyncIterator[Message]:
        return self.inner.messages()

    def ack(self, message: Message) -> None:
        self.inner.ack(message)

    def set_birth(self, birth: Message | None) -> None:
        self.inner.set_birth(birth)
