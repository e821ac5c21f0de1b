"""Pingmesh: a small authenticated round trip to every peer in turn, at a low rate.

What: :func:`pingmesh` probes one peer every ``interval_s`` (round-robin over ``peers``), each probe a
pair test that moves no bulk data (``max_bytes=0``: the handshake and a few 8-byte pings), and
answers each probe's RTT or error. At the default rate (one probe every 10 s) an agent of a 16-node
fleet probes each peer every 2.5 minutes and spends well under 1% of a core on it (``ftd bench
fabric`` measures it); the matrix of RTTs shows a pair that stopped answering or slowed, which is
what sends the coordinator to a targeted bandwidth test and a bisection.
Why probes and not bandwidth: a mesh of bulk tests would cost the fabric what it measures.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ftd.agent.pair_tests.client import PairPeer, run_pair_test
from ftd.agent.pair_tests.server import Busy

__all__ = ["pingmesh", "probe"]


async def probe(
    peer: PairPeer, *, node: str, key: bytes, pings: int = 3, timeout_s: float = 2.0
) -> dict[str, Any]:
    """One pingmesh probe: ``{"peer", "rtt_ms"}`` or ``{"peer", "error"}``."""
    result = await run_pair_test(peer, node=node, key=key, max_bytes=0, timeout_s=timeout_s, pings=pings)
    if result.error:
        return {"peer": peer.node, "error": result.error}
    return {"peer": peer.node, "rtt_ms": result.rtt_ms}


async def pingmesh(
    peers: Sequence[PairPeer],
    *,
    node: str,
    key: bytes,
    interval_s: float = 10.0,
    seconds: float | None = None,
    busy: Busy | None = None,
) -> list[dict[str, Any]]:
    """Probe ``peers`` round-robin, one every ``interval_s``, for ``seconds`` (``None``: until cancelled).

    A node that is training (``busy``) skips its probes and says why: even a probe is traffic.
    """
    loop = asyncio.get_running_loop()
    end = None if seconds is None else loop.time() + seconds
    out: list[dict[str, Any]] = []
    turn = 0
    while peers and (end is None or loop.time() < end):
        started = loop.time()
        peer = peers[turn % len(peers)]
        turn += 1
        reason = busy() if busy is not None else None
        if reason is not None:
            out.append({"peer": peer.node, "skipped": reason})
        else:
            out.append(await probe(peer, node=node, key=key))
        delay = interval_s - (loop.time() - started)
        if end is not None:
            delay = min(delay, end - loop.time())
        if delay > 0:
            await asyncio.sleep(delay)
    return out
