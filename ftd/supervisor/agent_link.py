"""The supervisor's connection to its node's agent: ``supervise``, state updates, directives in.

What: :class:`AgentLink`, a daemon thread that connects to the agent's socket, says ``supervise``
with the supervisor's current state, reads the directives the agent pushes (``restart``, ``stop``)
into :attr:`AgentLink.directives`, and reconnects with backoff (0.1 s doubling to 2 s) whenever the
connection drops: the agent restarting must not end the job's supervision. :meth:`AgentLink.update`
sends a new state (the latest is also what a reconnect says), :meth:`AgentLink.goodbye` sends the
final ``exited`` and closes. Fail-open like the client: an agent that cannot be reached is said once
on the log and retried in the background. Why apart: the socket and its thread stay out of the
supervisor's loop, which only reads a queue.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import socket
import threading

from ftd.client import protocol

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["AgentLink"]

_log = logging.getLogger("ftd.supervisor")
_IO_TIMEOUT_S = 5.0


class AgentLink:
    """Supervise ``job`` at the agent listening on ``path`` (pid ``pid``), starting from ``info``."""

    def __init__(self, path: str, job: str, pid: int, info: dict[str, Any]) -> None:
        self.path, self.job, self.pid = path, job, pid
        self.directives: queue.Queue[dict[str, Any]] = queue.Queue()
        self.node: str | None = None  # the agent's node name, once it answered
        self.connected = threading.Event()
        self._info = dict(info)
        self._lock = threading.Lock()  # one writer at a time on the socket
        self._sock: socket.socket | None = None
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ftd-run-agent-link", daemon=True)
        self._thread.start()

    def update(self, info: dict[str, Any]) -> None:
        """Report a new state (sent now when connected; a reconnect says the latest)."""
        with self._lock:
            self._info = dict(info)
            self._send_locked(protocol.supervisor_state(self._info))

    def goodbye(self, info: dict[str, Any], wait_s: float = 2.0) -> None:
        """The final state (``exited``) and close: the agent takes it as a clean goodbye."""
        if not self.connected.is_set():
            self.connected.wait(min(wait_s, 0.5))  # a link still connecting gets to say it
        with self._lock:
            self._info = dict(info)
            self._send_locked(protocol.supervisor_state(self._info))
            self._closed.set()
            sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def close(self) -> None:
        """Close without a goodbye (tests; a supervisor that dies is closed by the kernel)."""
        self._closed.set()
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def _send_locked(self, msg: Any) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            sock.sendall(protocol.encode(msg))
        except OSError as exc:
            _log.warning("ftd run: lost the agent connection while sending (%s): reconnecting", exc)
            with contextlib.suppress(OSError):
                sock.close()
            self._sock = None
            self.connected.clear()

    def _run(self) -> None:
        delay = 0.1
        while not self._closed.is_set():
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            was_up = False
            try:
                sock.settimeout(_IO_TIMEOUT_S)
                sock.connect(self.path)
                reader = sock.makefile("rb")
                with self._lock:
                    if self._closed.is_set():
                        return
                    said = self._info
                    sock.sendall(protocol.encode(protocol.supervise(self.job, self.pid, said)))
                answer = protocol.decode(reader.readline())
                if answer is None or answer.get("op") != protocol.OK:
                    why = (answer or {}).get("error", "no answer")
                    raise ConnectionError(f"the agent refused supervise: {why}")
                self.node = str(answer.get("node") or "") or self.node
                with self._lock:
                    self._sock = sock
                    if self._info is not said:  # a state change while the agent was answering
                        self._send_locked(protocol.supervisor_state(self._info))
                self.connected.set()
                was_up, delay, self._warned = True, 0.1, False
                _log.info("ftd run: supervising job %s at the agent of node %s", self.job, self.node)
                sock.settimeout(None)
                for line in reader:
                    msg = protocol.decode(line)
                    if msg is None:
                        continue
                    if msg.get("op") == protocol.DIRECTIVE:
                        self.directives.put(msg)
                    elif msg.get("op") == protocol.ERROR:
                        _log.warning("ftd run: the agent answered an error: %s", msg.get("error"))
            except (OSError, ConnectionError) as exc:
                if not self._closed.is_set() and not self._warned:
                    self._warned = True
                    _log.warning(
                        "ftd run: cannot reach the ftd agent at %s (%s); retrying in the background",
                        self.path,
                        exc,
                    )
            finally:
                self.connected.clear()
                with self._lock:
                    if self._sock is sock:
                        self._sock = None
                with contextlib.suppress(OSError):
                    sock.close()
            if was_up and not self._closed.is_set():
                _log.warning("ftd run: the agent connection closed; reconnecting")
            if self._closed.wait(delay):
                return
            delay = min(delay * 2, 2.0)
