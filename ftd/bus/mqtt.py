"""The MQTT bus on aiomqtt — the only module in ftd that imports aiomqtt.

A background task owns the connection: it connects, publishes the retained *birth* message (the
node's ``online`` status), re-subscribes every remembered pattern, then pumps incoming messages into a
queue. When the connection drops it reconnects with exponential backoff and full jitter (so a
restarted broker is not hit by every node in the same millisecond).

Sessions are persistent (``clean_session=False`` with a stable client id): QoS 1 messages published
to a briefly disconnected coordinator wait in the broker.

Manual acknowledgement (``manual_ack=True``, the coordinator): paho's automatic PUBACK is turned off
and :meth:`MqttBus.ack` sends it when the application says so (the acks given in one turn of the
event loop go out as one write). Each delivery carries a token
``(connection generation, packet id)``: an ack for a message from an earlier connection is not
sent (packet ids are reused per connection; the broker redelivers that message on the new one).
aiomqtt 2.x has no public switch for this, so it is set on its paho client here, the one module
that knows aiomqtt. Incoming messages, too, are taken from paho's callback straight into the bus's
queue (:meth:`MqttBus._receiver`) rather than through aiomqtt's iterator, which starts a task and an
``asyncio.wait`` per message, and a socket wake-up reads up to 64 packets (:func:`_read_in_bursts`;
aiomqtt's reader has paho read one), so a flood is taken off the socket in bursts (issue #25).

Stopping must not depend on a cancellation arriving: on Python 3.11 ``asyncio.wait_for`` (which
aiomqtt's ``subscribe`` and ``publish`` use for their timeout) *returns* instead of raising when it
is cancelled after its future completed, so a ``stop()`` that lands between a SUBACK being read and
the connection task resuming was lost, and ``stop()`` then waited forever on a connection task
idling in :func:`_until_disconnected` (the burst reader made that likely: the SUBACK and the
retained message come in one read, so a watcher gets its message and stops the bus before the
connection task runs again). The task's pending cancellation is still counted
(``Task.cancelling()``), so the connection task re-raises it after each of aiomqtt's awaits
(:func:`_raise_if_cancelled`).
``publish`` is QoS 1 and returns on PUBACK; while disconnected it raises
:class:`~ftd.bus.base.BusUnavailable` at once instead of blocking, so the agent's outbox keeps the
event and retries.
"""

from __future__ import annotations

import asyncio
import math
import random
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiomqtt
import paho.mqtt.client as mqtt

from ftd.bus.base import BusUnavailable, ConnectionState, LastWill, Message
from ftd.logs import get_logger

log = get_logger(__name__)

_QOS = 1
# Small QoS-1 messages back to back (publish, then PUBACK, then the next publish) otherwise wait on
# Nagle's algorithm for the peer's delayed ACK: ~40 ms per hop on Linux. Latency is the product here.
_SOCKET_OPTIONS = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)
# Publishes waiting for their PUBACK at once (more wait their turn). aiomqtt scans every pending call
# on each publish, so 10,000 receipts published together cost time quadratic in their number (a third
# of the coordinator's time in ``ftd bench coordinator``); paho sends 20 at a time anyway.
_MAX_OUTGOING_CALLS = 256
_PUBACK = struct.Struct("!BBH")  # PUBACK: type, remaining length 2, packet id
_READ_BURST = 64  # MQTT packets read per wake-up of the event loop, at most


