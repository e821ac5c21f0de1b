"""Running one pair test against another agent's server: :func:`run_pair_test`.

What: connect to the peer's pair-test server, prove this agent holds the fleet's key (and check the
server proves it too), then measure a few small-message round trips, this node's egress (an upload the
server times) and its ingress (a download this side times), each direction capped at ``max_bytes`` and a
third of ``timeout_s`` (a slow direction stops early and is measured on what arrived) and sent as
:data:`~ftd.agent.pair_tests.wire.ROUNDS` bursts of which the fastest counts, the whole test at
``timeout_s``. The answer is a :class:`ftd.fabric.pairs.PairResult`; anything that stops it (refused,
not authenticated, busy, timed out, connection lost) is its ``error``, never a measurement.

Why bounded and authenticated: a pair test moves real bytes over the fabric a job may need; it may never
run long, move more than it was allowed, run while this node trains, or talk to anything that is not one
of this fleet's agents.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import socket
import statistics
import struct
import time
from dataclasses import dataclass

from ftd.agent.pair_tests.allreduce import SECRET_HEX, AllReduceRank, AllReduceStep
from ftd.agent.pair_tests.server import Busy
from ftd.agent.pair_tests.wire import (
    GREETING,
    MAX_MESSAGE,
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
from ftd.fabric.pairs import PairResult

__all__ = ["PairPeer", "run_pair_test"]

_PING = struct.Struct(">d")


@dataclass(frozen=True)
class PairPeer:
    """Another agent's pair-test server: its node name and where it listens."""

    node: str
    host: str
    port: int


def _gbps(nbytes: int, seconds: float) -> float | None:
    return nbytes * 8 / seconds / 1e9 if nbytes > 0 and seconds > 0 else None


def _fastest(rounds: list[tuple[int, float]]) -> float | None:
    rates = [rate for nbytes, seconds in rounds if (rate := _gbps(nbytes, seconds)) is not None]
    return max(rates) if rates else None


async def run_pair_test(
    peer: PairPeer,
    *,
    node: str,
    key: bytes,
    max_bytes: int = 4 * 1024 * 1024,
    timeout_s: float = 10.0,
    pings: int = 5,
    busy: Busy | None = None,
    allreduce: AllReduceStep | None = None,
) -> PairResult:
    """Test the pair ``node`` (this agent) -> ``peer``: throughput each way, RTT, and (``allreduce``
    with bytes to move) a 2-rank gloo all-reduce; bounded (``timeout_s``, plus the step's own
    timeout when asked), authenticated."""
    started = time.monotonic()
    step = allreduce if allreduce is not None and allreduce.max_bytes > 0 and max_bytes > 0 else None

    def failed(reason: str) -> PairResult:
        return PairResult(a=node, b=peer.node, duration_s=time.monotonic() - started, error=reason)

    reason = busy() if busy is not None else None
    if reason is not None:
        return failed(f"{node}: {reason}")
    writer: asyncio.StreamWriter | None = None
    try:
        limit = timeout_s + (step.timeout_s if step is not None else 0.0)
        async with asyncio.timeout(limit):
            reader, writer = await asyncio.open_connection(peer.host, peer.port)
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return await _exchange(
                reader, writer, peer, node, key, max_bytes, timeout_s, pings, started, step
            )
    except TimeoutError:
        return failed(f"timed out after {timeout_s + (step.timeout_s if step else 0.0):g} s")
    except (OSError, asyncio.IncompleteReadError, WireError, ValueError) as exc:
        return failed(f"{type(exc).__name__}: {exc}")
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def _exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    peer: PairPeer,
    node: str,
    key: bytes,
    max_bytes: int,
    timeout_s: float,
    pings: int,
    started: float,
    step: AllReduceStep | None = None,
) -> PairResult:
    hello = await reader.readexactly(len(GREETING) + NONCE_BYTES)
    if not hello.startswith(GREETING):
        raise WireError("not a pair-test server")
    server_nonce = hello[len(GREETING) :]
    client_nonce = os.urandom(NONCE_BYTES)
    fields = {"node": node, "bytes": max_bytes, "pings": pings, "allreduce": step.max_bytes if step else 0}
    proof = mac(key, "client", server_nonce, client_nonce, fields)
    await send_message(writer, {**fields, "nonce": client_nonce.hex(), "mac": proof})
    answer = await read_message(reader)
    if answer.get("ok") is not True:
        raise WireError(f"refused: {answer.get('reason', 'no reason given')}")
    allowed = answer.get("bytes")
    if not isinstance(allowed, int) or not 0 <= allowed <= max_bytes:
        raise WireError(f"server allowed {allowed!r} bytes")
    expected = mac(key, "server", server_nonce, client_nonce, {"node": answer.get("node"), "bytes": allowed})
    if not hmac.compare_digest(str(answer.get("mac", "")).encode(), expected.encode()):
        raise WireError("server not authenticated")
    loop = asyncio.get_running_loop()
    rtts: list[float] = []
    for _ in range(pings):
        sent = time.perf_counter()
        writer.write(_PING.pack(sent))
        await writer.drain()
        await reader.readexactly(_PING.size)
        rtts.append((time.perf_counter() - sent) * 1e3)
    share = timeout_s / 3 / ROUNDS
    per = allowed // ROUNDS
    before = tcp_counters(writer)
    for _ in range(ROUNDS):
        await write_chunks(writer, per, loop.time() + share)
    upload = (await read_message(reader)).get("rounds")
    egress_retrans = retrans_pct(before, tcp_counters(writer))  # acknowledged by now: the server answered
    if not isinstance(upload, list) or len(upload) != ROUNDS:
        raise WireError("upload measurement malformed")
    ups: list[tuple[int, float]] = []
    for item in upload:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not isinstance(item[0], int)
            or not isinstance(item[1], int | float)
        ):
            raise WireError("upload measurement malformed")
        ups.append((item[0], float(item[1])))
    await send_message(writer, {"seconds": share * ROUNDS})
    downs = [await read_chunks(reader, per) for _ in range(ROUNDS)]
    ingress_retrans = None
    if allowed > 0:
        said = (await read_message(reader)).get("retrans_pct")
        if isinstance(said, int | float) and not isinstance(said, bool) and 0 <= said <= 100:
            ingress_retrans = float(said)
    await send_message(writer, {"done": True})
    moved = sum(b for b, _ in ups) + sum(b for b, _ in downs)
    gbps, skipped, error, extra = None, "the all-reduce step was not asked", "", 0
    if step is not None:
        gbps, skipped, error, extra = await _allreduce(reader, writer, peer, step)
    # Until the server closes: it has released its test by then, so a test right after this one (the
    # next of a bisection's waves) is not refused as "already serving".
    await reader.read(MAX_MESSAGE)
    return PairResult(
        a=node,
        b=peer.node,
        a_to_b_gbps=_fastest(ups),
        b_to_a_gbps=_fastest(downs),
        rtt_ms=statistics.median(rtts) if rtts else None,
        bytes_moved=moved + extra,
        duration_s=time.monotonic() - started,
        error=error,
        allreduce_gbps=gbps,
        allreduce_skipped=skipped,
        a_to_b_retrans_pct=egress_retrans if allowed > 0 else None,
        b_to_a_retrans_pct=ingress_retrans,
    )


