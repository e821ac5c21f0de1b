"""The all-reduce step's rendezvous under the test's secret: a stranger cannot take a rank's place.

Rank 0's ``TCPStore`` listens on the pair test's address for the step's length, and a store has no
authentication: anyone who reaches its port can join. Real rank processes (torch 2.13, gloo on CPU,
loopback): a stranger that joins rank 0's store first, as rank 1, before the real rank 1 --
without the secret it takes the real rank's place (the control: rank 0 all-reduces with the
stranger, which is why the secret exists); with the secret the pair's keys live under a prefix only
the two ranks know (the server made it, the client got it over the authenticated test connection),
so the stranger finds nothing and fails while the real pair completes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from ftd.agent.pair_tests.allreduce import RANK_FILE, SECRET_ENV

pytest.importorskip("torch")

MB = 1 << 20


@contextmanager
def _rank(rank: int, port: int, secret: str, timeout: float) -> Iterator[subprocess.Popen[str]]:
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    if secret:
        env[SECRET_ENV] = secret
    args = ["--rank", str(rank), "--host", "127.0.0.1", "--port", str(port), "--bytes", str(MB)]
    proc = subprocess.Popen(
        [sys.executable, RANK_FILE, *args, "--timeout", f"{timeout:g}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**env, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def _lines(proc: subprocess.Popen[str], within: float) -> list[Any]:
    out, _ = proc.communicate(timeout=within)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _stranger_then_real(secret: str, *, read_real: bool) -> tuple[list[Any], list[Any], list[Any]]:
    """Rank 0 under ``secret``; a stranger (no secret) joins as rank 1 first; then the real rank 1.
    The lines of rank 0, the stranger and (``read_real``) the real rank 1, each as it ended."""
    with _rank(0, 0, secret, 20.0) as zero:
        assert zero.stdout is not None
        port = int(json.loads(zero.stdout.readline())["port"])
        with _rank(1, port, "", 8.0) as stranger:
            time.sleep(2.5)  # the stranger has imported torch and joined the store by now
            with _rank(1, port, secret, 20.0) as real:
                real_lines = _lines(real, 60) if read_real else []
                return _lines(zero, 60), _lines(stranger, 60), real_lines


def test_with_the_secret_a_stranger_on_the_store_cannot_take_the_real_ranks_place() -> None:
    started = time.monotonic()
    zero, stranger, real = _stranger_then_real(os.urandom(16).hex(), read_real=True)
    assert "gbps" in zero[-1] and "gbps" in real[-1], (zero, real)
    assert "error" in stranger[-1] and "gbps" not in stranger[-1], stranger
    assert time.monotonic() - started < 60


def test_control_without_the_secret_the_stranger_takes_the_real_ranks_place() -> None:
    """Why the secret: with none, the stranger that joined first all-reduces with rank 0 (the real
    rank 1, shut out, is ended here rather than waited for)."""
    zero, stranger, _ = _stranger_then_real("", read_real=False)
    assert "gbps" in zero[-1], zero
    assert "gbps" in stranger[-1], stranger