class MqttBus(ConnectionState):
    def __init__(
        self,
        *,
        host: str,
        port: int,
        client_id: str,
        username: str | None = None,
        password: str | None = None,
        tls_context: ssl.SSLContext | None = None,
        keepalive_s: int = 5,
        will: LastWill | None = None,
        birth: Message | None = None,
        clean_session: bool = False,
        reconnect_min_s: float = 0.2,
        reconnect_max_s: float = 10.0,
        publish_timeout_s: float = 10.0,
        manual_ack: bool = False,
    ) -> None:
        super().__init__()
        self.host, self.port, self.client_id = host, port, client_id
        self._username, self._password, self._tls = username, password, tls_context
        self._keepalive = keepalive_s
        self._will, self._birth = will, birth
        self._clean_session = clean_session
        self._backoff = (reconnect_min_s, reconnect_max_s)
        self._publish_timeout = publish_timeout_s
        self._patterns: list[str] = []
        self._queue: asyncio.Queue[Message] = asyncio.Queue()
        self._client: aiomqtt.Client | None = None
        self._task: asyncio.Task[None] | None = None
        self.connects = 0  # successful connections so far (reconnects = connects - 1)
        self._manual_ack = manual_ack
        self.stale_acks = 0  # acks not sent: the message came on an earlier connection
        self._unsent_acks: list[int] = []  # packet ids acknowledged, their PUBACK not queued yet

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"mqtt:{self.client_id}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # a cancel of stop() itself still ends it
        self._connected.clear()

    def abort(self) -> None:
        """Drop the connection without DISCONNECT, as a crash would: the broker sends the will."""
        client, task = self._client, self._task
        self._task = None
        if task is not None:
            task.cancel()
        if client is not None:
            sock = client._client.socket()
            if isinstance(sock, socket.socket):
                sock.shutdown(socket.SHUT_RDWR)
        self._connected.clear()

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        client = self._client
        if client is None or not self.connected:
            raise BusUnavailable(f"not connected to {self.host}:{self.port}")
        # The deadline is ours (a timer), not aiomqtt's (asyncio.wait_for on Python 3.11: a task per
        # publish, a tenth of the coordinator's time when it receipts 10,000 nodes at once).
        try:
            async with asyncio.timeout(self._publish_timeout):
                await client.publish(topic, payload, qos=_QOS, retain=retain, timeout=math.inf)
        except TimeoutError:
            raise BusUnavailable(f"publish to {topic} timed out after {self._publish_timeout:g} s") from None
        except aiomqtt.MqttError as exc:
            raise BusUnavailable(f"publish to {topic} failed: {exc}") from exc

    async def subscribe(self, pattern: str) -> None:
        if pattern in self._patterns:
            return
        self._patterns.append(pattern)
        client = self._client
        if client is not None and self.connected:
            try:
                await client.subscribe(pattern, qos=_QOS)
            except aiomqtt.MqttError as exc:  # re-established on the next connect
                log.warning("subscribe_deferred", pattern=pattern, error=str(exc))

    async def messages(self) -> AsyncIterator[Message]:
        while True:
            yield await self._queue.get()

    def set_birth(self, birth: Message | None) -> None:
        self._birth = birth

    def ack(self, message: Message) -> None:
        token, client = message.token, self._client
        if token is None or not self._manual_ack:
            return
        generation, mid = token
        if client is None or generation != self.connects:
            self.stale_acks += 1
            return
        self._unsent_acks.append(mid)
        if len(self._unsent_acks) == 1:  # acks given in one turn of the loop go out as one write
            asyncio.get_running_loop().call_soon(self._send_acks, client, generation)

    def _send_acks(self, client: aiomqtt.Client, generation: int) -> None:
        """Queue the PUBACKs of :meth:`ack` on paho's socket as one write (paho sends each packet
        with its own ``send``: a third of the coordinator's time under a flood)."""
        mids, self._unsent_acks = self._unsent_acks, []
        if client is not self._client or generation != self.connects:
            self.stale_acks += len(mids)  # the broker sends these messages again on the new connection
            return
        packet = b"".join(_PUBACK.pack(mqtt.PUBACK, 2, mid) for mid in mids)
        client._client._packet_queue(mqtt.PUBACK, packet, mids[0], _QOS)

    # --- connection loop ---------------------------------------------------------------------

    def _make_client(self) -> aiomqtt.Client:
        will = None
        if self._will is not None:
            will = aiomqtt.Will(self._will.topic, self._will.payload, qos=_QOS, retain=self._will.retain)
        return aiomqtt.Client(
            self.host,
            self.port,
            identifier=self.client_id,
            username=self._username,
            password=self._password,
            tls_context=self._tls,
            keepalive=self._keepalive,
            will=will,
            clean_session=self._clean_session,
            timeout=self._publish_timeout,
            socket_options=_SOCKET_OPTIONS,
            max_concurrent_outgoing_calls=_MAX_OUTGOING_CALLS,
        )

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                client = self._make_client()
                if self._manual_ack:
                    client._client.manual_ack_set(True)
                # Set before connecting: a persistent session's queue may arrive right after CONNACK.
                client._client.on_message = self._receiver(self.connects + 1)
                async with client:
                    self._client = client
                    _read_in_bursts(client)
                    for pattern in self._patterns:
                        await client.subscribe(pattern, qos=_QOS)
                        _raise_if_cancelled()
                    if self._birth is not None:
                        await client.publish(
                            self._birth.topic, self._birth.payload, qos=_QOS, retain=self._birth.retain
                        )
                        _raise_if_cancelled()
                    self.connects += 1
                    failures = 0
                    self._connected.set()
                    log.info("bus_connected", broker=f"{self.host}:{self.port}", client_id=self.client_id)
                    await _until_disconnected(client)
            except aiomqtt.MqttError as exc:
                was_connected = self.connected
                self._connected.clear()
                self._client = None
                failures += 1
                delay = _backoff_delay(failures, *self._backoff)
                log_fn = log.warning if was_connected or failures == 1 else log.debug
                log_fn("bus_disconnected", error=str(exc), retry_in_s=round(delay, 3), attempt=failures)
                await asyncio.sleep(delay)
            finally:
                self._connected.clear()
                self._client = None

    def _receiver(self, generation: int) -> Callable[[Any, Any, Any], None]:
        """paho's ``on_message`` for one connection: each message straight into the queue, as ftd's
        :class:`Message` (aiomqtt's own callback converts it to its type, and its iterator then
        starts a task per message: most of the coordinator's cost per message under a flood)."""
        queue, manual = self._queue, self._manual_ack

        def on_message(_client: Any, _userdata: Any, msg: Any) -> None:
            try:
                topic = msg.topic
            except UnicodeDecodeError:  # the broker checks topics are UTF-8; nothing to hand on
                log.warning("bus_topic_undecodable", bytes=len(msg.payload))
                return
            token = (generation, msg.mid) if manual and msg.qos > 0 else None
            queue.put_nowait(Message(topic, _as_bytes(msg.payload), bool(msg.retain), token))

        return on_message


