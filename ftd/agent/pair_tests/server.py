"""The pair-test server: answers authenticated pair tests from the fleet's other agents.

What: :class:`PairTestServer` listens on the configured port while pair tests are enabled. For each
connection it greets with a fresh nonce, checks the client's HMAC (:func:`ftd.agent.pair_tests.wire.mac`
with the fleet's pair-test key), refuses when this node is training (``busy`` says why) or already
serving a test, proves itself with its own HMAC, then runs the phases the client asks: small pings
echoed, an upload it receives and times, a download it sends (none of either for a pingmesh
probe, which asks for 0 bytes; probes are answered even while a bulk test runs, bulk tests one at a
time), and the all-reduce step when asked (a test asking for the step holds the server like a bulk
test, whatever bytes it asks). Every test is bounded: the bytes per direction by the smaller of the
client's request and :attr:`max_bytes`, the whole connection by :attr:`max_seconds` (plus the step's
own timeout; then it is closed).

Why here: the server is half of a test a peer runs; it never measures on its own behalf, never
sends more than it was asked or allowed, and never talks to what cannot prove it is an agent of this
fleet (a wrong or missing MAC closes the connection before any data moves).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import secrets
import socket
from collections.abc import Callable

from ftd.agent.pair_tests.allreduce import SECRET_HEX, AllReduceRank, AllReduceStep
from ftd.agent.pair_tests.wire import (
    GREETING,
    NONCE_BYTES,
    ROUNDS,
    WireError,
    mac,
    read_chunks,
    read_message,
    retrans_pct,
    send_message,
    tcp_counters,
    write_chunks,
)
from ftd.logs import get_logger

__all__ = ["Busy", "PairTestServer"]

log = get_logger(__name__)

#: Why this node must not take part in a test now (a job trains here), or ``None``.
Busy = Callable[[], str | None]

_PING_LIMIT = 64
#: A connection that has not proven the key within this many seconds is closed, and at most this many
#: such connections are held at once (more are closed at once): a stranger cannot tie the server up.
HANDSHAKE_S = 5.0
MAX_UNAUTHENTICATED = 8


def _not_busy() -> str | None:
    return None


class PairTestServer:
    def __init__(
        self,
        *,
        node: str,
        key: bytes,
        host: str = "0.0.0.0",
        port: int = 0,
        max_bytes: int = 16 * 1024 * 1024,
        max_seconds: float = 10.0,
        busy: Busy = _not_busy,
        allreduce: AllReduceStep | None = None,
    ) -> None:
        if not key:
            raise ValueError("a pair-test server needs the fleet's pair-test key")
        self.node = node
        self.key = key
        self.host = host
        self.port = port
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds
        self.busy = busy
        self.allreduce = allreduce
        self.served = 0
        self._unauthenticated = 0
        self.refused = 0
        self._active = False
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen; the port bound (``port=0`` picks a free one)."""
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        sock = self._server.sockets[0]
        self.port = int(sock.getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if self._unauthenticated >= MAX_UNAUTHENTICATED:
            self.refused += 1
            log.info("pair_test_refused", peer=str(peer), why=f"{MAX_UNAUTHENTICATED} handshakes pending")
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return
        self._unauthenticated += 1
        counted = [True]  # until the client proved the key
        step = self.allreduce.timeout_s if self.allreduce is not None else 0.0
        try:
            async with asyncio.timeout(self.max_seconds + step):
                await self._exchange(reader, writer, counted)
        except (TimeoutError, WireError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
            log.info("pair_test_ended", peer=str(peer), why=str(exc) or type(exc).__name__)
        finally:
            if counted[0]:
                self._unauthenticated -= 1
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counted: list[bool]
    ) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        server_nonce = os.urandom(NONCE_BYTES)
        writer.write(GREETING + server_nonce)
        await writer.drain()
        async with asyncio.timeout(min(HANDSHAKE_S, self.max_seconds)):
            request = await read_message(reader)
        fields = {k: request.get(k) for k in ("node", "bytes", "pings", "allreduce")}
        client_nonce = bytes.fromhex(str(request.get("nonce", "")))
        expected = mac(self.key, "client", server_nonce, client_nonce, fields)
        if len(client_nonce) != NONCE_BYTES or not _same(str(request.get("mac", "")), expected):
            self.refused += 1
            await send_message(writer, {"ok": False, "reason": "not authenticated"})
            return
        self._unauthenticated -= 1
        counted[0] = False
        wanted = fields["bytes"]
        pings = fields["pings"]
        collective = fields["allreduce"]
        if (
            not isinstance(wanted, int)
            or not isinstance(pings, int)
            or not isinstance(collective, int)
            or isinstance(collective, bool)
            or collective < 0
            or wanted < 0
            or not 0 <= pings <= _PING_LIMIT
        ):
            self.refused += 1
            await send_message(writer, {"ok": False, "reason": "bad request"})
            return
        # a bulk test holds the server, and so does the all-reduce step even with no bulk bytes asked
        exclusive = wanted > 0 or collective > 0
        reason = self.busy()
        if reason is None and self._active and exclusive:
            reason = "already serving a pair test"
        if reason is not None:
            self.refused += 1
            await send_message(writer, {"ok": False, "reason": f"{self.node}: {reason}"})
            return
        bulk = wanted > 0
        self._active = self._active or exclusive
        try:
            allowed = min(wanted, self.max_bytes)
            answer = {"node": self.node, "bytes": allowed}
            proof = mac(self.key, "server", server_nonce, client_nonce, answer)
            await send_message(writer, {"ok": True, **answer, "mac": proof})
            for _ in range(pings):
                writer.write(await reader.readexactly(8))
                await writer.drain()
            per = allowed // ROUNDS
            rounds = [await read_chunks(reader, per) for _ in range(ROUNDS)]
            await send_message(writer, {"rounds": [[received, seconds] for received, seconds in rounds]})
            go = await read_message(reader)
            loop = asyncio.get_running_loop()
            share = max(0.0, min(float(go.get("seconds", 0.0)), self.max_seconds)) / ROUNDS
            before = tcp_counters(writer)
            for _ in range(ROUNDS):
                await write_chunks(writer, per, loop.time() + share)
            if bulk:  # this node's egress: how much of it the kernel had to send again
                await send_message(writer, {"retrans_pct": retrans_pct(before, tcp_counters(writer))})
            await read_message(reader)  # the client's "done": the data arrived before we close
            if collective > 0:
                await self._allreduce(reader, writer, collective)
            self.served += 1
        finally:
            if exclusive:
                self._active = False

    async def _allreduce(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, wanted: int
    ) -> None:
        """Rank 0 of the all-reduce step: offer its store's port, or say why there is no step."""
        step = self.allreduce
        if step is None or step.max_bytes <= 0:
            await send_message(writer, {"allreduce_skipped": f"{self.node}: the all-reduce step is off here"})
            return
        local = str(writer.get_extra_info("sockname")[0])
        nbytes = min(wanted, step.max_bytes)
        secret = secrets.token_hex(SECRET_HEX // 2)  # the rendezvous' keys, told only to the peer
        try:
            rank = await AllReduceRank.start(
                step, rank=0, host=local, port=0, nbytes=nbytes, local_address=local, secret=secret
            )
        except OSError as exc:  # allreduce_python names nothing runnable: the peer is told which
            why = exc.strerror or str(exc)
            await send_message(writer, {"allreduce_error": f"{self.node}: cannot start {step.python}: {why}"})
            return
        try:
            first = await rank.line()
            port = first.get("port")
            if isinstance(port, int) and not isinstance(port, bool):
                await send_message(writer, {"allreduce_port": port, "bytes": nbytes, "secret": secret})
                # The client's rank is done (or gave up): so is this one's collective, and it is ended
                # now, so the next test finds this server free (the client's figure is the result).
                done = await read_message(reader)
                log.info("pair_test_allreduce", node=self.node, bytes=nbytes, ok=done.get("ok") is True)
            elif "skipped" in first:
                await send_message(writer, {"allreduce_skipped": f"{self.node}: {first['skipped']}"})
            else:
                await send_message(writer, {"allreduce_error": f"{self.node}: {first.get('error', first)}"})
        finally:
            await rank.stop()


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())
