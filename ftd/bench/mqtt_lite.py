"""A minimal MQTT 3.1.1 client session on asyncio streams, for holding thousands of idle node sessions.

Why not :class:`ftd.bus.mqtt.MqttBus` (then aiomqtt over paho) for each of 10,000 simulated nodes:
measured on the 2-core VM with sessions held idle in one process, MqttBus costs 23 KiB and, at 5,000
sessions, 15% of a core; this client 7.5 KiB and 10%, so the load generator leaves more of the
machine to the broker and the coordinator being measured. An idle agent's session on the wire is
small: CONNECT (credentials, a retained QoS 1 Last Will), SUBSCRIBE to its directives and receipts, a
few retained QoS 1 PUBLISHes, and a PINGREQ every keepalive. This module speaks exactly that and
nothing else (no QoS 2, no resend, no reconnect: a cut session stays down, as the bench wants).
Payloads are built by the caller with ftd's own codecs, so the coordinator sees what a real agent
sends.

:meth:`LiteSession.cut` closes the socket without DISCONNECT, as a node that loses power does: the
broker publishes the session's Last Will.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["LiteSession", "MqttLiteError", "Will"]

_CONNECT, _CONNACK, _PUBLISH, _PUBACK = 0x10, 0x20, 0x30, 0x40
_SUBSCRIBE, _SUBACK, _PINGREQ, _PINGRESP, _DISCONNECT = 0x82, 0x90, 0xC0, 0xD0, 0xE0


class MqttLiteError(RuntimeError):
    """The broker refused the session or broke the protocol."""


@dataclass(frozen=True)
class Will:
    topic: str
    payload: bytes
    retain: bool = True


def _string(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return struct.pack("!H", len(raw)) + raw


def _remaining_length(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + _remaining_length(len(body)) + body


def connect_packet(
    client_id: str,
    *,
    username: str | None,
    password: str | None,
    will: Will | None,
    keepalive_s: int,
    clean_session: bool,
) -> bytes:
    """The CONNECT packet (MQTT 3.1.1, section 3.1): will QoS 1."""
    flags = 0x02 if clean_session else 0
    payload = _string(client_id)
    if will is not None:
        flags |= 0x04 | 0x08 | (0x20 if will.retain else 0)
        payload += _string(will.topic) + _string(will.payload)
    if username is not None:
        flags |= 0x80
        payload += _string(username)
    if password is not None:
        flags |= 0x40
        payload += _string(password)
    header = _string("MQTT") + bytes([4, flags]) + struct.pack("!H", keepalive_s)
    return _packet(_CONNECT, header + payload)


def publish_packet(topic: str, payload: bytes, packet_id: int, *, retain: bool) -> bytes:
    """A QoS 1 PUBLISH."""
    return _packet(
        _PUBLISH | 0x02 | (0x01 if retain else 0), _string(topic) + struct.pack("!H", packet_id) + payload
    )


def subscribe_packet(topic_filters: list[str], packet_id: int) -> bytes:
    """SUBSCRIBE at QoS 1 to each filter."""
    return _packet(
        _SUBSCRIBE, struct.pack("!H", packet_id) + b"".join(_string(t) + b"\x01" for t in topic_filters)
    )


class LiteSession:
    """One node's MQTT session. ``received`` counts PUBLISHes the broker delivered (acknowledged)."""

    def __init__(self, host: str, port: int, client_id: str, *, keepalive_s: int = 5) -> None:
        self.host, self.port, self.client_id, self.keepalive_s = host, port, client_id, keepalive_s
        self.received = 0
        self.connected = False
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[None]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def connect(
        self,
        *,
        username: str | None = None,
        password: str | None = None,
        will: Will | None = None,
        clean_session: bool = False,
        timeout: float = 30.0,
    ) -> None:
        async with asyncio.timeout(timeout):
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port, limit=1 << 16)
            self._writer.write(
                connect_packet(
                    self.client_id,
                    username=username,
                    password=password,
                    will=will,
                    keepalive_s=self.keepalive_s,
                    clean_session=clean_session,
                )
            )
            first, body = await self._read_packet()
        if first & 0xF0 != _CONNACK or len(body) != 2 or body[1] != 0:
            self.cut()
            raise MqttLiteError(f"{self.client_id}: CONNACK refused ({body.hex()})")
        self.connected = True
        self._tasks = [asyncio.create_task(self._read_loop()), asyncio.create_task(self._ping_loop())]

    def _packet_id(self) -> int:
        self._next_id = self._next_id % 65535 + 1
        return self._next_id

    async def publish(
        self, topic: str, payload: bytes, *, retain: bool = False, timeout: float = 30.0
    ) -> None:
        """Publish at QoS 1 and wait for the broker's PUBACK."""
        await self._send_and_wait(lambda pid: publish_packet(topic, payload, pid, retain=retain), timeout)

    async def subscribe(self, topic_filters: list[str], timeout: float = 30.0) -> None:
        await self._send_and_wait(lambda pid: subscribe_packet(topic_filters, pid), timeout)

    async def _send_and_wait(self, build: Callable[[int], bytes], timeout: float) -> None:
        if self._writer is None or not self.connected:
            raise MqttLiteError(f"{self.client_id}: not connected")
        pid = self._packet_id()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[pid] = done
        self._writer.write(build(pid))
        try:
            async with asyncio.timeout(timeout):
                await done
        finally:
            self._pending.pop(pid, None)

    async def _read_packet(self) -> tuple[int, bytes]:
        assert self._reader is not None
        first = (await self._reader.readexactly(1))[0]
        length, shift = 0, 0
        while True:
            byte = (await self._reader.readexactly(1))[0]
            length += (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
            if shift > 21:
                raise MqttLiteError("malformed remaining length")
        return first, await self._reader.readexactly(length) if length else b""

    async def _read_loop(self) -> None:
        try:
            while True:
                first, body = await self._read_packet()
                kind = first & 0xF0
                if kind in (_PUBACK, _SUBACK):
                    future = self._pending.get(struct.unpack("!H", body[:2])[0])
                    if future is not None and not future.done():
                        future.set_result(None)
                elif kind == _PUBLISH:
                    self.received += 1
                    qos = (first >> 1) & 0x03
                    if qos:
                        (topic_len,) = struct.unpack("!H", body[:2])
                        pid = body[2 + topic_len : 4 + topic_len]
                        assert self._writer is not None
                        self._writer.write(_packet(_PUBACK, pid))
        except (asyncio.IncompleteReadError, ConnectionError, MqttLiteError):
            pass
        finally:
            self.connected = False
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(MqttLiteError(f"{self.client_id}: connection lost"))

    async def _ping_loop(self) -> None:
        with contextlib.suppress(ConnectionError):
            while self.connected and self._writer is not None:
                await asyncio.sleep(self.keepalive_s)
                self._writer.write(bytes([_PINGREQ, 0]))

    def cut(self) -> None:
        """Close the socket without DISCONNECT (the broker publishes the Last Will)."""
        self.connected = False
        for task in self._tasks:
            task.cancel()
        if self._writer is not None:
            self._writer.transport.abort()

    async def disconnect(self) -> None:
        """A clean DISCONNECT (no Last Will)."""
        if self._writer is not None and self.connected:
            with contextlib.suppress(ConnectionError):
                self._writer.write(bytes([_DISCONNECT, 0]))
                await self._writer.drain()
        self.cut()
