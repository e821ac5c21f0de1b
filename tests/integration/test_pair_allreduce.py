"""The all-reduce step of a pair test (issue #35) and the server's handshake bounds, on real parts.

Real processes throughout: the pair-test server and client each a ``python -m ftd.agent.pair_tests``
process, each side's rank a process of its own running a real 2-rank gloo all-reduce (torch 2.13 on
CPU); a Python without torch for the skip; real network namespaces with one node's egress shaped by
``tc tbf`` for a slow pair's collective.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftd.agent.pair_tests.allreduce import RANK_FILE
from ftd.agent.pair_tests.client import PairPeer, run_pair_test
from ftd.agent.pair_tests.server import HANDSHAKE_S, MAX_UNAUTHENTICATED, PairTestServer
from ftd.bench.netns_fleet import NetnsFleet, available
from ftd.fabric.pairs import PairExpectation, PairResult, judge_pair

pytest.importorskip("torch")

MB = 1 << 20
NO_TORCH_PYTHON = "/usr/bin/python3"  # Debian's: no torch


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "pair.key"
    path.write_text("allreduce-test-key\n")
    path.chmod(0o600)
    return path


def _module(*args: str) -> list[str]:
    return [sys.executable, "-m", "ftd.agent.pair_tests", *args]


@pytest.fixture
def server(key: Path) -> Iterator[int]:
    """A real pair-test server process with the all-reduce step (8 MiB at most) on 127.0.0.1."""
    proc = subprocess.Popen(
        _module(
            "serve",
            "--node",
            "b",
            "--key-file",
            str(key),
            "--host",
            "127.0.0.1",
            "--allreduce-bytes",
            str(8 * MB),
            "--allreduce-timeout",
            "90",
        ),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    port = int(json.loads(proc.stdout.readline())["port"])
    yield port
    proc.terminate()
    proc.wait(30)


def _run(port: int, key: Path, *extra: str) -> PairResult:
    out = subprocess.run(
        _module(
            "run",
            "--node",
            "a",
            "--peer-node",
            "b",
            "--peer",
            f"127.0.0.1:{port}",
            "--key-file",
            str(key),
            "--max-bytes",
            str(2 * MB),
            "--timeout",
            "10",
            "--allreduce-timeout",
            "90",
            *extra,
        ),
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    return PairResult.from_dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _rank_processes() -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    return [line for line in ps.splitlines() if RANK_FILE in line]


def _no_rank_left() -> None:
    """Every rank process ended: the client's at once, the server's once the client said it is done."""
    deadline = time.monotonic() + 30
    while _rank_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _rank_processes() == []


def test_a_real_gloo_all_reduce_between_two_agent_processes(server: int, key: Path) -> None:
    result = _run(server, key, "--allreduce-bytes", str(4 * MB))
    assert result.error == "" and result.allreduce_skipped == "", result
    assert result.allreduce_gbps is not None and result.allreduce_gbps > 0.01, result
    assert result.bytes_moved >= 2 * 4 * MB * 6, (
        "the step's bytes are counted (1 warm-up + 5 timed, each way)"
    )
    _no_rank_left()
    # judged like the directions: against the profile's all-reduce expectation (the pair, no sender)
    spec = PairExpectation(expected_gbps=0.001, expected_allreduce_gbps=1000.0)
    verdict = judge_pair(result, spec, None)
    assert verdict.status == "slow" and verdict.slow_senders == () and "all-reduce" in verdict.reasons[-1]
    fine = PairExpectation(expected_gbps=0.001, expected_allreduce_gbps=result.allreduce_gbps / 2)
    assert judge_pair(result, fine, None).status == "pass"


def test_no_step_asked_or_no_torch_is_a_skip_with_its_reason_never_a_measurement(
    server: int, key: Path
) -> None:
    plain = _run(server, key)  # no --allreduce-bytes: not asked
    assert plain.error == "" and plain.allreduce_gbps is None and "not asked" in plain.allreduce_skipped
    bare = _run(server, key, "--allreduce-bytes", str(MB), "--allreduce-python", NO_TORCH_PYTHON)
    assert bare.error == "" and bare.allreduce_gbps is None, bare
    assert bare.allreduce_skipped.startswith("this node: torch is not installed"), bare.allreduce_skipped
    _no_rank_left()


def test_a_step_that_starts_and_fails_fails_the_test_and_kills_both_ranks(
    server: int, key: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    result = _run(server, key, "--allreduce-bytes", str(MB), "--allreduce-python", str(broken))
    assert "all-reduce step: the all-reduce rank exited 3 without a result" in result.error, result
    assert judge_pair(result, PairExpectation(expected_gbps=0.001), None).status == "failed"
    _no_rank_left()


def test_silent_connections_are_capped_and_timed_out_and_a_real_test_is_still_served() -> None:
    async def main() -> tuple[list[bytes], bytes, PairResult, int]:
        server = PairTestServer(node="b", key=b"k", host="127.0.0.1", max_seconds=30.0)
        port = await server.start()
        silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(MAX_UNAUTHENTICATED)]
        await asyncio.sleep(0.2)
        extra_reader, extra_writer = await asyncio.open_connection("127.0.0.1", port)
        extra = await asyncio.wait_for(extra_reader.read(), 5)  # closed at once, nothing said
        greetings = [await asyncio.wait_for(r.readexactly(24), 5) for r, _ in silent]
        # the handshakes time out, well before the test's own 30 s bound
        closed = [await asyncio.wait_for(r.read(), HANDSHAKE_S + 5) for r, _ in silent]
        result = await run_pair_test(PairPeer("b", "127.0.0.1", port), node="a", key=b"k", max_bytes=MB)
        for _, w in [*silent, (extra_reader, extra_writer)]:
            w.close()
        refused = server.refused
        await server.close()
        return greetings, extra + b"".join(closed), result, refused

    greetings, leftover, result, refused = asyncio.run(main())
    assert all(g.startswith(b"FTDPAIR1") for g in greetings) and leftover == b""
    assert refused == 1 and result.error == "" and result.a_to_b_gbps, result


def test_a_shaped_nodes_all_reduce_is_slow_between_real_namespaces() -> None:
    why = available()
    if why:
        pytest.skip(why)
    if shutil.which("tc") is None:
        pytest.skip("tc is not installed")
    with NetnsFleet(3, max_bytes=4 * MB, timeout_s=15.0, allreduce_bytes=4 * MB) as fleet:
        a, b, c = fleet.nodes
        request = {**fleet.test_request(b), "allreduce_bytes": 4 * MB, "timeout": 15.0}
        fleet.ask(a, request)
        clean = PairResult.from_dict(fleet.answer(a, 150.0))
        fleet.degrade(c, "20mbit")
        fleet.ask(c, {**fleet.test_request(b), "allreduce_bytes": 4 * MB, "timeout": 15.0})
        shaped = PairResult.from_dict(fleet.answer(c, 150.0))
    assert clean.error == "" and clean.allreduce_gbps is not None, clean
    assert shaped.allreduce_gbps is not None, shaped
    # 20 Mbit/s is 0.02 Gbit/s; the clean namespaces' all-reduce moves gigabits here
    assert shaped.allreduce_gbps < 0.05 < clean.allreduce_gbps / 4, (clean, shaped)
    spec = PairExpectation(expected_gbps=None, expected_allreduce_gbps=clean.allreduce_gbps)
    assert judge_pair(shaped, spec, clean.a_to_b_gbps).status == "slow"
