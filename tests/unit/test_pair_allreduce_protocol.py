"""The all-reduce step's protocol on loopback (ftd/agent/pair_tests): refusals, plumbing and bounds.

Real sockets and real rank processes, but no torch: each side's rank interpreter
(``agent.pair_tests.allreduce_python``) is a small shell script that plays one rank's part (prints
the line a rank prints, or hangs, or says nothing useful), so each case runs in about a second. What
is checked: the request's ``allreduce`` field is covered by the HMAC and validated; the ranks get the
test's own address, the smaller side's bytes and ``GLOO_SOCKET_IFNAME`` of the interface holding
that address; a rank that skips is a skip, one that fails or says nonsense fails the test (never a
pass); a rank that hangs is ended with its whole process group at the step's deadline, and the server
serves no other bulk test meanwhile. The real gloo all-reduce is in
tests/integration/test_pair_allreduce.py.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from ftd.agent.addresses import interface_with
from ftd.agent.pair_tests.allreduce import AllReduceStep
from ftd.agent.pair_tests.client import PairPeer, run_pair_test
from ftd.agent.pair_tests.server import PairTestServer
from ftd.agent.pair_tests.wire import (
    GREETING,
    NONCE_BYTES,
    ROUNDS,
    mac,
    read_chunks,
    read_message,
    send_message,
    write_chunks,
)
from ftd.fabric.pairs import PairExpectation, PairResult, judge_pair

KEY = b"allreduce-protocol-key"
MB = 1 << 20


def _rank(tmp_path: Path, name: str, body: str) -> str:
    """A fake rank interpreter: ``$0 RANK_FILE --rank R ...``; it logs its pid, args and gloo's
    interface to ``<name>.log`` and then runs ``body``."""
    log = tmp_path / f"{name}.log"
    script = tmp_path / name
    script.write_text(
        "#!/bin/sh\n"
        f'echo "pid $$" >> {log}\n'
        f'echo "args $*" >> {log}\n'
        f'echo "ifname ${{GLOO_SOCKET_IFNAME:-}}" >> {log}\n'
        f'echo "secret ${{FTD_ALLREDUCE_SECRET:-}}" >> {log}\n'
        f"{body}\n"
    )
    script.chmod(0o755)
    return str(script)


def _log(tmp_path: Path, name: str) -> dict[str, list[str]]:
    path = tmp_path / f"{name}.log"
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        key, _, value = line.partition(" ")
        out.setdefault(key, []).append(value)
    return out


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: only its parent's wait is missing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone, or gone while being read
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _gone(pid: int, name: str) -> None:
    """``pid`` ends within a second (a SIGKILL is delivered, not awaited, by ``kill``)."""
    deadline = time.monotonic() + 1.0
    while _alive(pid):
        assert time.monotonic() < deadline, f"{name} left running"
        time.sleep(0.02)


async def _pair(
    server_step: AllReduceStep | None,
    client_step: AllReduceStep | None,
    *,
    max_seconds: float = 10.0,
    timeout_s: float = 10.0,
) -> tuple[PairResult, PairTestServer]:
    server = PairTestServer(
        node="srv", key=KEY, host="127.0.0.1", max_bytes=MB, max_seconds=max_seconds, allreduce=server_step
    )
    port = await server.start()
    try:
        result = await run_pair_test(
            PairPeer("srv", "127.0.0.1", port),
            node="cli",
            key=KEY,
            max_bytes=MB,
            timeout_s=timeout_s,
            allreduce=client_step,
        )
        deadline = time.monotonic() + 10
        while server._active:  # the server's side of the test ends on its own (its rank stopped)
            assert time.monotonic() < deadline, "the server stayed busy after the test"
            await asyncio.sleep(0.02)
        return result, server
    finally:
        await server.close()


def test_the_ranks_get_the_tests_address_the_smaller_sides_bytes_and_the_loopback_interface(
    tmp_path: Path,
) -> None:
    rank0 = _rank(tmp_path, "rank0", "echo '{\"port\": 45678}'; exec sleep 30")
    rank1 = _rank(tmp_path, "rank1", 'echo \'{"gbps": 1.5, "bytes": 2097152}\'')
    result, server = asyncio.run(
        _pair(
            AllReduceStep(max_bytes=2 * MB, timeout_s=10.0, python=rank0),
            AllReduceStep(max_bytes=8 * MB, timeout_s=10.0, python=rank1),
        )
    )
    assert result.error == "" and result.allreduce_skipped == "", result
    assert result.allreduce_gbps == 1.5 and result.a_to_b_gbps and result.b_to_a_gbps
    assert server.served == 1 and server.refused == 0
    server_side, client_side = _log(tmp_path, "rank0"), _log(tmp_path, "rank1")
    args0, args1 = server_side["args"][0].split(), client_side["args"][0].split()
    assert args0[0].endswith("allreduce_rank.py") and args1[0].endswith("allreduce_rank.py")
    opts0, opts1 = (
        dict(zip(args0[1::2], args0[2::2], strict=True)),
        dict(zip(args1[1::2], args1[2::2], strict=True)),
    )
    assert opts0 == {**opts0, "--rank": "0", "--host": "127.0.0.1", "--port": "0", "--bytes": str(2 * MB)}
    assert opts1 == {**opts1, "--rank": "1", "--host": "127.0.0.1", "--port": "45678", "--bytes": str(2 * MB)}
    assert opts0["--timeout"] == "10" and opts1["--timeout"] == "10"
    assert server_side["ifname"] == ["lo"] and client_side["ifname"] == ["lo"]
    # the rendezvous secret: made by the server, the same on both sides, in the environment, not argv
    (secret,) = server_side["secret"]
    assert len(secret) == 32 and int(secret, 16) >= 0 and client_side["secret"] == [secret]
    assert secret not in server_side["args"][0] and secret not in client_side["args"][0]
    # the server's rank (still sleeping when the client said it was done) was ended with the test
    _gone(int(server_side["pid"][0]), "rank0")


def test_a_rank_without_torch_is_a_skip_and_the_step_off_on_the_server_is_a_skip() -> None:
    # the server's side skips: its own reason, named by its node, and the TCP figures stand
    async def both() -> tuple[PairResult, PairResult]:
        off, _ = await _pair(None, AllReduceStep(max_bytes=MB, timeout_s=5.0))
        zero, _ = await _pair(
            AllReduceStep(max_bytes=0, timeout_s=5.0), AllReduceStep(max_bytes=MB, timeout_s=5.0)
        )
        return off, zero

    off, zero = asyncio.run(both())
    for result in (off, zero):
        assert result.error == "" and result.allreduce_gbps is None, result
        assert result.allreduce_skipped == "srv: the all-reduce step is off here"
        assert result.a_to_b_gbps and result.b_to_a_gbps
        assert judge_pair(result, PairExpectation(expected_gbps=0.0001), None).status == "pass"


def test_a_server_rank_that_says_it_has_no_torch_is_a_skip(tmp_path: Path) -> None:
    rank0 = _rank(tmp_path, "rank0", 'echo \'{"skipped": "torch is not installed for /x/python"}\'')
    result, _ = asyncio.run(
        _pair(
            AllReduceStep(max_bytes=MB, timeout_s=5.0, python=rank0),
            AllReduceStep(max_bytes=MB, timeout_s=5.0),
        )
    )
    assert result.error == "" and result.allreduce_gbps is None
    assert result.allreduce_skipped == "srv: torch is not installed for /x/python"


@pytest.mark.parametrize(
    ("server_body", "client_body", "expected"),
    [
        # the server's rank fails before the rendezvous: the client hears why
        ('echo \'{"error": "RuntimeError: boom"}\'; exit 1', "exit 0", "srv: RuntimeError: boom"),
        # the server's rank says nonsense
        ("echo 'Segmentation fault'", "exit 0", "the all-reduce rank said b'Segmentation fault"),
        # a port no TCPStore can have: the client refuses the offer
        ("echo '{\"port\": 70000}'; exec sleep 30", "exit 0", "all-reduce offer malformed"),
        # the client's rank fails after the rendezvous
        (
            "echo '{\"port\": 45678}'; exec sleep 30",
            'echo \'{"error": "DistBackendError: connection reset"}\'; exit 1',
            "all-reduce step: DistBackendError: connection reset",
        ),
        # the client's rank ends without a result
        (
            "echo '{\"port\": 45678}'; exec sleep 30",
            "exit 9",
            "the all-reduce rank exited 9 without a result",
        ),
        # a figure that is no figure
        ("echo '{\"port\": 45678}'; exec sleep 30", "echo '{\"gbps\": -1}'", "all-reduce step:"),
    ],
)
def test_a_step_that_starts_and_does_not_complete_fails_the_test_never_a_pass(
    tmp_path: Path, server_body: str, client_body: str, expected: str
) -> None:
    rank0 = _rank(tmp_path, "rank0", server_body)
    rank1 = _rank(tmp_path, "rank1", client_body)
    result, _ = asyncio.run(
        _pair(
            AllReduceStep(max_bytes=MB, timeout_s=5.0, python=rank0),
            AllReduceStep(max_bytes=MB, timeout_s=5.0, python=rank1),
        )
    )
    assert expected in result.error, result
    assert result.allreduce_gbps is None
    assert judge_pair(result, PairExpectation(expected_gbps=0.0001), None).status == "failed"
    for name in ("rank0", "rank1"):
        for pid in _log(tmp_path, name).get("pid", []):
            _gone(int(pid), name)


def test_a_hanging_rank_is_killed_with_its_process_group_and_the_server_stays_exclusive(
    tmp_path: Path,
) -> None:
    # rank 0 never offers a port, and leaves a grandchild of its own: both must end at the deadline
    rank0 = _rank(tmp_path, "rank0", f'sleep 300 & echo "child $!" >> {tmp_path}/rank0.log; wait')

    async def main() -> tuple[PairResult, float, PairResult, PairTestServer]:
        server = PairTestServer(
            node="srv",
            key=KEY,
            host="127.0.0.1",
            max_bytes=MB,
            max_seconds=3.0,
            allreduce=AllReduceStep(max_bytes=MB, timeout_s=1.5, python=rank0),
        )
        port = await server.start()
        peer = PairPeer("srv", "127.0.0.1", port)
        try:
            started = time.monotonic()
            first = asyncio.create_task(
                run_pair_test(
                    peer,
                    node="cli",
                    key=KEY,
                    max_bytes=MB,
                    timeout_s=3.0,
                    allreduce=AllReduceStep(max_bytes=MB, timeout_s=1.5),
                )
            )
            while "child" not in _log(tmp_path, "rank0"):  # the step has begun
                await asyncio.sleep(0.05)
                assert time.monotonic() - started < 10, "the step never started"
            second = await run_pair_test(peer, node="other", key=KEY, max_bytes=MB, timeout_s=3.0)
            result = await first
            elapsed = time.monotonic() - started
            # the server gives up at its own bound (max_seconds + the step's), then kills the group
            deadline = time.monotonic() + 10
            while any(
                _alive(int(p)) for p in _log(tmp_path, "rank0")["pid"] + _log(tmp_path, "rank0")["child"]
            ):
                assert time.monotonic() < deadline, "the rank's process group outlived the step"
                await asyncio.sleep(0.1)
            while server._active:  # and the server is free again once it has reaped it
                assert time.monotonic() < deadline, "the server stayed busy after the step"
                await asyncio.sleep(0.05)
            return result, elapsed, second, server
        finally:
            await server.close()

    result, elapsed, second, server = asyncio.run(main())
    assert result.error == "timed out after 4.5 s", result
    assert result.allreduce_gbps is None
    assert 4.0 <= elapsed < 8.0, elapsed
    assert second.error == "WireError: refused: srv: already serving a pair test", second
    assert server.served == 0 and server.refused == 1


async def _raw_request(port: int, fields: dict[str, Any], mac_fields: dict[str, Any]) -> dict[str, Any]:
    """Handshake by hand: send ``fields`` with a MAC computed over ``mac_fields``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        hello = await reader.readexactly(len(GREETING) + NONCE_BYTES)
        server_nonce = hello[len(GREETING) :]
        client_nonce = os.urandom(NONCE_BYTES)
        proof = mac(KEY, "client", server_nonce, client_nonce, mac_fields)
        await send_message(writer, {**fields, "nonce": client_nonce.hex(), "mac": proof})
        return await read_message(reader)
    finally:
        writer.close()


