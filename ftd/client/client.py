"""The :class:`Client` a training loop holds: per-step calls, answers, waiting and lifecycle.

What: the public class of :mod:`ftd.client` (see the package docstring for how a loop uses it).
It adds to the shared :class:`~ftd.client.state.RankState` the calls made from training code:
``heartbeat``/``should_save``/``should_stop`` (attribute reads and writes only: the hot path),
``ack_saved``/``nack`` (queue the answer for the I/O thread), ``exit_status``, ``wait``, and
``start``/``close``. The I/O thread is :class:`~ftd.client.connection.Connection`; signals, switch
files and the memory guard are :class:`~ftd.client.triggers.LocalTriggers`.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import sys
import threading
import time
import weakref

from ftd.client import protocol
from ftd.client.connection import Connection
from ftd.client.deadline import known_deadline, margin_s, skip_reason
from ftd.client.directive import DirectiveInfo, save_at
from ftd.client.environment import env_int
from ftd.client.triggers import LocalTriggers

TYPE_CHECKING = False  # not imported from typing: keeps `import ftd.client` light
if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["STOP_EXIT_CODE", "Client"]

_log = logging.getLogger("ftd.client")
STOP_EXIT_CODE = 75
"""EX_TEMPFAIL: how a rank stopped by the coordinator exits on Kubernetes, so its pod is recreated."""


class Client(Connection, LocalTriggers):
    """Connection of one training rank to its node's ftd agent. Every public method is fail-open.

    ``job`` defaults to ``$FTD_JOB``, ``$SLURM_JOB_ID`` or ``$TORCHELASTIC_RUN_ID`` (else
    ``"default"``); ``rank`` to ``$RANK`` or ``$SLURM_PROCID`` (else 0); ``local_rank`` to
    ``$LOCAL_RANK`` or ``$SLURM_LOCALID``; ``socket_path`` to ``$FTD_SOCKET`` or
    ``/run/ftd/agent.sock``. With ``connect=False`` nothing happens until :meth:`start`.
    ``signals`` (default None): in the main thread, SIGTERM becomes save-then-stop and SIGUSR1 a
    save where no handler was installed for them (:meth:`install_default_signal_handlers`;
    ``$FTD_SIGNALS=0`` turns it off); ``True`` installs both handlers in any case, chaining a
    Python handler installed before (:meth:`install_signal_handlers`); ``False``: none.
    ``stop_file``/``save_file`` default to ``$FTD_STOP_FILE``/``$FTD_SAVE_FILE`` (kill and save
    switches, polled every ``switch_poll_s`` seconds); ``resume_file`` to ``$FTD_RESUME_FILE``
    (where :attr:`resume_step` is kept for the job's next process: name one per job, e.g. next to
    its checkpoints).

    ``run`` names the run of the job this process belongs to (default:
    :func:`ftd.client.protocol.run_id`: ``$FTD_RUN``, the Slurm restart count, the pod's uid): a
    save or stop for another run (the one before an in-place restart) never reaches it.
    ``startup_timeout_s`` (default ``$FTD_STARTUP_TIMEOUT_S``, else the agent's
    ``agent.heartbeat.startup_timeout_s``) is how long the rank may take from here to its first
    ``heartbeat()`` (imports, data loading, compilation) before the agent reports it lost.
    ``checkpoint_dir`` and ``fallback_checkpoint_dir`` (defaults ``$FTD_CHECKPOINT_DIR``,
    ``$FTD_FALLBACK_CHECKPOINT_DIR``; optional) say where this rank saves and where it can save when
    that filesystem is read-only, full or unresponsive: ftd then asks for the save there
    (:attr:`save_path`) or stops the job without one, never a save that would hang or fail.

    A stop is acknowledged by :meth:`close`, which also runs at interpreter exit (and at the end of
    ``with Client() as client:``), so a loop that just breaks on ``should_stop()`` is complete.
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
        signals: bool | None = None,
        stop_file: str | None = None,
        save_file: str | None = None,
        switch_poll_s: float = 0.2,
        resume_file: str | None = None,
        run: str | None = None,
        startup_timeout_s: float | None = None,
        checkpoint_dir: str | None = None,
        fallback_checkpoint_dir: str | None = None,
    ) -> None:
        super().__init__(
            job,
            rank,
            local_rank,
            socket_path,
            heartbeat_interval=heartbeat_interval,
            retry_interval=retry_interval,
            stop_file=stop_file,
            save_file=save_file,
            switch_poll_s=switch_poll_s,
            resume_file=resume_file,
            run=run,
            startup_timeout_s=startup_timeout_s,
            checkpoint_dir=checkpoint_dir,
            fallback_checkpoint_dir=fallback_checkpoint_dir,
        )
        if self._poll_at is not None:
            self._poll_switches()  # a kill switch present at start stops the job before step one
        if signals:
            self.install_signal_handlers()
        elif signals is None:
            self.install_default_signal_handlers()
        if connect:
            self.start()

    # --- per-step calls (hot path) -------------------------------------------------------------

    def heartbeat(self, step: int | None = None) -> None:
        """Record progress; the I/O thread forwards it (at most every ``heartbeat_interval``) with
        the rank's step timing (:mod:`ftd.client.timing`)."""
        try:  # noqa: SIM105 -- the hot path: contextlib.suppress costs an object per step
            self._clock.beat(step)
        except Exception:  # fail-open: never raise into training code
            pass
        self._step = step
        self._beat = True

    def waited(self, seconds: float) -> None:
        """The rank spent ``seconds`` blocked in a collective this step (waiting for its peers): the
        rest of the step is its own work, which is what tells a slow rank from its peers (issue #33).
        The torch helper reports DDP's gradient all-reduce and its own (:mod:`ftd.client.torch`)."""
        self._clock.waited(seconds)

    def should_save(self) -> bool:
        """True while a save is wanted and not yet answered: a ``save`` directive, SIGUSR1, the
        save-switch file or the memory guard."""
        self._save_polls += 1
        if self._poll_at is not None and time.monotonic() >= self._poll_at:
            self._poll_switches()
        save_at = self._save_at
        if save_at is not None and not self._local_saves:
            step = self._step
            if step is not None and step < save_at:
                return False  # the coordinator asked for the first step >= save_at
        if self._save:
            return self._save_wanted()
        return False

    def _save_wanted(self) -> bool:
        """A save is pending: time it, and after a SIGTERM check once that it can still land before
        the deadline (:mod:`ftd.client.deadline`); one that cannot is not started, and says so."""
        try:
            self._save_clock.seen(time.monotonic())
            if "SIGTERM" in self._local_saves and not self._deadline_checked and not self._saves:
                self._deadline_checked = True
                env = os.environ
                deadline = known_deadline(env, socket_path=self.socket_path)
                why = skip_reason(time.time(), deadline, self._save_clock.p95(), margin_s(env))
                if why is not None:
                    self._skip_sigterm_save(why)
        except Exception:  # fail-open: never raise into training code
            _log.debug("ftd client: deadline check failed", exc_info=True)
        return self._save

    def _skip_sigterm_save(self, why: str) -> None:
        self._local_saves.discard("SIGTERM")
        with self._lock:
            self._save = bool(self._saves) or bool(self._local_saves)
        self._save_clock.answered(time.monotonic(), ok=False)
        last = self.last_saved
        resume = (
            f"the job resumes from its last checkpoint, step {last[0]}" + (f" ({last[1]})" if last[1] else "")
            if last is not None
            else "this process saved nothing: the job resumes from whatever checkpoint it had before"
        )
        self.save_skipped = f"{why}; not saving, stopping now: {resume}"
        sys.stderr.write(f"ftd client: SIGTERM: {self.save_skipped}\n")
        sys.stderr.flush()

    def should_stop(self) -> bool:
        """True once a ``stop`` directive, SIGTERM, the kill-switch file or the memory guard asked
        for it (and for the rest of the process).

        A SIGTERM that lands after this step's ``should_save()`` and before this call is a save then
        a stop like any other: ``should_stop()`` stays false until the loop asked ``should_save()``
        once more (so it saves in the next step instead of leaving unsaved); a loop that never asks
        ``should_save()`` stops at once."""
        if self._poll_at is not None and time.monotonic() >= self._poll_at:
            self._poll_switches()
        stop = self._stop
        if stop and self._save_polls and self._save_polls == self._polls_at_term:
            return "SIGTERM" not in self._local_saves
        return stop

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
        code = env_int("FTD_STOP_EXIT_CODE")
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

    # --- answers -------------------------------------------------------------------------------

    def ack_saved(self, step: int, path: str | None = None) -> None:
        """Acknowledge every pending ``save``: the checkpoint at ``step`` (in ``path``) is written."""
        self._answer(ok=True, step=step, path=path, reason="")

    def nack(self, reason: str) -> None:
        """Answer every pending ``save`` with a failure (``reason`` says why) and clear it."""
        self._answer(ok=False, step=self._step, path=None, reason=reason)

    def report_checkpoint(
        self,
        step: int,
        path: str,
        *,
        save_s: float | None = None,
        level: str = "local",
        directive_id: str | None = None,
        world_size: int | None = None,
        generation: int = 0,
    ) -> str | None:
        """Every save known (issue #34): tell the agent this rank wrote the checkpoint of ``step``,
        asked for or not. ``path`` is a manifest the rank wrote (:mod:`ftd.client.manifest`) or the
        checkpoint's directory, for whose files this writes the manifest now (the rank's own
        directory: every regular file under it is listed). ``directive_id`` names the save directive
        it answers (None: the pending ones, if any; ``""``: none). Returns the manifest's path, or None
        when the path could not be reported (logged; fail-open: never raises into training code)."""
        try:
            from ftd.client.saves import manifest_for  # lazy: keeps `import ftd.client` light

            world = world_size or env_int("WORLD_SIZE", "SLURM_NTASKS") or 1
            manifest, nbytes = manifest_for(
                path,
                step=step,
                job=self.job,
                rank=self.rank,
                world_size=world,
                generation=generation,
                level=level,
                save_s=save_s,
            )
            if directive_id is None:
                with self._lock:
                    ids: list[str | None] = list(self._saves) or [None]
            else:  # "" answers no directive
                ids = [directive_id or None]
            for did in ids:
                msg = protocol.checkpoint(
                    step, manifest, level=level, save_s=save_s, nbytes=nbytes, directive_id=did
                )
                self._outbox.append(protocol.encode(msg))
            self._wake()
            return manifest
        except Exception as exc:  # fail-open
            _log.warning("ftd client: could not report the checkpoint of step %s at %s: %s", step, path, exc)
            return None

    def pending_save_ids(self) -> list[str]:
        """The ids of the ``save`` directives pending now (the checkpoint tier names them)."""
        with self._lock:
            return list(self._saves)

    @property
    def partners(self) -> dict[str, str] | None:
        """The coordinator's partner node for each node of the job (the ``partners`` op), or None
        when the agent has not sent one: where the checkpoint tier replicates this rank's shard."""
        seen = self._partners
        return None if seen is None else seen[1]

    @property
    def partners_choice(self) -> tuple[int, dict[str, str]] | None:
        """The latest ``partners`` op as ``(version, partners)`` (version 0 when the agent gave
        none), or None: the checkpoint tier agrees on the newest any rank has (``agree_partners``)."""
        return self._partners

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
            saves = self._take_saves(only)
            self.answer_taken(saves, ok=ok, step=step, path=path, reason=reason)
        except Exception:  # fail-open: never raise into training code
            _log.debug("ftd client: answer failed", exc_info=True)

    def take_pending_saves(self) -> list[str]:
        """Clear every pending save (directives and local triggers, as an answer does) without
        answering yet; returns the directive ids, to answer with :meth:`answer_taken` once the
        checkpoint is written (the checkpoint tier: ``should_save`` turns False when its snapshot is
        taken, the ack follows when its manifest is on disk)."""
        try:
            return self._take_saves(None)
        except Exception:
            _log.debug("ftd client: taking the pending saves failed", exc_info=True)
            return []

    def _take_saves(self, only: list[str] | None) -> list[str]:
        with self._lock:
            if only is None:
                saves = list(self._saves)
                self._saves.clear()
                local = bool(self._local_saves)
                self._local_saves.clear()
            else:
                saves = [did for did in only if self._saves.pop(did, None) is not None]
                local = False
            self._save_at = save_at(self._saves)
            self._save = bool(self._saves) or bool(self._local_saves)
            if not self._save and not self._stop:
                self._signal.clear()
        if local and self._save_file_seen and self.save_file:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.save_file)
            self._save_file_seen = False
        return saves

    def answer_taken(
        self, ids: list[str], *, ok: bool, step: int | None, path: str | None, reason: str = ""
    ) -> None:
        """Answer the save directives ``ids`` (from :meth:`take_pending_saves`)."""
        try:
            self._save_clock.answered(time.monotonic(), ok)
            if ok and step is not None:
                self.last_saved = (step, path)
            for did in ids:
                self._outbox.append(
                    protocol.encode(protocol.ack(did, ok=ok, step=step, path=path, reason=reason))
                )
            if ids:
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
            atexit.register(_close_at_exit, weakref.ref(self))
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


