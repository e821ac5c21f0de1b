"""Asking a rank for its flight recorder (issue #33): the trainer protocol's ``dump_flight`` / ``flight``.

What: :class:`FlightDesk` sends one rank a ``dump_flight`` request over its connection and waits,
bounded, for the ``flight`` answer naming the file the rank wrote (:mod:`ftd.client.flight`), then
reads that file as safely as a root daemon must read a file a user's process named:

* opened with ``O_NOFOLLOW`` (a symlink planted in its place is refused), non-blocking (a FIFO is
  refused, never waited on), and checked after opening: a regular file, owned by the uid the rank's
  connection was made with (``SO_PEERCRED``), at most :data:`MAX_FLIGHT_BYTES`;
* removed after reading (the rank made it for this request only).

Why a desk of its own: the server (:mod:`ftd.agent.local_api.server`) keeps connections and delivery;
a request/answer exchange with one rank is a separate job with its own pending state.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import stat
from collections.abc import Callable

from ftd.agent.local_api import wire
from ftd.agent.local_api.state import Conn
from ftd.client import protocol
from ftd.logs import get_logger

log = get_logger(__name__)

__all__ = ["MAX_FLIGHT_BYTES", "FlightAnswer", "FlightDesk", "read_rank_file"]

MAX_FLIGHT_BYTES = 8 << 20
"""A flight-recorder dump larger than this is not read."""

FlightAnswer = tuple[bytes | None, str]
"""(the dump's bytes, '') or (None, why not)."""


def read_rank_file(path: str, uid: int | None, limit: int = MAX_FLIGHT_BYTES) -> FlightAnswer:
    """Read a file a rank named (see the module docstring); never raises, never follows a link."""
    if not os.path.isabs(path):
        return None, f"{path!r} is not an absolute path"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return None, f"cannot open {path}: {exc.strerror or exc}"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, f"{path} is not a regular file"
        if uid is not None and info.st_uid != uid:
            return None, f"{path} is owned by uid {info.st_uid}, not the rank's {uid}"
        if info.st_size > limit:
            return None, f"{path}: {info.st_size} bytes, over the limit of {limit}"
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > limit:  # grew while read
                return None, f"{path}: over the limit of {limit} bytes"
            chunks.append(chunk)
    except OSError as exc:
        return None, f"cannot read {path}: {exc.strerror or exc}"
    finally:
        os.close(fd)
    try:
        os.unlink(path)  # made for this request only
    except OSError as exc:
        log.debug("flight_dump_not_removed", path=path, error=str(exc))
    return b"".join(chunks), ""


class FlightDesk:
    """Pending ``dump_flight`` requests, one future each, answered by the rank's ``flight`` line."""

    def __init__(self, send: Callable[[Conn, bytes], bool]) -> None:
        self._send = send
        self._ids = itertools.count(1)
        self._pending: dict[str, tuple[Conn, asyncio.Future[wire.FlightMsg]]] = {}
        self.unexpected = 0  # answers to nothing asked (late, or made up)

    async def ask(self, conn: Conn, timeout_s: float) -> FlightAnswer:
        """Ask ``conn``'s rank for its dump; its bytes, or why not. Bounded by ``timeout_s``."""
        request_id = f"f-{os.getpid()}-{next(self._ids)}"
        future: asyncio.Future[wire.FlightMsg] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = (conn, future)
        try:
            if not self._send(conn, wire.line(protocol.dump_flight(request_id))):
                return None, "the rank's connection is closed"
            try:
                async with asyncio.timeout(timeout_s):
                    answer = await future
            except TimeoutError:
                return None, f"no answer from the rank within {timeout_s:g}s (an older client?)"
        finally:
            self._pending.pop(request_id, None)
        if answer.path is None:
            return None, f"the rank made no dump: {answer.error or 'no reason given'}"
        uid = conn.cred.uid if conn.cred is not None else None
        return await asyncio.to_thread(read_rank_file, answer.path, uid)

    def answer(self, conn: Conn, msg: wire.FlightMsg) -> None:
        """A rank's ``flight`` line: resolves the request it answers, if this connection was asked."""
        pending = self._pending.get(msg.re)
        if pending is None or pending[0] is not conn or pending[1].done():
            self.unexpected += 1
            log.info("flight_answer_unexpected", job=conn.job, rank=conn.rank, re=msg.re)
            return
        pending[1].set_result(msg)