async def _allreduce(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: PairPeer, step: AllReduceStep
) -> tuple[float | None, str, str, int]:
    """Rank 1 of the all-reduce step: ``(gbps, why skipped, error, bytes moved)``. Skipped: the peer
    has no torch or has the step off (nothing measured, not a failure); an error: the step started
    and did not complete, which fails the test (never a pass)."""
    offer = await read_message(reader)
    if "allreduce_skipped" in offer:
        return None, str(offer["allreduce_skipped"])[:300], "", 0
    if "allreduce_error" in offer:
        return None, "", f"all-reduce step: {str(offer['allreduce_error'])[:300]}", 0
    port, nbytes, secret = offer.get("allreduce_port"), offer.get("bytes"), offer.get("secret")
    if (
        not isinstance(port, int)
        or not isinstance(nbytes, int)
        or isinstance(port, bool)
        or not 0 < port < 65536
        or not 0 < nbytes <= step.max_bytes
        or not _is_secret(secret)
    ):
        raise WireError(f"all-reduce offer malformed: {str(offer)[:300]}")
    local = str(writer.get_extra_info("sockname")[0])
    try:
        rank = await AllReduceRank.start(
            step, rank=1, host=peer.host, port=port, nbytes=nbytes, local_address=local, secret=str(secret)
        )
    except OSError as exc:  # allreduce_python names nothing runnable: a misconfiguration, a failure
        with contextlib.suppress(OSError):
            await send_message(writer, {"allreduce_done": True, "ok": False})
        return None, "", f"all-reduce step: cannot start {step.python}: {exc.strerror or exc}", 0
    got: dict[str, object] = {}
    try:
        got = await rank.line()
    finally:
        await rank.stop()
        with contextlib.suppress(OSError):  # the peer's rank waits for a result only when there was one
            await send_message(writer, {"allreduce_done": True, "ok": "gbps" in got})
    value = got.get("gbps")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value), "", "", 2 * nbytes * 6  # 1 warm-up + 5 timed, each way
    if "skipped" in got:
        return None, f"this node: {str(got['skipped'])[:300]}", "", 0
    return None, "", f"all-reduce step: {str(got.get('error', got))[:300]}", 0


def _is_secret(value: object) -> bool:
    """The rendezvous secret of an offer: :data:`SECRET_HEX` lowercase hex digits."""
    return isinstance(value, str) and len(value) == SECRET_HEX and all(c in "0123456789abcdef" for c in value)