def _read_in_bursts(client: aiomqtt.Client) -> None:
    """Replace aiomqtt's reader, which has paho read one packet per wake-up of the event loop (paho's
    ``loop_read`` reads one unless it has messages of its own in flight), by one that reads up to
    :data:`_READ_BURST` packets per wake-up: a flood's messages are taken off the socket in bursts.

    Called once ``client`` is connected (aiomqtt's own reader, registered from its connect thread,
    is in place by then and is replaced here: one reader per socket). Errors end the connection as
    aiomqtt's reader does; paho's socket-close callback removes this reader with the socket."""
    paho, loop = client._client, asyncio.get_running_loop()
    sock = paho.socket()
    if sock is None:
        return

    def on_readable() -> None:
        try:
            for _ in range(_READ_BURST):
                if paho._sock is None:
                    return
                rc = paho._packet_read()
                if rc == mqtt.MQTT_ERR_AGAIN:
                    return
                if rc != mqtt.MQTT_ERR_SUCCESS:
                    paho._loop_rc_handle(rc)
                    return
            pending = getattr(paho._sock, "pending", None)  # TLS: bytes decrypted, not read yet
            if pending is not None and pending() > 0:
                loop.call_soon(on_readable)
        except Exception as exc:  # a broken connection: end it, as aiomqtt's reader does
            if not client._disconnected.done():
                client._disconnected.set_exception(exc)

    loop.add_reader(sock.fileno(), on_readable)


def _raise_if_cancelled() -> None:
    """Re-raise a cancellation of the current task that an ``asyncio.wait_for`` swallowed (Python
    3.11 returns the result when the cancel comes after the future completed; see the module
    docstring). Only for ftd's own tasks, which never swallow a cancellation on purpose."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def _until_disconnected(client: aiomqtt.Client) -> None:
    """Wait until ``client``'s connection ends, then raise MqttError as its message iterator does."""
    _raise_if_cancelled()
    disconnected = client._disconnected
    await asyncio.wait((disconnected,))
    cause = None if disconnected.cancelled() else disconnected.exception()
    raise aiomqtt.MqttError("Disconnected during message iteration") from cause


def _backoff_delay(failures: int, low: float, high: float) -> float:
    """Exponential backoff with full jitter, between ``low`` and ``high`` seconds."""
    ceiling = min(high, low * (2 ** min(failures - 1, 16)))
    return float(low + random.random() * max(0.0, ceiling - low))


def _as_bytes(payload: object) -> bytes:
    if isinstance(payload, bytes | bytearray):
        return bytes(payload)
    if payload is None:
        return b""
    return str(payload).encode()
