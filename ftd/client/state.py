"""The state one :class:`~ftd.client.Client` shares between the training loop and its I/O thread.

What: :class:`RankState`, the base of the client's parts (:mod:`ftd.client.connection`, the I/O
thread; :mod:`ftd.client.triggers`, signals, switch files and the memory guard; and
:mod:`ftd.client.client`, the per-step calls and the answers): the identity of the rank, where its
agent is, the save/stop flags and the pending directives. Why one base: every part reads and writes
the same fields, and giving them one declaration (with the rules for touching them) keeps the
threading contract in one place: the hot-path flags are plain attributes (atomic under the GIL, no
lock on the per-step path); the directive dicts and flag/event transitions are under ``_lock``.
"""

from __future__ import annotations

import collections
import os
import threading

from ftd.client import protocol
from ftd.client.deadline import SaveClock
from ftd.client.environment import DEFAULT_JOB, env, env_int
from ftd.client.files import read_step
from ftd.client.protocol import DEFAULT_SOCKET
from ftd.client.timing import StepClock

TYPE_CHECKING = False  # not imported from typing: keeps `import ftd.client` light
if TYPE_CHECKING:
    import socket
    from typing import Any

    from ftd.client.directive import DirectiveInfo

__all__ = ["RankState"]


def _startup_timeout(given: float | None) -> float | None:
    """``given``, else ``$FTD_STARTUP_TIMEOUT_S``; within (0, a day], else None (the agent's default)."""
    value: float | None = given
    if value is None:
        raw = env("FTD_STARTUP_TIMEOUT_S")
        if raw is None:
            return None
        try:
            value = float(raw)
        except ValueError:
            value = None
    if value is None or not 0 < value <= protocol.STARTUP_TIMEOUT_MAX_S:
        import logging

        logging.getLogger("ftd.client").warning(
            "ftd client: ignoring start-up timeout %r (want seconds in (0, %d]); the agent's default applies",
            given if given is not None else env("FTD_STARTUP_TIMEOUT_S"),
            int(protocol.STARTUP_TIMEOUT_MAX_S),
        )
        return None
    return value


def _directory(path: str | None) -> str | None:
    """A declared checkpoint directory as the agent expects it: absolute, no NUL, not too long
    (None, with a warning, for one that cannot be: the registration goes on without it)."""
    if not path:
        return None
    full = os.path.abspath(os.path.expanduser(path))
    if "\x00" in full or len(full) > protocol.PATH_MAX:
        import logging

        logging.getLogger("ftd.client").warning("ftd client: ignoring checkpoint directory %r", path[:80])
        return None
    return full


