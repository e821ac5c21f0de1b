"""Trainer client: how a training rank hears ``save``/``stop`` from its node's ftd agent.

Three lines in the training loop::

    from ftd.client import Client

    client = Client()  # job/rank from FTD_JOB|SLURM_JOB_ID|TORCHELASTIC_RUN_ID, RANK|SLURM_PROCID
    for step in range(start, steps):
        train_step()
        client.heartbeat(step)
        if client.should_save():
            path = save_checkpoint(step)
            client.ack_saved(step, path)
        if client.should_stop():
            break

Why it looks like this:

- **Standard library only, imported fast**: it lives inside every training process; it must not
  pull the daemon's dependencies (or anything from ``ftd`` but this package) into a training image.
- **Fail-open**: the agent being absent, down, restarting or misbehaving never raises into training
  code and never blocks a step. All socket I/O happens on one daemon thread that connects (and
  reconnects, with backoff up to ``retry_interval`` seconds, forever), registers, reads pushed
  directives and sends heartbeats and acks. Without an agent every call still returns at once and
  ``should_save()``/``should_stop()`` are simply False.
- **Cheap per step**: :meth:`Client.heartbeat`, :meth:`Client.should_save` and
  :meth:`Client.should_stop` only read or write attributes (well under a microsecond each; see
  ``ftd.client.bench``). The I/O thread sends at most one heartbeat per ``heartbeat_interval``
  (0.2 s), and only if ``heartbeat()`` was called since the previous one, so a hung training loop
  goes silent at the agent, which is how hangs are detected.

A ``stop`` makes :meth:`Client.should_stop` true for the rest of the process. :meth:`Client.close`
(or leaving the ``with`` block) acknowledges pending stops ("exiting") on a best-effort basis.
Directives addressed to another job are ignored.

The wire protocol (newline-delimited JSON over a unix socket, version 1) is documented in
``ftd/agent/local_api.py``.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import select
import socket
import threading
import time

TYPE_CHECKING = False  # not imported from typing: keeps `import ftd.client` light
if TYPE_CHECKING:
    from types import TracebackType
    from typing import Any

__all__ = ["DEFAULT_SOCKET", "PROTOCOL_VERSION", "Client", "DirectiveInfo"]

DEFAULT_SOCKET = "/run/ftd/agent.sock"
PROTOCOL_VERSION = 1
DEFAULT_JOB = "default"

_log = logging.getLogger("ftd.client")
_MAX_BUFFER = 1024 * 1024
_MAX_SEEN = 4096
_IO_TIMEOUT_S = 2.0
_REGISTER_TIMEOUT_S = 5.0


class DirectiveInfo:
    """A directive this rank received (``action`` is ``"save"`` or ``"stop"``).

    ``received_ns`` is ``time.perf_counter_ns()`` when it arrived. (A plain class, not a dataclass:
    ``dataclasses`` imports ``inspect``, which would double this module's import time.)
    """

    __slots__ = ("action", "deadline_s", "id", "job", "params", "reason", "received_ns")

    def __init__(
        self,
        id: str,
        action: str,
        reason: str = "",
        job: str | None = None,
        deadline_s: float | None = None,
        params: dict[str, Any] | None = None,
        received_ns: int = 0,
    ) -> None:
        self.id = id
        self.action = action
        self.reason = reason
        self.job = job
        self.deadline_s = deadline_s
        self.params = params if params is not None else {}
        self.received_ns = received_ns

    def __repr__(self) -> str:
        return f"DirectiveInfo(id={self.id!r}, action={self.action!r}, reason={self.reason!r})"


class _Rejected(Exception):
    """The agent refused our registration: retry later, quietly."""


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def _env_int(*names: str) -> int | None:
    """The first of ``names`` set to an integer (a malformed value is skipped, never raised)."""
    for name in names:
        value = os.environ.get(name)
        if not value:
            continue
        try:
            return int(value)
        except ValueError:
            _log.warning("ftd client: ignoring non-integer %s=%r", name, value)
    return None


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


class Client:
    """Connection of one training rank to its node's ftd agent. Every public method is fail-open.

    ``job`` defaults to ``$FTD_JOB``, ``$SLURM_JOB_ID`` or ``$TORCHELASTIC_RUN_ID`` (else
    ``"default"``); ``rank`` to ``$RANK`` or ``$SLURM_PROCID`` (else 0); ``local_rank`` to
    ``$LOCAL_RANK`` or ``$SLURM_LOCALID``; ``socket_path`` to ``$FTD_SOCKET`` or
    ``/run/ftd/agent.sock``. With ``connect=False`` nothing happens until :meth:`start`.
    """

    def __init__(
        self,
        job: str | None = None,
        rank: int | None = None,
        local_rank: int | None = None,
        socket_path: str | None = None,
        connect: bool = True,
        *,
        heartbeat_interval: float = 0.2,
        retry_interval: float = 1.0,
    ) -> None:
        self.job: str = job or _env("FTD_JOB", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID") or DEFAULT_JOB
        env_rank = _env_int("RANK", "SLURM_PROCID")
        self.rank: int = rank if rank is not None else (env_rank if env_rank is not None else 0)
        self.local_rank: int | None = (
            local_rank if local_rank is not None else _env_int("LOCAL_RANK", "SLURM_LOCALID")
        )
        self.socket_path: str = socket_path or _env("FTD_SOCKET") or DEFAULT_SOCKET
        self.heartbeat_interval = heartbeat_interval
        self.retry_interval = retry_interval
        #: ``time.perf_counter_ns()`` when the latest save/stop for this job arrived (None: none yet).
        self.last_directive_ns: int | None = None

        # Hot-path state: plain attributes, read/written without a lock (atomic under the GIL).
        self._save = False
        self._stop = False
        self._step: int | None = None
        self._beat = False

        self._lock = threading.Lock()  # guards the dicts below and the flag/event transitions
        self._signal = threading.Event()  # set while a save or a stop is pending
        self._closed = threading.Event()
        self._saves: dict[str, DirectiveInfo] = {}
        self._stops: dict[str, DirectiveInfo] = {}
        self._stops_acked: set[str] = set()
        self._seen: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._outbox: collections.deque[bytes] = collections.deque(maxlen=1024)
        # Wakes the I/O thread when an ack is queued; created by start(), closed by the I/O thread.
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._connected = False
        self._warned = False
        self._pid = os.getpid()
        self._thread: threading.Thread | None = None
        if connect:
            self.start()

    # --- per-step calls (hot path) -------------------------------------------------------------

    def heartbeat(self, step: int | None = None) -> None:
        """Record progress; the I/O thread forwards it (at most every ``heartbeat_interval``)."""
        self._step = step
        self._beat = True

    def should_save(self) -> bool:
        """True while a ``save`` directive is pending and not yet acknowledged."""
        return self._save

    def should_stop(self) -> bool:
        """True once a ``stop`` directive arrived (and for the rest of the process)."""
        return self._stop

    # --- answers -------------------------------------------------------------------------------

    def ack_saved(self, step: int, path: str | None = None) -> None:
        """Acknowledge every pending ``save``: the checkpoint at ``step`` (in ``path``) is written."""
        self._answer(ok=True, step=step, path=path, reason="")

    def nack(self, reason: str) -> None:
        """Answer every pending ``save`` with a failure (``reason`` says why) and clear it."""
        self._answer(ok=False, step=self._step, path=None, reason=reason)

    def _answer(self, *, ok: bool, step: int | None, path: str | None, reason: str) -> None:
        try:
            with self._lock:
                saves = list(self._saves)
                self._saves.clear()
                self._save = False
                if not self._stop:
                    self._signal.clear()
            for did in saves:
                self._outbox.append(
                    _line(
                        {
                            "v": PROTOCOL_VERSION,
                            "op": "ack",
                            "directive_id": did,
                            "ok": ok,
                            "step": step,
                            "path": path,
                            "reason": reason,
                        }
                    )
                )
            if saves:
                self._wake()
        except Exception:  # fail-open: never raise into training code
            _log.debug("ftd client: answer failed", exc_info=True)

    # --- waiting and introspection ---------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> str | None:
        """Block until a save or a stop is pending; return ``"save"`` (first) or ``"stop"``, or
        None after ``timeout`` seconds. For idle loops and benchmarks, not for the training step."""
        try:
            self._signal.wait(timeout)
        except Exception:
            return None
        if self._save:
            return "save"
        if self._stop:
            return "stop"
        return None

    @property
    def pending_directive(self) -> DirectiveInfo | None:
        """The latest pending ``save``, else the latest ``stop``, else None."""
        with self._lock:
            if self._saves:
                return next(reversed(self._saves.values()))
            if self._stops:
                return next(reversed(self._stops.values()))
        return None

    @property
    def connected(self) -> bool:
        """True while registered with an agent."""
        return self._connected

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background I/O thread (done by the constructor unless ``connect=False``)."""
        if self._thread is not None or self._closed.is_set():
            return
        try:
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
            self._thread = threading.Thread(
                target=self._run, args=(self._wake_r, self._wake_w), name="ftd-client", daemon=True
            )
            self._thread.start()
        except Exception:
            _log.warning("ftd client: could not start its thread; running without an agent", exc_info=True)

    def close(self, timeout: float = 0.5) -> None:
        """Acknowledge pending stops (best effort, up to ``timeout`` s) and stop the I/O thread."""
        if self._closed.is_set() or os.getpid() != self._pid:
            return
        try:
            with self._lock:
                stops = [did for did in self._stops if did not in self._stops_acked]
                self._stops_acked.update(stops)
            for did in stops:
                self._outbox.append(
                    _line(
                        {
                            "v": PROTOCOL_VERSION,
                            "op": "ack",
                            "directive_id": did,
                            "ok": True,
                            "step": self._step,
                            "path": None,
                            "reason": "exiting",
                        }
                    )
                )
            self._closed.set()
            self._wake()
            if self._thread is not None and self._thread is not threading.current_thread():
                self._thread.join(timeout)
        except Exception:
            _log.debug("ftd client: close failed", exc_info=True)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- background thread -----------------------------------------------------------------------

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
            except OSError as exc:
                self._warn_once(f"agent not reachable at {self.socket_path}: {exc}")
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
            _line(
                {
                    "v": PROTOCOL_VERSION,
                    "op": "register",
                    "job": self.job,
                    "rank": self.rank,
                    "local_rank": self.local_rank,
                    "pid": os.getpid(),
                }
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
                    if self._beat:
                        self._beat = False
                        sock.sendall(_line({"v": PROTOCOL_VERSION, "op": "heartbeat", "step": self._step}))
            if self._closed.is_set():
                return registered

    def _on_line(self, line: bytes, arrived_ns: int) -> bool:
        """Handle one message from the agent; True if it accepted our registration."""
        try:
            msg = json.loads(line)
        except ValueError:
            _log.debug("ftd client: ignoring a non-JSON line from the agent")
            return False
        if not isinstance(msg, dict):
            return False
        op = msg.get("op")
        if op == "directive":
            self._on_directive(msg, arrived_ns)
        elif op == "ok" and msg.get("re") == "register":
            return True
        elif op == "error":
            if msg.get("re") == "register":
                raise _Rejected(str(msg.get("error")))
            _log.debug("ftd client: agent reported an error: %s", msg.get("error"))
        return False

    def _on_directive(self, msg: dict[str, Any], arrived_ns: int) -> None:
        did, action, job = msg.get("id"), msg.get("action"), msg.get("job")
        if not isinstance(did, str) or not isinstance(action, str):
            return
        if job is not None and job != self.job:
            return
        deadline = msg.get("deadline_s")
        params = msg.get("params")
        info = DirectiveInfo(
            id=did,
            action=action,
            reason=str(msg.get("reason") or ""),
            job=job if isinstance(job, str) else None,
            deadline_s=float(deadline) if isinstance(deadline, int | float) else None,
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
                self._save = True
                self._signal.set()
            elif action == "stop":
                self.last_directive_ns = arrived_ns
                self._stops[did] = info
                self._stop = True
                self._signal.set()
            else:
                _log.debug("ftd client: ignoring directive action %r", action)
                return
        _log.info("ftd client: %s requested (%s) id=%s", action, info.reason or "no reason", did)
