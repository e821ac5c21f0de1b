"""Issue #20, item 8: bad input on a real agent's trainer socket gets the protocol's ``error``.

A real ``ftd agent`` (on the broker as shipped, :mod:`tests.e2e.shipped_stack`); a client connects
to its unix socket and sends a JSON line nested 60,000 deep (before the fix: ``RecursionError`` in
the protocol peek, a traceback in the agent's log and the connection dropped). The answer must be
one ``error`` line, the connection must stay open (a ``register`` on it is then accepted), and the
agent must log no traceback.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftd.client.protocol import MAX_LINE
from tests.e2e.daemons import Daemon
from tests.e2e.shipped_stack import agent_daemon, shipped_broker

pytestmark = [pytest.mark.real, pytest.mark.slow]

DEEP = 60_000


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[Daemon, str]]:
    with shipped_broker() as (broker, secrets):
        daemon, _kmsg, socket_path = agent_daemon(broker, secrets, tmp_path)
        daemon.start()
        try:
            daemon.wait_log("local_api_listening", timeout=30)
            yield daemon, socket_path
        finally:
            daemon.stop()
            print(f"----- agent log (tail)\n{daemon.log()[-4000:]}")


def read_line(sock: socket.socket) -> dict[str, object]:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(65536)
        assert chunk, f"the agent closed the connection (after {buf!r})"
        buf += chunk
    reply = json.loads(buf)
    assert isinstance(reply, dict)
    return reply


@pytest.mark.parametrize(
    "line",
    [
        b"[" * DEEP,  # the line: 60,000 deep (unterminated)
        b'{"op":"heartbeat","x":' + b"[" * (DEEP // 2) + b"]" * (DEEP // 2) + b"}",
        b'{"v":1,"op":"ack","directive_id":"d","x":'
        + b'{"a":' * (DEEP // 6)
        + b"1"
        + b"}" * (DEEP // 6)
        + b"}",
    ],
    ids=["deep-array", "deep-unknown-field", "deep-object"],
)
def test_deeply_nested_line_gets_an_error_and_the_connection_stays(
    agent: tuple[Daemon, str], line: bytes
) -> None:
    daemon, socket_path = agent
    assert len(line) <= MAX_LINE  # a line the agent reads in full: the nesting is the point
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(20)
        sock.connect(socket_path)
        sock.sendall(line + b"\n")
        reply = read_line(sock)
        assert reply["op"] == "error" and isinstance(reply["error"], str) and reply["error"], reply
        # The connection is still served: a register on it is answered.
        sock.sendall(b'{"v":1,"op":"register","job":"j1","rank":0}\n')
        assert read_line(sock) == {"v": 1, "op": "ok", "re": "register"}
    assert "Traceback" not in daemon.log() and "RecursionError" not in daemon.log()