class RankState:
    """Fields of one rank's client; the arguments are :class:`~ftd.client.Client`'s (defaults from
    the environment there)."""

    def __init__(
        self,
        job: str | None,
        rank: int | None,
        local_rank: int | None,
        socket_path: str | None,
        *,
        heartbeat_interval: float,
        retry_interval: float,
        stop_file: str | None,
        save_file: str | None,
        switch_poll_s: float,
        resume_file: str | None,
        run: str | None = None,
        startup_timeout_s: float | None = None,
        checkpoint_dir: str | None = None,
        fallback_checkpoint_dir: str | None = None,
    ) -> None:
        self.job: str = job or env("FTD_JOB", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID") or DEFAULT_JOB
        env_rank = env_int("RANK", "SLURM_PROCID")
        self.rank: int = rank if rank is not None else (env_rank if env_rank is not None else 0)
        self.local_rank: int | None = (
            local_rank if local_rank is not None else env_int("LOCAL_RANK", "SLURM_LOCALID")
        )
        self.socket_path: str = socket_path or env(protocol.SOCKET_ENV) or DEFAULT_SOCKET
        #: The run of the job this process belongs to (:func:`ftd.client.protocol.run_id`): a
        #: directive for another run of the same job is ignored.
        self.run: str | None = run or protocol.run_id(os.environ)
        #: How long this rank may take to its first heartbeat (None: the agent's default).
        self.startup_timeout_s: float | None = _startup_timeout(startup_timeout_s)
        #: Where this rank saves its checkpoints, and where it can save when that filesystem is
        #: read-only, full or unresponsive (``$FTD_CHECKPOINT_DIR``, ``$FTD_FALLBACK_CHECKPOINT_DIR``;
        #: None: not declared). Registered with the agent, so ftd never asks a save onto a filesystem
        #: that cannot take it; :attr:`save_path` is where the save asked now goes.
        self.checkpoint_dir: str | None = _directory(checkpoint_dir or env("FTD_CHECKPOINT_DIR"))
        self.fallback_checkpoint_dir: str | None = _directory(
            fallback_checkpoint_dir or env("FTD_FALLBACK_CHECKPOINT_DIR")
        )
        self.heartbeat_interval = heartbeat_interval
        self.retry_interval = retry_interval
        #: ``time.perf_counter_ns()`` when the latest save/stop for this job arrived (None: none yet).
        self.last_directive_ns: int | None = None
        #: The version and partner node of each node of the job, as the agent last sent them
        #: (``partners`` op).
        self._partners: tuple[int, dict[str, str]] | None = None

        # Hot-path state: plain attributes, read/written without a lock (atomic under the GIL).
        self._save = False
        self._stop = False
        self._step: int | None = None
        # The step pending save directives asked for (params["save_at_step"]): save at the first
        # step >= it. None: at once (no such param, or a directive without one is pending too).
        self._save_at: int | None = None
        self._beat = False
        self._clock = StepClock()  # step timing sent with heartbeats (issue #33)
        # Why a save is wanted besides directives ("signal", "save_file", "memory"): set from signal
        # handlers too, so it is touched without the lock (a set.add is atomic under the GIL).
        self._local_saves: set[str] = set()
        self.stop_reason: str | None = None
        #: The step to resume from, as the coordinator told it with a ``stop`` (the newest step every
        #: rank of the job saved; differs from this rank's own save only when the ranks' saves
        #: disagreed). None: not told. With a resume file it is also written there, and read back
        #: by the next process of the job (a requeued job keeps its environment).
        self.resume_file: str | None = resume_file or env("FTD_RESUME_FILE")
        self.resume_step: int | None = read_step(self.resume_file) if self.resume_file else None
        self.stop_file: str | None = stop_file or env("FTD_STOP_FILE")
        self.save_file: str | None = save_file or env("FTD_SAVE_FILE")
        self.switch_poll_s = switch_poll_s
        # Next time.monotonic() at which to stat the switch files; None when there are none.
        self._poll_at: float | None = 0.0 if (self.stop_file or self.save_file) else None
        self._save_file_seen = False
        self._previous_handlers: dict[int, Any] = {}
        #: ``time.time()`` when the first SIGTERM reached this client's handler (None: none yet).
        self.sigterm_at: float | None = None
        # How long this rank's saves take, and the SIGTERM's save skipped when it could not land
        # before the deadline (issue #37; :mod:`ftd.client.deadline`).
        self._save_clock = SaveClock()
        self._deadline_checked = False
        # should_save() calls so far, and their count when the SIGTERM came: should_stop() waits for
        # one more should_save() after it (a SIGTERM between the two calls of a step is still saved).
        self._save_polls = 0
        self._polls_at_term: int | None = None
        #: Why the SIGTERM's save was not started (None: it was, or there was none).
        self.save_skipped: str | None = None
        #: The newest save this rank acknowledged: ``(step, path)``, None before the first.
        self.last_saved: tuple[int, str | None] | None = None
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

    @property
    def save_path(self) -> str | None:
        """Where the save asked now goes: the directory a pending ``save`` directive names
        (``params["save_path"]``: the fallback, when ftd found :attr:`checkpoint_dir`'s filesystem
        read-only, full or unresponsive), else :attr:`checkpoint_dir` (None: not declared)."""
        with self._lock:
            asked = [info.params.get(protocol.SAVE_PATH_PARAM) for info in self._saves.values()]
        for path in asked:
            if isinstance(path, str) and path:
                return path
        return self.checkpoint_dir