def test_the_allreduce_field_is_covered_by_the_mac() -> None:
    """A man in the middle who raises the step's bytes (or turns it on) breaks the proof."""

    async def main() -> tuple[list[dict[str, Any]], PairTestServer]:
        server = PairTestServer(
            node="srv", key=KEY, host="127.0.0.1", allreduce=AllReduceStep(max_bytes=MB, timeout_s=5.0)
        )
        port = await server.start()
        try:
            signed = {"node": "cli", "bytes": 0, "pings": 1, "allreduce": 0}
            answers = [
                await _raw_request(port, {**signed, "allreduce": 1 << 30}, signed),
                await _raw_request(port, {"node": "cli", "bytes": 0, "pings": 1}, signed),
            ]
            return answers, server
        finally:
            await server.close()

    answers, server = asyncio.run(main())
    assert answers == [{"ok": False, "reason": "not authenticated"}] * 2
    assert server.refused == 2 and server.served == 0


@pytest.mark.parametrize("value", [True, -1, "8", 1.5, None, [1]])
def test_a_malformed_allreduce_field_is_refused_even_when_signed(value: object) -> None:
    async def main() -> tuple[dict[str, Any], PairTestServer]:
        server = PairTestServer(
            node="srv", key=KEY, host="127.0.0.1", allreduce=AllReduceStep(max_bytes=MB, timeout_s=5.0)
        )
        port = await server.start()
        try:
            fields = {"node": "cli", "bytes": MB, "pings": 1, "allreduce": value}
            return await _raw_request(port, fields, fields), server
        finally:
            await server.close()

    answer, server = asyncio.run(main())
    assert answer == {"ok": False, "reason": "bad request"}
    assert server.refused == 1 and server.served == 0


