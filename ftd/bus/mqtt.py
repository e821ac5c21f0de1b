"""The MQTT bus on paho-mqtt's public API -- the only module in ftd that imports paho.

A background task owns the connection: it connects, publishes the retained *birth* message (the
node's ``online`` status), re-subscribes every remembered pattern, then waits for the connection to
end. When it drops it reconnects with exponential backoff and full jitter (so a restarted broker is
not hit by every node in the same millisecond).

Sessions are persistent (``clean_session=False`` with a stable client id): QoS 1 messages published
to a briefly disconnected coordinator wait in the broker.

**One connection, one paho client, driven by this event loop** (:class:`_Connection`). paho's
blocking ``connect`` (name lookup, TCP and TLS handshakes, the CONNECT packet) runs in a worker
thread; paho is told about this loop only after it returns, and from then on every call into paho
happens on the loop thread, through paho's documented external-loop API: ``loop_read`` when the
socket is readable, ``loop_write`` when paho asked for the socket to be watched for writing
(``on_socket_register_write``), ``loop_misc`` every second (keepalive). The socket callbacks add and
remove the loop's reader and writer *synchronously*, on the socket they are given.
Why not aiomqtt, which ftd used before (issue #31): an agent stopped for good after a broker
SIGKILL in one of seventeen runs, its loop, kernel-log reader and reconnects all still. The wiring
then had three hazards that a connection loss under load can meet: aiomqtt registered the socket's
reader and writer through ``call_soon_threadsafe`` with the descriptor's *number* (a registration
queued before the socket closed ran after it: a writer on a closed, or reused, descriptor), ended a
connection on a reader or writer exception without closing paho's socket (the old socket stayed
registered), and ftd replaced aiomqtt's reader and queued PUBACKs through paho's private methods
(``_packet_read``, ``_loop_rc_handle``, ``_packet_queue``) whose locking and state it had to guess.
Which of them froze that agent was not reproduced (:mod:`ftd.agent.watchdog` now dumps the stacks of
a stalled agent); here none of them exists: one thread owns the client after connect, every
descriptor is registered on the loop thread while it is open, and any failure closes the socket.

A wake-up reads a burst of packets (up to :data:`_READ_BURST`, while each read delivers one), so a
flood is taken off the socket in bursts (issue #25); epoll is level-triggered, so stopping early only
costs another wake-up. Incoming messages go from paho's ``on_message`` straight into the bus's queue.

Manual acknowledgement (``manual_ack=True``, the coordinator): paho's automatic PUBACK is off and
:meth:`MqttBus.ack` sends it (``Client.ack``) when the application says so. Each delivery carries a
token ``(connection generation, packet id)``: an ack for a message from an earlier connection is not
sent (packet ids are reused per connection; the broker redelivers that message on the new one).

``publish`` is QoS 1 and returns on PUBACK; while disconnected it raises
:class:`~ftd.bus.base.BusUnavailable` at once instead of blocking, so the agent's outbox keeps the
event and retries; a connection lost while it waits for the PUBACK raises it too. ``stop`` sends
DISCONNECT (the broker then does not publish the will); ``abort`` drops the socket without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

from ftd.bus.base import BusUnavailable, ConnectionState, LastWill, Message
from ftd.logs import get_logger

log = get_logger(__name__)

_QOS = 1
_READ_BURST = 64  # packets read per wake-up of the event loop, at most
_MISC_EVERY_S = 1.0  # paho's keepalive bookkeeping (PINGREQ, and a silent broker's timeout)
_DISCONNECT_WAIT_S = 2.0  # stop(): how long DISCONNECT may take before the socket is just closed
# paho sends 20 QoS 1 publishes at a time by default and queues the rest; the broker bounds in-flight
# messages itself (Mosquitto: 20 by default), so paho's own limit only adds a second queue.
_MAX_INFLIGHT = 256


class ConnectionLost(ConnectionError):
    """The broker connection ended (or could not be set up)."""


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
        self._conn: _Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self.connects = 0  # successful connections so far (reconnects = connects - 1)
        self._manual_ack = manual_ack
        self.stale_acks = 0  # acks not sent: the message came on an earlier connection

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
        conn, task = self._conn, self._task
        self._task = None
        if conn is not None:
            conn.drop()
        if task is not None:
            task.cancel()
        self._connected.clear()

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        conn = self._conn
        if conn is None or not self.connected:
            raise BusUnavailable(f"not connected to {self.host}:{self.port}")
        try:
            async with asyncio.timeout(self._publish_timeout):
                await conn.publish(topic, payload, retain=retain)
        except TimeoutError:
            raise BusUnavailable(f"publish to {topic} timed out after {self._publish_timeout:g} s") from None
        except ConnectionLost as exc:
            raise BusUnavailable(f"publish to {topic} failed: {exc}") from exc

    async def subscribe(self, pattern: str) -> None:
        if pattern in self._patterns:
            return
        self._patterns.append(pattern)
        conn = self._conn
        if conn is not None and self.connected:
            try:
                async with asyncio.timeout(self._publish_timeout):
                    await conn.subscribe(pattern)
            except (ConnectionLost, TimeoutError) as exc:  # re-established on the next connect
                log.warning("subscribe_deferred", pattern=pattern, error=str(exc) or type(exc).__name__)

    async def messages(self) -> AsyncIterator[Message]:
        while True:
            yield await self._queue.get()

    def set_birth(self, birth: Message | None) -> None:
        self._birth = birth

    def ack(self, message: Message) -> None:
        token, conn = message.token, self._conn
        if token is None or not self._manual_ack:
            return
        generation, mid = token
        # Compared with the connection's own generation, not ``connects``: that counts a connection
        # only once it is fully set up (subscribed, birth published), and messages come before that.
        # Their acks were dropped as stale: the broker keeps them in flight until the session ends and,
        # with its in-flight window (Mosquitto: 20) full of them, sends this client nothing more.
        if conn is None or generation != conn.generation or not conn.ack(mid):
            self.stale_acks += 1  # the broker sends this message again on the new connection

    def _lost(self, conn: _Connection) -> None:
        """``conn`` ended: not connected from this moment, in the callback that saw the loss.

        Not later, when the connection task resumes (two turns of the loop on): a caller that retries
        a failed publish with ``wait_connected`` (the agent's outbox) would meanwhile find the bus
        still "connected", fail again at once and never yield -- the whole agent stopped, its loop
        spinning (issue #31)."""
        if self._conn is conn:
            self._conn = None
            self._connected.clear()

    # --- connection loop ---------------------------------------------------------------------

    async def _run(self) -> None:
        failures = 0
        while True:
            # Current from the start: messages (and their acks) come as soon as CONNACK is read.
            conn = self._conn = _Connection(self, self.connects + 1)
            try:
                await conn.open(self.host, self.port, timeout=self._publish_timeout)
                async with asyncio.timeout(self._publish_timeout):
                    # One SUBSCRIBE for every pattern, not one each: amqtt (the embedded broker) sends
                    # a pattern's retained messages after its SUBACK and reads the next SUBSCRIBE only
                    # once they are acknowledged -- by a manual-ack client (the coordinator) only when
                    # it handles them, after this set-up: 5 s per pattern, and the set-up timed out on
                    # every reconnect (tests/contract/test_bus_contract.py).
                    if self._patterns:
                        await conn.subscribe(*self._patterns)
                    if self._birth is not None:
                        await conn.publish(self._birth.topic, self._birth.payload, retain=self._birth.retain)
                self.connects += 1
                failures = 0
                self._connected.set()
                log.info("bus_connected", broker=f"{self.host}:{self.port}", client_id=self.client_id)
                await conn.ended()
            except asyncio.CancelledError:
                self._connected.clear()
                await conn.close(graceful=True)
                raise
            except (ConnectionLost, OSError, TimeoutError) as exc:
                was_connected = self.connected
                self._connected.clear()
                self._conn = None
                await conn.close(graceful=False)
                failures += 1
                delay = _backoff_delay(failures, *self._backoff)
                # The first failure, then the 2nd, 4th, 8th...: a broker that stays away keeps saying
                # so, ever less often (attempt 64 is minutes in), instead of one line and then silence.
                repeating = failures & (failures - 1) == 0
                log_fn = log.warning if was_connected or repeating else log.debug
                error = str(exc) or type(exc).__name__
                log_fn("bus_disconnected", error=error, retry_in_s=round(delay, 3), attempt=failures)
                await asyncio.sleep(delay)
            finally:
                self._connected.clear()
                self._conn = None


class _Connection:
    """One paho client for one connection, driven by the running event loop (module docstring)."""

    def __init__(self, bus: MqttBus, generation: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._bus = bus
        self.generation = generation
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=bus.client_id,
            clean_session=bus._clean_session,
            manual_ack=bus._manual_ack,
        )
        if bus._username is not None:
            client.username_pw_set(bus._username, bus._password)
        if bus._tls is not None:
            client.tls_set_context(bus._tls)
        if bus._will is not None:
            client.will_set(bus._will.topic, bus._will.payload, qos=_QOS, retain=bus._will.retain)
        client.max_inflight_messages_set(_MAX_INFLIGHT)
        # Set before connecting: a persistent session's queue may arrive right after CONNACK.
        client.on_message = _receiver(bus._queue, generation, bus._manual_ack, self._delivered)
        self.client = client
        self._connack: asyncio.Future[None] = self._loop.create_future()
        self._ended: asyncio.Future[None] = self._loop.create_future()
        self._publishes: dict[int, asyncio.Future[None]] = {}
        self._subscribes: dict[int, asyncio.Future[None]] = {}
        self._sock: Any = None  # the socket while the loop watches it
        self._fd = -1
        self._misc: asyncio.Task[None] | None = None
        self._packets = 0  # packets handled by paho's callbacks (the burst reader's progress)
        self._dropped = False  # abort(): no DISCONNECT, the broker publishes the will

    # --- setting up ----------------------------------------------------------------------------

    async def open(self, host: str, port: int, *, timeout: float) -> None:
        """Connect and wait for the broker's CONNACK; raises ConnectionLost (or OSError) if not."""
        client = self.client
        connecting = self._loop.run_in_executor(None, client.connect, host, port, self._bus._keepalive)
        try:
            await asyncio.shield(connecting)
        except asyncio.CancelledError:  # the thread still finishes: close what it opens
            connecting.add_done_callback(self._connect_abandoned)
            raise
        except ValueError as exc:  # paho's word for a bad host or port
            raise ConnectionLost(str(exc)) from exc
        sock = client.socket()
        if sock is None:  # paho closed it already (the CONNECT could not be written)
            raise ConnectionLost("connection closed while connecting")
        # From here on only this thread calls paho: it may use the loop's reader and writer.
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.on_subscribe = self._on_subscribe
        client.on_socket_close = self._on_socket_close
        client.on_socket_register_write = self._on_register_write
        client.on_socket_unregister_write = self._on_unregister_write
        # Small QoS-1 messages back to back otherwise wait on Nagle's algorithm for the peer's delayed
        # ACK: ~40 ms per hop on Linux. Latency is the product here.
        if isinstance(sock, socket.socket):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock, self._fd = sock, sock.fileno()
        self._loop.add_reader(self._fd, self._on_readable)
        if client.want_write():  # the CONNECT did not go out whole in the connect thread
            self._loop.add_writer(self._fd, self._on_writable)
        self._misc = self._loop.create_task(self._keepalive(), name=f"mqtt-misc:{self._bus.client_id}")
        async with asyncio.timeout(timeout):
            await asyncio.shield(self._connack)

    def _connect_abandoned(self, connecting: asyncio.Future[Any]) -> None:
        """The connect thread finished after its caller was cancelled: close what it opened."""
        if not connecting.cancelled():
            connecting.exception()  # retrieved: nobody waits for it any more
        self._close_socket()

    # --- the loop's view of the socket ---------------------------------------------------------

    def _on_readable(self) -> None:
        client = self.client
        try:
            for _ in range(_READ_BURST):
                before = self._packets
                if client.loop_read() != MQTTErrorCode.MQTT_ERR_SUCCESS or self._sock is None:
                    return  # the connection ended (paho closed the socket and said so)
                if self._packets == before:
                    break  # nothing (more) to read now, or a packet no callback reports
            pending = getattr(self._sock, "pending", None)  # TLS: bytes decrypted, not read yet
            if pending is not None and pending() > 0:
                self._loop.call_soon(self._on_readable)
        except Exception as exc:  # a broken connection or a failing callback: end it, for real
            self._fail(exc)

    def _on_writable(self) -> None:
        try:
            self.client.loop_write()
        except Exception as exc:
            self._fail(exc)

    async def _keepalive(self) -> None:
        while self._sock is not None:
            await asyncio.sleep(_MISC_EVERY_S)
            try:
                self.client.loop_misc()
            except Exception as exc:
                self._fail(exc)

    # --- paho's callbacks (all on the loop thread) ---------------------------------------------

    def _on_register_write(self, _client: Any, _userdata: Any, sock: Any) -> None:
        if sock is self._sock:
            self._loop.add_writer(self._fd, self._on_writable)

    def _on_unregister_write(self, _client: Any, _userdata: Any, sock: Any) -> None:
        if sock is self._sock:
            self._loop.remove_writer(self._fd)

    def _on_socket_close(self, _client: Any, _userdata: Any, sock: Any) -> None:
        if sock is self._sock:  # called before paho closes it: the descriptor is still this socket's
            self._unwatch()

    def _on_connect(self, _client: Any, _userdata: Any, _flags: Any, reason: Any, _props: Any) -> None:
        self._packets += 1
        if self._connack.done():
            return
        if reason.is_failure:
            self._connack.set_exception(ConnectionLost(f"broker refused the connection: {reason}"))
        else:
            self._connack.set_result(None)

    def _on_disconnect(self, _client: Any, _userdata: Any, _flags: Any, reason: Any, _props: Any) -> None:
        self._end(ConnectionLost(f"connection lost: {reason}"))

    def _on_publish(self, _client: Any, _userdata: Any, mid: int, _reason: Any, _props: Any) -> None:
        self._packets += 1
        waiter = self._publishes.pop(mid, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _on_subscribe(self, _client: Any, _userdata: Any, mid: int, reasons: Any, _props: Any) -> None:
        self._packets += 1
        refused = [str(r) for r in reasons if r.is_failure]
        if refused:  # the broker's ACL: nothing arrives for it, and nothing to retry
            log.warning("subscribe_refused", client_id=self._bus.client_id, reasons=refused)
        waiter = self._subscribes.pop(mid, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _delivered(self) -> None:
        self._packets += 1

    # --- requests ------------------------------------------------------------------------------

    async def publish(self, topic: str, payload: bytes, *, retain: bool) -> None:
        if self._ended.done() or self._sock is None:
            raise ConnectionLost("connection lost")
        info = self.client.publish(topic, payload, qos=_QOS, retain=retain)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise ConnectionLost(mqtt.error_string(info.rc))
        if info.is_published():
            return
        waiter = self._publishes[info.mid] = self._loop.create_future()
        try:
            await waiter
        finally:
            self._publishes.pop(info.mid, None)

    async def subscribe(self, *patterns: str) -> None:
        """Subscribe to ``patterns`` in one SUBSCRIBE and wait for its SUBACK."""
        if self._ended.done() or self._sock is None:
            raise ConnectionLost("connection lost")
        rc, mid = self.client.subscribe([(pattern, _QOS) for pattern in patterns])
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS or mid is None:
            raise ConnectionLost(mqtt.error_string(rc))
        waiter = self._subscribes[mid] = self._loop.create_future()
        try:
            await waiter
        finally:
            self._subscribes.pop(mid, None)

    def ack(self, mid: int) -> bool:
        """Send the PUBACK of ``mid``; False when this connection is gone (the ack is stale)."""
        if self._ended.done() or self._sock is None:
            return False
        try:
            self.client.ack(mid, _QOS)
        except Exception as exc:
            self._fail(exc)
            return False
        return True

    async def ended(self) -> None:
        """Wait until the connection ends; raises ConnectionLost."""
        await asyncio.shield(self._ended)

    # --- ending --------------------------------------------------------------------------------

    def _end(self, error: BaseException) -> None:
        """The connection is over: the bus says so at once, and whoever waits on it is woken."""
        self._bus._lost(self)
        if not self._ended.done():
            self._ended.set_exception(error)
            self._ended.exception()  # retrieved here: an ended connection nobody awaits is normal
        for waiters in (self._publishes, self._subscribes):
            for waiter in waiters.values():
                if not waiter.done():
                    waiter.set_exception(ConnectionLost(str(error) or "connection lost"))
            waiters.clear()
        if not self._connack.done():
            self._connack.set_exception(ConnectionLost(str(error) or "connection lost"))
            self._connack.exception()

    def _fail(self, exc: BaseException) -> None:
        """An error paho did not turn into a disconnect: close the socket and end the connection."""
        self._close_socket()
        self._end(ConnectionLost(f"connection failed: {exc!r}"))

    def _unwatch(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            self._loop.remove_writer(self._fd)
        self._sock, self._fd = None, -1

    def _close_socket(self) -> None:
        sock = self.client.socket()
        self._unwatch()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def drop(self) -> None:
        """Shut the socket down without DISCONNECT (``abort``): the broker publishes the will."""
        sock = self._sock
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._dropped = True

    async def close(self, *, graceful: bool) -> None:
        """End this connection: with DISCONNECT first when ``graceful`` (and it is up), then the
        socket is closed in any case."""
        if (
            graceful
            and self._sock is not None
            and not self._dropped
            and self.client.disconnect() == MQTTErrorCode.MQTT_ERR_SUCCESS
        ):
            with contextlib.suppress(ConnectionLost, TimeoutError, asyncio.CancelledError):
                async with asyncio.timeout(_DISCONNECT_WAIT_S):
                    await asyncio.shield(self._ended)
        self._close_socket()
        self._end(ConnectionLost("closed"))
        misc, self._misc = self._misc, None
        if misc is not None:
            misc.cancel()
            await asyncio.gather(misc, return_exceptions=True)


def _receiver(
    queue: asyncio.Queue[Message], generation: int, manual: bool, delivered: Callable[[], None]
) -> Callable[[Any, Any, Any], None]:
    """paho's ``on_message`` for one connection: each message straight into the queue, as ftd's
    :class:`Message` (with its ack token when acks are manual)."""

    def on_message(_client: Any, _userdata: Any, msg: Any) -> None:
        delivered()
        try:
            topic = msg.topic
        except UnicodeDecodeError:  # the broker checks topics are UTF-8; nothing to hand on
            log.warning("bus_topic_undecodable", bytes=len(msg.payload))
            return
        token = (generation, msg.mid) if manual and msg.qos > 0 else None
        queue.put_nowait(Message(topic, _as_bytes(msg.payload), bool(msg.retain), token))

    return on_message


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
