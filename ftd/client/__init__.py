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
  ``should_save()``/``should_stop()`` are simply False. Fail-open is never silent: the first time
  the agent cannot be reached (EACCES, ENOENT, ECONNREFUSED) or refuses the registration, one line
  goes to stderr saying the job is not protected, with a hint (e.g. "ask the admin to set
  agent.socket_group"); later failures go to the ``ftd.client`` logger only.
- **Cheap per step**: :meth:`Client.heartbeat`, :meth:`Client.should_save` and
  :meth:`Client.should_stop` only read or write attributes (well under a microsecond each; see
  ``ftd.bench.client``). The I/O thread sends at most one heartbeat per ``heartbeat_interval``
  (0.2 s), and only if ``heartbeat()`` was called since the previous one, so a hung training loop
  goes silent at the agent, which is how hangs are detected.

A ``stop`` makes :meth:`Client.should_stop` true for the rest of the process. :meth:`Client.close`
(or leaving the ``with`` block) acknowledges pending stops ("exiting") on a best-effort basis.
Directives addressed to another job are ignored.

Other sources map onto the same two flags (so the training loop has one place to look):

- **Signals** (opt-in: ``Client(signals=True)`` or :meth:`Client.install_signal_handlers`, main
  thread only): ``SIGUSR1`` -> save, ``SIGTERM`` -> stop. A Python handler installed before ours is
  still called after ours; ``SIG_DFL``/``SIG_IGN`` are not (calling the default SIGTERM action would
  kill the process before it can save, which is the point of catching it).
- **Kill switch** (``stop_file=`` or ``$FTD_STOP_FILE``): while the file exists, ``should_stop()`` is
  true; it is also checked once in the constructor so a queued job array "burns through" at once.
- **Save switch** (``save_file=`` or ``$FTD_SAVE_FILE``): when the file appears, ``should_save()``
  becomes true; the file is removed when the save is answered (acked or nacked), so it triggers one
  save, not one per step.
- **Memory** (:meth:`Client.memory_guard`): host RSS (against ``MemTotal`` or the cgroup's limit) and,
  when the trainer already imported torch and CUDA is available, ``torch.cuda.memory_reserved``
  against the device's total: above the threshold both flags are set (save, then exit before OOM).

The switch files are polled at most every ``switch_poll_s`` (0.2 s) from the per-step calls (one
``stat`` per poll): the hot path stays a few attribute reads.

Save at a step: a ``save`` directive may carry ``params["save_at_step"]`` = S (the coordinator
picks it ahead of the furthest step the job's ranks reported). Then :meth:`Client.should_save` stays
False until the step given to :meth:`Client.heartbeat` is >= S, so every rank saves the same step
without talking to the others (a rank already past S when the directive arrives saves at once: the
coordinator sees the differing steps in the acks). A local trigger (signal, save switch, memory
guard) still saves at once.

Resume step: a ``stop`` may carry ``params["resume_step"]``, the newest step every rank of the job
saved (it differs from this rank's own save only when the ranks' saves disagreed): it is
:attr:`Client.resume_step`, and with ``resume_file=`` / ``$FTD_RESUME_FILE`` it is written there and
read back by the job's next process (set the variable in the job script: a requeued Slurm job runs
it again), so the restart resumes from a checkpoint every rank has.

Deadlines: a ``save`` directive carries ``deadline_s``. If it is still unanswered that long after it
arrived (the rank is stuck, or its save is failing slowly), the I/O thread answers it with a nack
("save not completed within deadline") so the coordinator learns why instead of waiting for silence.

Exit status (Kubernetes): a rank that leaves its loop because the coordinator sent ``stop`` should end
with :meth:`Client.exit_status`: 0 on Slurm (ftd requeues the job itself), but on Kubernetes
(``KUBERNETES_SERVICE_HOST`` is set in every pod) :data:`STOP_EXIT_CODE` (75, EX_TEMPFAIL; or
``$FTD_STOP_EXIT_CODE``): a Job whose pods exit 0 is *Complete* and nothing recreates them, while a
pod that fails with 75 is replaced (give the Job ``podFailurePolicy: onExitCodes [75] -> Ignore`` so
the restart is not counted in ``backoffLimit``; ``deploy/kubernetes/training-job-example.yaml``).

The wire protocol (newline-delimited JSON over a unix socket, version 1) is
:mod:`ftd.client.protocol`; the agent's end is ``ftd/agent/local_api.py``.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import select
import signal
import socket
import sys
import threading
import time

from ftd.client import protocol
from ftd.client.protocol import DEFAULT_SOCKET, PROTOCOL_VERSION

TYPE_CHECKING = False  # not imported from typing: keeps `import ftd.client` light
if TYPE_CHECKING:
    from types import TracebackType
    from typing import Any

__all__ = ["DEFAULT_SOCKET", "PROTOCOL_VERSION", "STOP_EXIT_CODE", "Client", "DirectiveInfo"]

DEFAULT_JOB = "default"

_log = logging.getLogger("ftd.client")
_MAX_BUFFER = 1024 * 1024
_MAX_SEEN = 4096
STOP_EXIT_CODE = 75
"""EX_TEMPFAIL: how a rank stopped by the coordinator exits on Kubernetes, so its pod is recreated."""
_IO_TIMEOUT_S = 2.0
_REGISTER_TIMEOUT_S = 5.0
DEADLINE_REASON = "save not completed within deadline"
_UNREACHABLE_HINTS = {
    errno.EACCES: "permission denied (EACCES): ask the admin to set agent.socket_group to a group "
    "you are in (the socket is mode 0660)",
    errno.ENOENT: "no socket there (ENOENT): is ftd-agent running on this node? (or set FTD_SOCKET)",
    errno.ECONNREFUSED: "nothing is listening (ECONNREFUSED): ftd-agent is stopped or restarting",
}


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


class Client:
    """Connection of one training rank to its node's ftd agent. Every public method is fail-open.

    ``job`` defaults to ``$FTD_JOB``, ``$SLURM_JOB_ID`` or ``$TORCHELASTIC_RUN_ID`` (else
    ``"default"``); ``rank`` to ``$RANK`` or ``$SLURM_PROCID`` (else 0); ``local_rank`` to
    ``$LOCAL_RANK`` or ``$SLURM_LOCALID``; ``socket_path`` to ``$FTD_SOCKET`` or
    ``/run/ftd/agent.sock``. With ``connect=False`` nothing happens until :meth:`start`.
    ``signals=True`` installs the SIGUSR1/SIGTERM handlers (:meth:`install_signal_handlers`);
    ``stop_file``/``save_file`` default to ``$FTD_STOP_FILE``/``$FTD_SAVE_FILE`` (kill and save
    switches, polled every ``switch_poll_s`` seconds); ``resume_file`` to ``$FTD_RESUME_FILE``
    (where :attr:`resume_step` is kept for the job's next process: name one per job, e.g. next to
    its checkpoints).
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
        signals: bool = False,
        stop_file: str | None = None,
        save_file: str | None = None,
        switch_poll_s: float = 0.2,
        resume_file: str | None = None,
    ) -> None:
        self.job: str = job or _env("FTD_JOB", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID") or DEFAULT_JOB
        env_rank = _env_int("RANK", "SLURM_PROCID")
        self.rank: int = rank if rank is not None else (env_rank if env_rank is not None else 0)
        self.local_rank: int | None = (
            local_rank if local_rank is not None else _env_int("LOCAL_RANK", "SLURM_LOCALID")
        )
        self.socket_path: str = socket_path or _env(protocol.SOCKET_ENV) or DEFAULT_SOCKET
        self.heartbeat_interval = heartbeat_interval
        self.retry_interval = retry_interval
        #: ``time.perf_counter_ns()`` when the latest save/stop for this job arrived (None: none yet).
        self.last_directive_ns: int | None = None

        # Hot-path state: plain attributes, read/written without a lock (atomic under the GIL).
        self._save = False
        self._stop = False
        self._step: int | None = None
        # The step pending save directives asked for (params["save_at_step"]): save at the first
        # step >= it. None: at once (no such param, or a directive without one is pending too).
        self._save_at: int | None = None
        self._beat = False
        # Why a save is wanted besides directives ("signal", "save_file", "memory"): set from signal
        # handlers too, so it is touched without the lock (a set.add is atomic under the GIL).
        self._local_saves: set[str] = set()
        self.stop_reason: str | None = None
        #: The step to resume from, as the coordinator told it with a ``stop`` (the newest step every
        #: rank of the job saved; differs from this rank's own save only when the ranks' saves
        #: disagreed). None: not told. With a resume file it is also written there, and read back
        #: by the next process of the job (a requeued job keeps its environment).
        self.resume_file: str | None = resume_file or _env("FTD_RESUME_FILE")
        self.resume_step: int | None = _read_step(self.resume_file) if self.resume_file else None
        self.stop_file: str | None = stop_file or _env("FTD_STOP_FILE")
        self.save_file: str | None = save_file or _env("FTD_SAVE_FILE")
        self.switch_poll_s = switch_poll_s
        # Next time.monotonic() at which to stat the switch files; None when there are none.
        self._poll_at: float | None = 0.0 if (self.stop_file or self.save_file) else None
        self._save_file_seen = False
        self._previous_handlers: dict[int, Any] = {}
        #: The latest readings of :meth:`memory_guard` (``{"host"|"cgroup"|"gpu": {used, limit, fraction}}``).
        self.memory_report: dict[str, Any] = {}

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
        self._told_stderr = False  # the one stderr line per Client (fail-open, never silent)
        self._pid = os.getpid()
        self._thread: threading.Thread | None = None
        if self._poll_at is not None:
            self._poll_switches()  # a kill switch present at start stops the job before step one
        if signals:
            self.install_signal_handlers()
        if connect:
            self.start()

    # --- per-step calls (hot path) -------------------------------------------------------------

    def heartbeat(self, step: int | None = None) -> None:
        """Record progress; the I/O thread forwards it (at most every ``heartbeat_interval``)."""
        self._step = step
        self._beat = True

    def should_save(self) -> bool:
        """True while a save is wanted and not yet answered: a ``save`` directive, SIGUSR1, the
        save-switch file or the memory guard."""
        if self._poll_at is not None and time.monotonic() >= self._poll_at:
            self._poll_switches()
        save_at = self._save_at
        if save_at is not None and not self._local_saves:
            step = self._step
            if step is not None and step < save_at:
                return False  # the coordinator asked for the first step >= save_at
        return self._save

    def should_stop(self) -> bool:
        """True once a ``stop`` directive, SIGTERM, the kill-switch file or the memory guard asked
        for it (and for the rest of the process)."""
        if self._poll_at is not None and time.monotonic() >= self._poll_at:
            self._poll_switches()
        return self._stop

    def exit_status(self) -> int:
        """What this rank should exit with once it left its loop (``sys.exit(client.exit_status())``).

        0, unless a ``stop`` *directive* moved the job and only a failed process is restarted where it
        runs: on Kubernetes (``KUBERNETES_SERVICE_HOST`` set, and not a Slurm job: ``SLURM_JOB_ID``
        unset) :data:`STOP_EXIT_CODE`, so the Job's controller recreates the pod instead of calling
        the Job complete; ``$FTD_STOP_EXIT_CODE``
        (an integer, 0 included) overrides it anywhere. A stop by SIGTERM, the kill switch or the
        memory guard, or no stop at all, is 0."""
        if not self._stops:
            return 0
        code = _env_int("FTD_STOP_EXIT_CODE")
        if code is not None:
            return code
        if os.environ.get("SLURM_JOB_ID"):  # Slurm (even slurmd in a pod): ftd requeues the job itself
            return 0
        return STOP_EXIT_CODE if os.environ.get("KUBERNETES_SERVICE_HOST") else 0

    @property
    def save_directive_pending(self) -> bool:
        """True while a ``save`` *directive* (not a local trigger) is pending: the torch helper tells
        its peers so a rank that saved for a peer's directive can answer its own when it arrives."""
        return bool(self._saves)

    # --- local triggers: switch files, signals, memory --------------------------------------------

    def request_save(self, reason: str = "local") -> None:
        """Ask for a save from inside the process (the same flag a ``save`` directive sets)."""
        self._local_saves.add(reason)
        self._save = True
        self._signal.set()

    def request_stop(self, reason: str = "local") -> None:
        """Ask for a stop from inside the process (sticky, like a ``stop`` directive)."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self._stop = True
        self._signal.set()

    def _flag_from_signal(self, stop: bool, reason: str) -> None:
        # Runs inside a signal handler, i.e. between two bytecodes of the main thread, which may be
        # holding self._lock or the Event's lock (in wait()): touch plain attributes only, and let a
        # helper thread set the Event.
        if stop:
            if self.stop_reason is None:
                self.stop_reason = reason
            self._stop = True
        else:
            self._local_saves.add(reason)
            self._save = True
        threading.Thread(target=self._signal.set, name="ftd-client-signal", daemon=True).start()

    def _poll_switches(self) -> None:
        try:
            self._poll_at = time.monotonic() + self.switch_poll_s
            if self.stop_file and not self._stop and os.path.exists(self.stop_file):
                _log.info("ftd client: kill switch %s present: stopping", self.stop_file)
                self.request_stop("stop_file")
            if self.save_file and not self._save_file_seen and os.path.exists(self.save_file):
                self._save_file_seen = True
                _log.info("ftd client: save switch %s present: saving", self.save_file)
                self.request_save("save_file")
        except Exception:  # fail-open
            _log.debug("ftd client: switch poll failed", exc_info=True)

    def install_signal_handlers(self) -> bool:
        """SIGUSR1 -> save, SIGTERM -> stop. Main thread only (Python's rule for signal handlers);
        returns False (and changes nothing) elsewhere. A Python handler installed before is called
        after ours; the default action and SIG_IGN are not."""
        if threading.current_thread() is not threading.main_thread():
            _log.warning("ftd client: signal handlers can only be installed from the main thread")
            return False
        try:
            for signum in (signal.SIGUSR1, signal.SIGTERM):
                if signum in self._previous_handlers:
                    continue
                self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
        except Exception:
            _log.warning("ftd client: could not install signal handlers", exc_info=True)
            return False
        return True

    def uninstall_signal_handlers(self) -> None:
        """Put back the handlers :meth:`install_signal_handlers` replaced (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in list(self._previous_handlers.items()):
            with contextlib.suppress(Exception):
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            del self._previous_handlers[signum]

    def _on_signal(self, signum: int, frame: Any) -> None:
        with contextlib.suppress(Exception):  # fail-open, even here
            self._flag_from_signal(signum == signal.SIGTERM, signal.Signals(signum).name)
        previous = self._previous_handlers.get(signum)
        if callable(previous):
            previous(signum, frame)

    def memory_guard(self, max_rss_fraction: float = 0.9, gpu: bool = True) -> bool:
        """Save and stop before an out-of-memory kill: True (and both flags set) when host memory or,
        with ``gpu`` and torch already imported with CUDA available, the current device's reserved
        memory is above ``max_rss_fraction`` of what is available. Call it every few steps (it reads
        a few ``/proc`` and cgroup files: tens of microseconds). Details in :attr:`memory_report`.

        Host: this process's RSS against ``MemTotal``; inside a cgroup with a memory limit, the
        cgroup's working set (usage minus inactive file cache) against that limit, since every
        process of the cgroup counts towards it."""
        try:
            report: dict[str, Any] = {}
            over: list[str] = []
            rss, total = _process_rss(), _mem_total()
            if rss is not None and total:
                report["host"] = {"used": rss, "limit": total, "fraction": rss / total}
                if rss > max_rss_fraction * total:
                    over.append(f"host rss {rss / total:.0%} of MemTotal")
            cgroup = _cgroup_memory()
            if cgroup is not None:
                used, limit = cgroup
                report["cgroup"] = {"used": used, "limit": limit, "fraction": used / limit}
                if used > max_rss_fraction * limit:
                    over.append(f"cgroup memory {used / limit:.0%} of its limit")
            if gpu:
                cuda = _cuda_memory()
                if cuda is not None:
                    used, limit = cuda
                    report["gpu"] = {"used": used, "limit": limit, "fraction": used / limit}
                    if used > max_rss_fraction * limit:
                        over.append(f"gpu reserved {used / limit:.0%} of device memory")
            self.memory_report = report
            if over:
                _log.warning("ftd client: memory guard: %s: saving and stopping", "; ".join(over))
                self.request_save("memory")
                self.request_stop("memory")
                return True
        except Exception:  # fail-open
            _log.debug("ftd client: memory guard failed", exc_info=True)
        return False

    # --- answers -------------------------------------------------------------------------------

    def ack_saved(self, step: int, path: str | None = None) -> None:
        """Acknowledge every pending ``save``: the checkpoint at ``step`` (in ``path``) is written."""
        self._answer(ok=True, step=step, path=path, reason="")

    def nack(self, reason: str) -> None:
        """Answer every pending ``save`` with a failure (``reason`` says why) and clear it."""
        self._answer(ok=False, step=self._step, path=None, reason=reason)

    def _answer(
        self,
        *,
        ok: bool,
        step: int | None,
        path: str | None,
        reason: str,
        only: list[str] | None = None,
    ) -> None:
        """Answer pending saves (every one, or the ids in ``only``: the deadline nack) and clear the
        local triggers with them (removing the save-switch file)."""
        try:
            with self._lock:
                if only is None:
                    saves = list(self._saves)
                    self._saves.clear()
                    local = bool(self._local_saves)
                    self._local_saves.clear()
                else:
                    saves = [did for did in only if self._saves.pop(did, None) is not None]
                    local = False
                self._save_at = _save_at(self._saves)
                self._save = bool(self._saves) or bool(self._local_saves)
                if not self._save and not self._stop:
                    self._signal.clear()
            if local and self._save_file_seen and self.save_file:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.save_file)
                self._save_file_seen = False
            for did in saves:
                self._outbox.append(
                    protocol.encode(protocol.ack(did, ok=ok, step=step, path=path, reason=reason))
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
                    protocol.encode(protocol.ack(did, ok=True, step=self._step, path=None, reason="exiting"))
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
        sock.sendall(protocol.encode(protocol.register(self.job, self.rank, self.local_rank, os.getpid())))
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
                        sock.sendall(protocol.encode(protocol.heartbeat(self._step)))
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
        elif op == protocol.ERROR:
            if msg.get("re") == protocol.REGISTER:
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
                self._save_at = _save_at(self._saves)
                self._save = True
                self._signal.set()
            elif action == "stop":
                resume = info.params.get("resume_step")
                if isinstance(resume, int) and not isinstance(resume, bool):
                    self.resume_step = resume
                    if self.resume_file:
                        _write_step(self.resume_file, resume)
                self.last_directive_ns = arrived_ns
                self._stops[did] = info
                self._stop = True
                self._signal.set()
            else:
                _log.debug("ftd client: ignoring directive action %r", action)
                return
        _log.info("ftd client: %s requested (%s) id=%s", action, info.reason or "no reason", did)


def _read_step(path: str) -> int | None:
    """The step in a resume file; None when there is none (absent, unreadable, not an integer)."""
    text = _read(path)
    try:
        return int(text.strip()) if text else None
    except ValueError:
        _log.warning("ftd client: ignoring resume file %s: not a step number", path)
        return None


def _write_step(path: str, step: int) -> None:
    """Write the resume file atomically (a restarted rank never reads half a number); fail-open."""
    try:
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(f"{step}\n")
        os.replace(tmp, path)
    except OSError:
        _log.warning("ftd client: could not write the resume file %s", path, exc_info=True)


def _save_at(saves: dict[str, DirectiveInfo]) -> int | None:
    """The step to save at for the pending save directives: the furthest ``save_at_step`` they ask
    for (one checkpoint answers them all), or None (at once) when any of them names none."""
    targets = [info.params.get("save_at_step") for info in saves.values()]
    if not targets or any(not isinstance(t, int) or isinstance(t, bool) for t in targets):
        return None
    return max(t for t in targets if isinstance(t, int))


# --- memory probes (module level: memory_guard stays small; each returns None when unknown) -------


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _process_rss() -> int | None:
    text = _read("/proc/self/statm")
    if text is None:
        return None
    return int(text.split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _mem_total() -> int | None:
    text = _read("/proc/meminfo")
    for line in (text or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def _cgroup_memory() -> tuple[int, int] | None:
    """(working set, limit) of this process's memory cgroup, if it has a limit (v2, else v1)."""
    text = _read("/proc/self/cgroup") or ""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":  # cgroup v2
            base = "/sys/fs/cgroup" + parts[2].rstrip("/")
            limit_text, usage_text = _read(base + "/memory.max"), _read(base + "/memory.current")
            stat_key = "inactive_file"
        elif "memory" in parts[1].split(","):  # cgroup v1
            base = "/sys/fs/cgroup/memory" + parts[2].rstrip("/")
            limit_text = _read(base + "/memory.limit_in_bytes")
            usage_text = _read(base + "/memory.usage_in_bytes")
            stat_key = "total_inactive_file"
        else:
            continue
        if not limit_text or not usage_text or limit_text.strip() == "max":
            continue
        limit, usage = int(limit_text), int(usage_text)
        if limit <= 0 or limit >= 1 << 60:  # v1 spells "no limit" as a huge number
            continue
        for stat_line in (_read(base + "/memory.stat") or "").splitlines():
            key, _, value = stat_line.partition(" ")
            if key == stat_key:
                usage -= int(value)
                break
        return max(usage, 0), limit
    return None


def _cuda_memory() -> tuple[int, int] | None:
    """(reserved, total) bytes of the current CUDA device, only if the trainer imported torch."""
    torch: Any = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    device = torch.cuda.current_device()
    return int(torch.cuda.memory_reserved(device)), int(torch.cuda.get_device_properties(device).total_memory)
