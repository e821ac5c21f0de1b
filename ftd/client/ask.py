"""One question to the node's agent over its local socket, one answer, under one deadline.

What: :func:`ask` sends one message of :mod:`ftd.client.protocol` and reads the one-line answer;
:func:`ask_conditions` is the ``conditions`` query (the node's active critical conditions), with its
answer's shape checked. Both raise ``OSError``, ``TimeoutError`` or ``ValueError`` and never retry:
the caller decides what an unreachable agent means.

Why here: the short-lived node hooks (``ftd slurm prolog/epilog``, ``ftd health``) and the benchmark
that times them (:mod:`ftd.bench.health`) ask the agent the same way; keeping the exchange beside the
protocol it speaks lets the benchmark use it without importing the commands. Standard library and
the protocol only, so a hook that imports it still starts in a few tens of milliseconds.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping
from typing import Any

from ftd.client import protocol

__all__ = ["ask", "ask_conditions"]


def ask(socket_path: str, message: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """Send one hook message and read the one-line answer; raises OSError/TimeoutError/ValueError."""
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        sock.sendall(protocol.encode(message))
        buf = b""
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer from the agent within {timeout:g} s")
            sock.settimeout(left)
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("the agent closed the connection without an answer")
            buf += chunk
            if len(buf) > 4 * protocol.MAX_LINE:
                raise ValueError("answer too long")
    reply = protocol.decode(buf.split(b"\n", 1)[0])
    if reply is None:
        raise ValueError("the agent's answer is not a JSON object")
    return reply


def ask_conditions(path: str, timeout: float) -> dict[str, Any]:
    """The agent's answer to ``conditions``; raises OSError/TimeoutError/ValueError."""
    reply = ask(path, protocol.query(protocol.CONDITIONS), timeout)
    if reply.get("op") != protocol.CONDITIONS or not isinstance(reply.get("conditions"), list):
        raise ValueError(f"unexpected answer from the agent: {str(reply)[:200]}")
    return reply
