"""Local triggers: the sources of save/stop inside the training process itself.

What: :class:`LocalTriggers`, the part of :class:`~ftd.client.Client` that maps signals (SIGUSR1
-> save, SIGTERM -> save then stop), the kill and save switch files, the memory guard and explicit requests
onto the same two flags a directive from the agent sets. Why apart: none of it talks to the agent,
and the signal-handler path has its own rule (touch plain attributes only: the handler runs between
two bytecodes of a thread that may hold the client's lock).

Default signal handling (issue #37): a scheduler ends a job with SIGTERM (Slurm's preemption and
time limit, ``scancel``, the kubelet) and SIGTERM's default action kills the process before it can
save. So a :class:`~ftd.client.Client` made in the main thread takes SIGTERM and SIGUSR1 where
nothing else did (their handler is still ``SIG_DFL``; a handler the user installed is never
replaced) and turns SIGTERM into save-then-stop, SIGUSR1 into a save: the loop's own
``should_save``/``should_stop`` calls then save and leave. A second SIGTERM (more than
:data:`TERM_REPEAT_S` after the first: Slurm and ``ftd run`` may both deliver the same one), or one
after the client was closed or collected, gets the default action (the process dies with 143 as before).
``$FTD_SIGNALS=0`` (or ``Client(signals=False)``) turns this off.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import weakref

from ftd.client import memory
from ftd.client.environment import env
from ftd.client.state import RankState

TYPE_CHECKING = False  # not imported from typing: keeps `import ftd.client` light
if TYPE_CHECKING:
    from typing import Any

__all__ = ["AUTO_SIGNALS", "LocalTriggers", "signals_off"]

#: The signals a client takes by default where their handler is ``SIG_DFL``.
AUTO_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
#: A SIGTERM this soon after the first is the same one by another path (Slurm signals every process
#: of a step, and ``ftd run`` forwards it to its ranks too): not a second one.
TERM_REPEAT_S = 2.0
_OFF = ("0", "false", "no", "off")


def signals_off() -> bool:
    """True when ``$FTD_SIGNALS`` turns the default signal handling off."""
    return (env("FTD_SIGNALS") or "").strip().lower() in _OFF


def _default_action(signum: int) -> None:
    """Put back ``SIG_DFL`` for ``signum`` and raise it again: the process gets the default action."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


class _WeakHandler:
    """The handler installed by default: forwards to a live, open client; otherwise (the client was
    closed or collected) the signal's default action, as if no client had been there."""

    def __init__(self, client: LocalTriggers) -> None:
        self._client = weakref.ref(client)

    def __call__(self, signum: int, frame: Any) -> None:
        client = self._client()
        if client is None or client._closed.is_set():
            if client is not None and client._echo_of_sigterm(signum):
                return
            _default_action(signum)
            return
        client._on_signal(signum, frame)


_log = logging.getLogger("ftd.client")


class LocalTriggers(RankState):
    """Signals, switch files, memory guard and :meth:`request_save`/:meth:`request_stop`."""

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
        # helper thread set the Event. A stop (SIGTERM) is a save then a stop: the scheduler's
        # SIGTERM leaves a grace period before its SIGKILL, and the loop saves before it leaves.
        self._local_saves.add(reason)
        self._save = True
        if stop:
            if self.stop_reason is None:
                self.stop_reason = reason
            self._polls_at_term = self._save_polls
            self._stop = True
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

    def install_default_signal_handlers(self) -> list[int]:
        """What ``Client()`` does by default: take SIGTERM (save then stop) and SIGUSR1 (save) where
        their handler is still ``SIG_DFL``, from the main thread only, unless ``$FTD_SIGNALS=0``.
        Returns the signals taken (none elsewhere). :meth:`close` gives them back."""
        if signals_off() or threading.current_thread() is not threading.main_thread():
            return []
        taken: list[int] = []
        try:
            for signum in AUTO_SIGNALS:
                if signum in self._previous_handlers or signal.getsignal(signum) is not signal.SIG_DFL:
                    continue  # the user's (or another client's) handler stays
                self._previous_handlers[signum] = signal.signal(signum, _WeakHandler(self))
                taken.append(signum)
        except Exception:
            _log.warning("ftd client: could not install signal handlers", exc_info=True)
        if taken:
            _log.debug("ftd client: SIGTERM -> save then stop, SIGUSR1 -> save (FTD_SIGNALS=0: off)")
        return taken

    def install_signal_handlers(self) -> bool:
        """SIGUSR1 -> save, SIGTERM -> save then stop. Main thread only (Python's rule for signal handlers);
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

    def _echo_of_sigterm(self, signum: int) -> bool:
        """True for a SIGTERM within :data:`TERM_REPEAT_S` of the first (the same one, twice)."""
        first = self.sigterm_at
        return signum == signal.SIGTERM and first is not None and time.time() - first < TERM_REPEAT_S

    def _on_signal(self, signum: int, frame: Any) -> None:
        previous = self._previous_handlers.get(signum)
        if isinstance(previous, _WeakHandler):
            previous = None  # another client's default, not the user's: never chained (it may be closed)
        if self._echo_of_sigterm(signum):
            return
        if signum == signal.SIGTERM and self.sigterm_at is not None and not callable(previous):
            # A second SIGTERM: whoever sends it means it (and the save was already asked for).
            self._previous_handlers.pop(signum, None)
            _default_action(signum)
            return
        with contextlib.suppress(Exception):  # fail-open, even here
            if signum == signal.SIGTERM:
                self.sigterm_at = time.time()
            self._flag_from_signal(signum == signal.SIGTERM, signal.Signals(signum).name)
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
            self.memory_report, over = memory.readings(max_rss_fraction, gpu)
            if over:
                _log.warning("ftd client: memory guard: %s: saving and stopping", "; ".join(over))
                self.request_save("memory")
                self.request_stop("memory")
                return True
        except Exception:  # fail-open
            _log.debug("ftd client: memory guard failed", exc_info=True)
        return False