def test_interface_with_finds_the_interface_holding_an_address() -> None:
    assert interface_with("127.0.0.1") == "lo"
    assert interface_with("192.0.2.77") is None  # TEST-NET-1: held by no interface here
    assert interface_with("::1") is None and interface_with("not an address") is None


def test_a_step_asked_with_no_bulk_bytes_still_holds_the_server_for_one_test_at_a_time(
    tmp_path: Path,
) -> None:
    """An authenticated client asking 0 bytes (a probe's size) with the step must not get a second
    collective (or a bulk test) running beside one in progress: the step is a bulk test too."""
    rank0 = _rank(tmp_path, "rank0", "echo '{\"port\": 45678}'; exec sleep 30")

    async def step_only(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, dict[str, Any]]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        hello = await reader.readexactly(len(GREETING) + NONCE_BYTES)
        server_nonce, client_nonce = hello[len(GREETING) :], os.urandom(NONCE_BYTES)
        fields = {"node": "sly", "bytes": 0, "pings": 0, "allreduce": MB}
        proof = mac(KEY, "client", server_nonce, client_nonce, fields)
        await send_message(writer, {**fields, "nonce": client_nonce.hex(), "mac": proof})
        answer = await read_message(reader)
        if not answer.get("ok"):
            return reader, writer, answer
        loop = asyncio.get_running_loop()
        for _ in range(ROUNDS):
            await write_chunks(writer, 0, loop.time() + 1)
        await read_message(reader)  # the rounds
        await send_message(writer, {"seconds": 0})
        for _ in range(ROUNDS):
            await read_chunks(reader, 0)
        await send_message(writer, {"done": True})
        return reader, writer, await read_message(reader)  # the step's offer

    async def main() -> tuple[dict[str, Any], dict[str, Any], PairResult]:
        server = PairTestServer(
            node="srv",
            key=KEY,
            host="127.0.0.1",
            max_bytes=MB,
            max_seconds=5.0,
            allreduce=AllReduceStep(max_bytes=MB, timeout_s=5.0, python=rank0),
        )
        port = await server.start()
        try:
            reader, writer, offer = await step_only(port)  # its rank 0 now waits for a rank 1
            _, second_writer, second = await step_only(port)
            bulk = await run_pair_test(
                PairPeer("srv", "127.0.0.1", port), node="cli", key=KEY, max_bytes=MB, timeout_s=5.0
            )
            await send_message(writer, {"allreduce_done": True, "ok": False})
            await reader.read()
            for w in (writer, second_writer):
                w.close()
            return offer, second, bulk
        finally:
            await server.close()

    offer, second, bulk = asyncio.run(main())
    assert offer == {"allreduce_port": 45678, "bytes": MB, "secret": offer.get("secret")}, offer
    assert second == {"ok": False, "reason": "srv: already serving a pair test"}, second
    assert bulk.error == "WireError: refused: srv: already serving a pair test", bulk


