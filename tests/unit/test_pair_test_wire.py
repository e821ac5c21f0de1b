"""The pair-test server and client on loopback (ftd/agent/pair_tests): authenticated, bounded, refusing.

Real sockets in one event loop, small transfers, no waits: a test with the right key measures both
directions and the RTT within its byte cap; a wrong key, a node that is training and a server that
refuses more bytes than it allows each end as an error, never a measurement.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from ftd.agent.pair_tests.client import PairPeer, run_pair_test
from ftd.agent.pair_tests.server import PairTestServer
from ftd.agent.pair_tests.wire import GREETING, NONCE_BYTES, read_message, send_message

KEY = b"fleet-pair-test-key"
MB = 1024 * 1024


async def _with_server(body, **kw):  # type: ignore[no-untyped-def]
    server = PairTestServer(node="srv", key=KEY, host="127.0.0.1", **kw)
    port = await server.start()
    try:
        return await body(server, PairPeer(node="srv", host="127.0.0.1", port=port))
    finally:
        await server.close()


def test_a_pair_test_measures_each_direction_and_the_rtt_within_its_byte_cap() -> None:
    async def body(server: PairTestServer, peer: PairPeer):  # type: ignore[no-untyped-def]
        return await run_pair_test(peer, node="cli", key=KEY, max_bytes=2 * MB, timeout_s=20.0), server

    result, server = asyncio.run(_with_server(body))
    assert not result.error, result.error
    assert result.a == "cli" and result.b == "srv"
    assert result.a_to_b_gbps is not None and result.a_to_b_gbps > 0
    assert result.b_to_a_gbps is not None and result.b_to_a_gbps > 0
    assert result.rtt_ms is not None and result.rtt_ms >= 0
    assert 0 < result.bytes_moved <= 2 * 2 * MB
    assert server.served == 1 and server.refused == 0
    assert json.loads(json.dumps(result.as_dict()))["a_to_b_gbps"] == result.a_to_b_gbps


def test_the_server_caps_the_bytes_at_its_own_limit() -> None:
    async def body(server: PairTestServer, peer: PairPeer):  # type: ignore[no-untyped-def]
        return await run_pair_test(peer, node="cli", key=KEY, max_bytes=8 * MB, timeout_s=20.0)

    result = asyncio.run(_with_server(body, max_bytes=1 * MB))
    assert not result.error and result.bytes_moved <= 2 * MB


@pytest.mark.parametrize(
    ("client_key", "busy", "expected"),
    [
        (b"someone-else", None, "not authenticated"),
        (KEY, "training: job 42", "srv: training: job 42"),
    ],
)
def test_a_stranger_or_a_training_node_is_refused_before_any_data_moves(
    client_key: bytes, busy: str | None, expected: str
) -> None:
    async def body(server: PairTestServer, peer: PairPeer):  # type: ignore[no-untyped-def]
        return await run_pair_test(peer, node="cli", key=client_key, max_bytes=MB, timeout_s=20.0), server

    result, server = asyncio.run(_with_server(body, busy=lambda: busy))
    assert expected in result.error and result.bytes_moved == 0 and result.a_to_b_gbps is None
    assert server.refused == 1 and server.served == 0


def test_a_client_on_a_training_node_does_not_start() -> None:
    async def body(server: PairTestServer, peer: PairPeer):  # type: ignore[no-untyped-def]
        return await run_pair_test(peer, node="cli", key=KEY, busy=lambda: "training: job 7"), server

    result, server = asyncio.run(_with_server(body))
    assert result.error == "cli: training: job 7" and server.served == 0 and server.refused == 0


def test_a_server_that_cannot_prove_the_key_is_not_trusted() -> None:
    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(GREETING + bytes(NONCE_BYTES))
        await writer.drain()
        await read_message(reader)
        await send_message(writer, {"ok": True, "node": "srv", "bytes": MB, "mac": "00" * 32})
        await reader.read()
        writer.close()

    async def main():  # type: ignore[no-untyped-def]
        server = await asyncio.start_server(impostor, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            return await run_pair_test(
                PairPeer("srv", "127.0.0.1", port), node="cli", key=KEY, timeout_s=20.0
            )
        finally:
            server.close()

    result = asyncio.run(main())
    assert "server not authenticated" in result.error and result.bytes_moved == 0


def test_nothing_listening_is_an_error_not_a_result() -> None:
    async def main():  # type: ignore[no-untyped-def]
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        return await run_pair_test(PairPeer("srv", "127.0.0.1", port), node="cli", key=KEY, timeout_s=5.0)

    result = asyncio.run(main())
    assert result.error and result.a_to_b_gbps is None
