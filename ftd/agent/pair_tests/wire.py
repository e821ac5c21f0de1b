"""The pair-test wire: length-prefixed JSON messages, framed data chunks and the HMAC handshake.

What: every control message is a 4-byte big-endian length and a JSON object (at most :data:`MAX_MESSAGE`
bytes: a peer cannot make the other side buffer more); bulk data goes as chunks of a 4-byte length and
that many bytes, a zero length ending the stream, so a sender can stop at its time cap between chunks
and both sides stay in step; each direction goes as :data:`ROUNDS` bursts. :func:`mac` is the
HMAC-SHA256 both ends prove they hold the fleet's pair-test key with: over the server's nonce, the
client's nonce, a role and the request's fields, so a recorded exchange cannot be replayed and a
stranger's request (or a stranger posing as the server) is refused.

Why its own module: the server and the client (and their tests) must agree on every byte.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import socket
import struct
from typing import Any

__all__ = [
    "CHUNK",
    "GREETING",
    "MAX_MESSAGE",
    "ROUNDS",
    "WireError",
    "mac",
    "read_chunks",
    "read_message",
    "retrans_pct",
    "send_message",
    "tcp_counters",
    "write_chunks",
]

#: What the server says first, before its nonce: the protocol and its version.
GREETING = b"FTDPAIR1"
NONCE_BYTES = 16
MAX_MESSAGE = 4096
CHUNK = 64 * 1024
#: Each direction is sent as this many bursts of a third of its bytes, and the fastest counts: one
#: scheduling hiccup on a busy host then slows one burst, not the verdict on the direction.
ROUNDS = 3
_LEN = struct.Struct(">I")


_TCP_INFO_LEN = 232
_TOTAL_RETRANS = 100  # struct tcp_info: __u32 tcpi_total_retrans
_SEGS_OUT = 136  # __u32 tcpi_segs_out (Linux 4.2+)
_DSACK_DUPS = 216  # __u32 tcpi_dsack_dups (Linux 5.3+): retransmissions the receiver already had


def tcp_counters(writer: asyncio.StreamWriter) -> tuple[int, int] | None:
    """The kernel's ``(segments retransmitted because they were lost, segments sent)`` of this
    connection so far (TCP_INFO), or None where the platform does not give them: a lossy link shows
    here even when TCP's quick recovery on a short round trip hides it from the throughput.
    Retransmissions the receiver reported as duplicates (D-SACK: the original had arrived, only late,
    as when a starved CPU delays the softirq that delivers it) are not loss and are subtracted."""
    sock = writer.get_extra_info("socket")
    if sock is None or not hasattr(socket, "TCP_INFO"):
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except OSError:
        return None
    if len(info) < _SEGS_OUT + 4:
        return None
    (retrans,) = struct.unpack_from("=I", info, _TOTAL_RETRANS)
    (segs,) = struct.unpack_from("=I", info, _SEGS_OUT)
    dups = struct.unpack_from("=I", info, _DSACK_DUPS)[0] if len(info) >= _DSACK_DUPS + 4 else 0
    return max(0, int(retrans) - int(dups)), int(segs)


#: Fewer segments than this and a share of retransmissions says nothing: one tail-loss probe (which
#: the kernel counts as a retransmission) among 32 loopback segments of 64 KiB read as 1.5% "loss"
#: on a clean link here. A 1500-byte MTU sends thousands for a few MiB.
MIN_SEGMENTS = 1000


def retrans_pct(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The percentage of the segments sent between two :func:`tcp_counters` readings that were
    retransmissions; None when unknown or too few were sent (:data:`MIN_SEGMENTS`)."""
    if before is None or after is None:
        return None
    sent = after[1] - before[1]
    return 100.0 * max(0, after[0] - before[0]) / sent if sent >= MIN_SEGMENTS else None


class WireError(Exception):
    """The peer broke the protocol (too long a message, not JSON, a chunk over the size)."""


def mac(key: bytes, role: str, server_nonce: bytes, client_nonce: bytes, fields: dict[str, Any]) -> str:
    """HMAC-SHA256 (hex) over the role, both nonces and the request's fields in a fixed order."""
    body = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    message = b"|".join((role.encode(), server_nonce, client_nonce, body))
    return hmac.new(key, message, hashlib.sha256).hexdigest()


async def send_message(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    writer.write(_LEN.pack(len(data)) + data)
    await writer.drain()


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any]:
    (size,) = _LEN.unpack(await reader.readexactly(_LEN.size))
    if size > MAX_MESSAGE:
        raise WireError(f"message of {size} bytes (limit {MAX_MESSAGE})")
    try:
        message = json.loads(await reader.readexactly(size))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(f"not JSON: {exc}") from exc
    if not isinstance(message, dict):
        raise WireError("not a JSON object")
    return message


async def write_chunks(writer: asyncio.StreamWriter, total: int, deadline: float) -> int:
    """Send up to ``total`` bytes in chunks, stopping early at ``deadline`` (loop time); the bytes sent."""
    loop = asyncio.get_running_loop()
    payload = bytes(CHUNK)
    sent = 0
    while sent < total and loop.time() < deadline:
        size = min(CHUNK, total - sent)
        writer.write(_LEN.pack(size) + payload[:size])
        await writer.drain()
        sent += size
    writer.write(_LEN.pack(0))
    await writer.drain()
    return sent


async def read_chunks(reader: asyncio.StreamReader, limit: int) -> tuple[int, float]:
    """Receive chunks to the end marker: ``(bytes after the first chunk, seconds from it to the end)``.

    The first chunk starts the clock (its own transfer time is not known), so it is not counted.
    More than ``limit`` bytes in all is a protocol error.
    """
    loop = asyncio.get_running_loop()
    received = 0
    first_at: float | None = None
    counted = 0
    while True:
        (size,) = _LEN.unpack(await reader.readexactly(_LEN.size))
        if size == 0:
            break
        if size > CHUNK or received + size > limit:
            raise WireError(f"chunk of {size} bytes past the limit ({received} of {limit} received)")
        await reader.readexactly(size)
        received += size
        if first_at is None:
            first_at = loop.time()
        else:
            counted += size
    elapsed = loop.time() - first_at if first_at is not None else 0.0
    return counted, elapsed