def test_a_rank_python_that_cannot_start_fails_the_test_saying_which(tmp_path: Path) -> None:
    """``allreduce_python`` naming nothing runnable is a misconfiguration: the test fails (never a
    pass, never a silent skip) and says which Python on which side."""
    missing = str(tmp_path / "no-such-python")
    rank0 = _rank(tmp_path, "rank0", "echo '{\"port\": 45678}'; exec sleep 30")

    async def both() -> tuple[PairResult, PairResult]:
        server_side, _ = await _pair(
            AllReduceStep(max_bytes=MB, timeout_s=5.0, python=missing),
            AllReduceStep(max_bytes=MB, timeout_s=5.0),
        )
        client_side, _ = await _pair(
            AllReduceStep(max_bytes=MB, timeout_s=5.0, python=rank0),
            AllReduceStep(max_bytes=MB, timeout_s=5.0, python=missing),
        )
        return server_side, client_side

    server_side, client_side = asyncio.run(both())
    assert server_side.error.startswith(f"all-reduce step: srv: cannot start {missing}"), server_side
    assert client_side.error.startswith(f"all-reduce step: cannot start {missing}"), client_side
    for result in (server_side, client_side):
        assert judge_pair(result, PairExpectation(expected_gbps=0.0001), None).status == "failed"
    _gone(int(_log(tmp_path, "rank0")["pid"][0]), "rank0")