TERM_WAIT_ENV = "FTD_TERM_WAIT_S"
TERM_WAIT_DEFAULT_S = 600.0


def term_wait_s() -> float:
    """How long a Slurm job's process, stopped by SIGTERM, waits at exit for Slurm to end the job
    (``$FTD_TERM_WAIT_S``, default 600 s; 0: not at all; malformed: the default)."""
    raw = os.environ.get(TERM_WAIT_ENV)
    try:
        value = float(raw) if raw else TERM_WAIT_DEFAULT_S
    except ValueError:
        _log.warning("ftd client: ignoring %s=%r", TERM_WAIT_ENV, raw)
        value = TERM_WAIT_DEFAULT_S
    return max(0.0, min(value, 86400.0)) if value == value else TERM_WAIT_DEFAULT_S


def _wait_for_slurm(client: Client) -> None:
    """A Slurm job whose process was stopped by SIGTERM leaves the job's ending to Slurm: Slurm
    requeues a preempted job (PreemptMode=REQUEUE) only when it ends the job itself at the end of
    GraceTime; a job whose processes all exit within the grace is COMPLETED (or FAILED) and never
    runs again. So, the save made and the stop acknowledged, the process waits here (the next
    SIGTERM, or Slurm's SIGKILL, ends it) for at most :func:`term_wait_s`. Not under Slurm (or
    under ``ftd run``, which sets the wait to 0 and ends its ranks itself), it exits at once."""
    if client.sigterm_at is None or not os.environ.get("SLURM_JOB_ID"):
        return
    wait = term_wait_s()
    if wait <= 0:
        return
    sys.stderr.write(
        f"ftd client: saved and stopped on SIGTERM; waiting up to {wait:.0f} s for Slurm to end the job "
        f"(a preempted job is requeued only if Slurm ends it; {TERM_WAIT_ENV}=0 exits at once)\n"
    )
    sys.stderr.flush()
    time.sleep(wait)


def _close_at_exit(ref: weakref.ref[Client]) -> None:
    """At interpreter exit: :meth:`Client.close` (acknowledges a stop the loop broke on); after a
    SIGTERM under Slurm, :func:`_wait_for_slurm`."""
    client = ref()
    if client is not None:
        client.close()
        with contextlib.suppress(Exception):
            _wait_for_slurm(client)
