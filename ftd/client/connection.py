"""The client's I/O thread: connect to the agent's socket, register, pump directives, beats and acks.

What: :class:`Connection`, the part of :class:`~ftd.client.Client` that runs on its one daemon
thread: it connects (and reconnects with backoff, forever), registers the rank, reads pushed
directives into the shared state, sends at most one heartbeat per ``heartbeat_interval`` (only if
the loop called ``heartbeat()`` since), flushes queued acks and nacks saves past their deadline.
Why apart: all socket I/O lives here, so the per-step calls never block; and this is where
fail-open is enforced (nothing raised here reaches training code; the first failure to reach the
agent is said once on stderr, with a hint).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
import sys
import threading
import time

from ftd.client import flight, protocol
from ftd.client.directive import DEADLINE_REASON, DirectiveInfo, save_at
from ftd.client.files import write_step
from ftd.client.state import RankState

TYPE_CHECKING = False  # not imported from typing: keeps `import ftd.client` light
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Connection"]

_log = logging.getLogger("ftd.client")
_MAX_BUFFER = 1024 * 1024
_MAX_SEEN = 4096
_IO_TIMEOUT_S = 2.0
_REGISTER_TIMEOUT_S = 5.0
_UNREACHABLE_HINTS = {
    errno.EACCES: "permission denied (EACCES): ask the admin to set agent.socket_group to a group "
    "you are in (the socket is mode 0660)",
    errno.ENOENT: "no socket there (ENOENT): is ftd-agent running on this node? (or set FTD_SOCKET)",
    errno.ECONNREFUSED: "nothing is listening (ECONNREFUSED): ftd-agent is stopped or restarting",
}


class _Rejected(Exception):
    """The agent refused our registration: retry later, quietly."""


class Connection(RankState):
    """The I/O thread's side of a client (started by :meth:`ftd.client.Client.start`)."""

    flight_dir: str | None = None
    """Where a flight-recorder dump for the agent is written (None: the temporary directory)."""

    if TYPE_CHECKING:

        def _answer(
            self,
            *,
            ok: bool,
            step: int | None,
            path: str | None,
            reason: str,
            only: list[str] | None = None,
        ) -> None: ...

    def _wake(self) -> None:
        wake_w = self._wake_w
        if wake_w is not None:
            with contextlib.suppress(OSError):  # full (a wake is pending anyway) or closed
                wake_w.send(b"\0")

    def _run(self, wake_r: socket.socket, wake_w: socket.socket) -> None:
        delay = 0.05
        while not self._closed.is_set():
            sock: socket.socket | None = None
            registered_at: float | None = None
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(_IO_TIMEOUT_S)
                sock.connect(self.socket_path)
                registered_at = self._session(sock, wake_r)
            except _Rejected as exc:
                self._warn_once(f"agent refused registration: {exc}")
                self._tell_stderr(f"the ftd agent at {self.socket_path} refused this rank: {exc}")
                delay = max(delay, self.retry_interval * 10)  # a refusal does not pass by itself
            except OSError as exc:
                self._warn_once(f"agent not reachable at {self.socket_path}: {exc}")
                hint = _UNREACHABLE_HINTS.get(exc.errno or 0, str(exc))
                self._tell_stderr(f"cannot reach the ftd agent at {self.socket_path}: {hint}")
            except Exception:  # a bug here must never reach the training loop
                _log.exception("ftd client: I/O thread error; reconnecting")
            finally:
                self._connected = False
                if sock is not None:
                    with contextlib.suppress(Exception):
                        sock.close()
            if registered_at is not None:
                delay = 0.05  # we were connected: the agent restarted, come back quickly
            if self._closed.wait(delay):
                break
            delay = min(delay * 2, self.retry_interval)
        for wake in (wake_r, wake_w):
            with contextlib.suppress(Exception):
                wake.close()

    def _tell_stderr(self, message: str) -> None:
        """One line on stderr, once per Client: training goes on without ftd (fail-open), but the
        person running it learns that the job is unprotected and what to do about it."""
        if self._told_stderr:
            return
        self._told_stderr = True
        with contextlib.suppress(Exception):
            sys.stderr.write(
                f"ftd client: {message}. This job is NOT protected by ftd (no save/stop on node faults); "
                "training continues and the client keeps retrying in the background.\n"
            )
            sys.stderr.flush()

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            _log.info("ftd client: %s; training continues, retrying in the background", message)
        else:
            _log.debug("ftd client: %s", message)

    def _session(self, sock: socket.socket, wake_r: socket.socket) -> float | None:
        """One connection: register, then pump reads, heartbeats and acks until it breaks.

        Returns the time registration succeeded (None if it never did)."""
        sock.sendall(
            protocol.encode(
                protocol.register(
                    self.job,
                    self.rank,
                    self.local_rank,
                    os.getpid(),
                    self.run,
                    self.startup_timeout_s,
                    self.checkpoint_dir,
                    self.fallback_checkpoint_dir,
                )
            )
        )
        started = time.monotonic()
        registered: float | None = None
        buf = b""
        next_beat = 0.0
        while True:
            now = time.monotonic()
            if registered is None:
                if now - started > _REGISTER_TIMEOUT_S:
                    raise OSError("no answer to register")
                timeout = 0.1
            else:
                timeout = max(0.0, next_beat - now)
            readable, _, _ = select.select([sock, wake_r], [], [], timeout)
            if wake_r in readable:
                with contextlib.suppress(OSError):
                    wake_r.recv(4096)
            if sock in readable:
                data = sock.recv(65536)
                arrived = time.perf_counter_ns()
                if not data:
                    return registered
                buf += data
                while (nl := buf.find(b"\n")) >= 0:
                    line, buf = buf[:nl], buf[nl + 1 :]
                    if self._on_line(line, arrived) and registered is None:
                        registered = time.monotonic()
                        self._connected = True
                        self._warned = False
                        _log.debug("ftd client: registered job=%s rank=%s", self.job, self.rank)
                if len(buf) > _MAX_BUFFER:
                    raise OSError("agent sent an over-long line")
            if registered is not None:
                while self._outbox:
                    sock.sendall(self._outbox[0])
                    self._outbox.popleft()
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + self.heartbeat_interval
                    self._nack_overdue()
                    if self._beat:
                        self._beat = False
                        sock.sendall(protocol.encode(protocol.heartbeat(self._step, self._clock.snapshot())))
            if self._closed.is_set():
                return registered

    def _nack_overdue(self) -> None:
        """Nack every save directive still unanswered past its ``deadline_s``."""
        if not self._saves:
            return
        now = time.perf_counter_ns()
        with self._lock:
            overdue = [
                did
                for did, info in self._saves.items()
                if info.deadline_s is not None and now - info.received_ns > info.deadline_s * 1e9
            ]
        if overdue:
            _log.warning("ftd client: %s: nacking %s", DEADLINE_REASON, ", ".join(overdue))
            self._answer(ok=False, step=self._step, path=None, reason=DEADLINE_REASON, only=overdue)

    def _on_line(self, line: bytes, arrived_ns: int) -> bool:
        """Handle one message from the agent; True if it accepted our registration."""
        msg = protocol.decode(line)
        if msg is None:
            _log.debug("ftd client: ignoring a line from the agent that is not a JSON object")
            return False
        op = msg.get("op")
        if op == protocol.DIRECTIVE:
            self._on_directive(msg, arrived_ns)
        elif op == protocol.OK and msg.get("re") == protocol.REGISTER:
            return True
        elif op == protocol.PARTNERS:
            partners = msg.get("partners")
            if isinstance(partners, dict) and msg.get("job") in (None, self.job):
                version = msg.get("version")
                if not isinstance(version, int) or isinstance(version, bool):
                    version = 0  # an older agent or coordinator: unordered, the lowest
                choice = {str(k): str(v) for k, v in partners.items() if isinstance(v, str)}
                self._partners = (version, choice)  # one assignment: read whole by another thread
        elif op == protocol.DUMP_FLIGHT:
            request_id = msg.get("id")
            if isinstance(request_id, str) and len(request_id) <= protocol.DIRECTIVE_ID_MAX:
                # A thread of its own: the dump must not hold up this reader (nor it the dump).
                threading.Thread(
                    target=self._dump_flight, args=(request_id,), name="ftd-client-flight", daemon=True
                ).start()
        elif op == protocol.ERROR:
            if msg.get("re") == protocol.REGISTER:
                raise _Rejected(str(msg.get("error")))
            _log.debug("ftd client: agent reported an error: %s", msg.get("error"))
        return False

    def _dump_flight(self, request_id: str) -> None:
        """Answer the agent's ``dump_flight`` (issue #33) with the file of this process's flight recorder."""
        path, error = flight.dump_json(self.flight_dir)
        if error:
            _log.info("ftd client: no flight-recorder dump for the agent: %s", error)
        self._outbox.append(protocol.encode(protocol.flight(request_id, path, error)))
        self._wake()

    def _on_directive(self, msg: dict[str, Any], arrived_ns: int) -> None:
        did, action, job = msg.get("id"), msg.get("action"), msg.get("job")
        if not isinstance(did, str) or not isinstance(action, str):
            return
        if job is not None and job != self.job:
            return
        deadline = msg.get("deadline_s")
        params = msg.get("params")
        run = params.get(protocol.RUN_PARAM) if isinstance(params, dict) else None
        if isinstance(run, str) and self.run is not None and run != self.run:
            # Meant for another run of this job (the one before a restart in place): never ours.
            _log.info("ftd client: ignoring %s %s for run %s (this is run %s)", action, did, run, self.run)
            return
        info = DirectiveInfo(
            id=did,
            action=action,
            reason=str(msg.get("reason") or ""),
            job=job if isinstance(job, str) else None,
            deadline_s=float(deadline) if isinstance(deadline, (int, float)) else None,
            params=params if isinstance(params, dict) else {},
            received_ns=arrived_ns,
        )
        with self._lock:
            if did in self._seen:
                return
            self._seen[did] = None
            while len(self._seen) > _MAX_SEEN:
                self._seen.popitem(last=False)
            if action == "save":
                self.last_directive_ns = arrived_ns
                self._saves[did] = info
                self._save_at = save_at(self._saves)
                self._save = True
                self._signal.set()
            elif action == "stop":
                resume = info.params.get("resume_step")
                if isinstance(resume, int) and not isinstance(resume, bool):
                    self.resume_step = resume
                    if self.resume_file:
                        write_step(self.resume_file, resume)
                self.last_directive_ns = arrived_ns
                self._stops[did] = info
                self._stop = True
                self._signal.set()
            else:
                _log.debug("ftd client: ignoring directive action %r", action)
                return
        _log.info("ftd client: %s requested (%s) id=%s", action, info.reason or "no reason", did)
