"""The node's ranks of one generation, as processes: start, watch, stop.

What: :class:`RankGroup`, the ``nproc`` rank processes of one generation. Each rank runs in a
process group (session) of its own, so stopping it reaches what it started too (data-loader workers,
a shell's children): SIGTERM to every group, SIGKILL to those still alive after the grace.
:meth:`RankGroup.poll` says how the ranks ended (:class:`Outcome`). Ranks are either started cold
(``subprocess.Popen`` of the training command) or handed to pre-started interpreters
(:mod:`ftd.supervisor.warm`). Why apart: process handling is the one place with signals and waits,
kept away from the supervisor's decisions.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

from ftd.supervisor import output

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["Outcome", "RankGroup"]

_log = logging.getLogger("ftd.supervisor")


class Outcome:
    """How a generation's ranks ended: ``running`` (some still run, none failed), ``done`` (all exited
    0) or ``failed`` (one exited non-zero: ``exit_code``, the first such)."""

    def __init__(self, state: str, exit_code: int | None = None) -> None:
        self.state = state
        self.exit_code = exit_code

    def __repr__(self) -> str:
        return f"Outcome({self.state!r}, {self.exit_code!r})"


def exit_code_of(returncode: int) -> int:
    """A shell-style exit code: 128 + N for a rank killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class RankGroup:
    """The ranks of generation ``generation`` on this node."""

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.procs: list[subprocess.Popen[bytes]] = []

    def start_cold(
        self,
        command: Sequence[str],
        envs: Sequence[Mapping[str, str]],
        cwd: str | None = None,
        *,
        labels: Sequence[bytes] | None = None,
    ) -> None:
        """Start one process of ``command`` per environment in ``envs`` (each in its own session).
        ``labels``: one per process, put in front of every line of its stdout and stderr
        (:mod:`ftd.supervisor.output`); None: the ranks write to this process's own streams."""
        for index, env in enumerate(envs):
            if labels is None:
                proc = subprocess.Popen(list(command), env=dict(env), cwd=cwd, start_new_session=True)
            else:
                proc = subprocess.Popen(
                    list(command),
                    env=dict(env),
                    cwd=cwd,
                    start_new_session=True,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                assert proc.stdout is not None and proc.stderr is not None
                output.pump(labels[index], proc.stdout)
                output.pump(labels[index], proc.stderr, sys.stderr.buffer)
            self.procs.append(proc)

    def adopt(self, proc: subprocess.Popen[bytes]) -> None:
        """Take a rank started elsewhere (a pre-started interpreter given its script)."""
        self.procs.append(proc)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def poll(self) -> Outcome:
        codes = [p.poll() for p in self.procs]
        for code in codes:
            if code is not None and code != 0:
                return Outcome("failed", exit_code_of(code))
        if codes and all(code == 0 for code in codes):
            return Outcome("done", 0)
        return Outcome("running")

    def alive(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def stop(self, grace_s: float) -> None:
        """SIGTERM every rank's process group; SIGKILL what is left after ``grace_s``; reap them."""
        if not self.procs:
            return
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.alive():
            _log.warning(
                "ftd run: ranks of generation %d still alive %.1f s after SIGTERM: SIGKILL",
                self.generation,
                grace_s,
            )
        self._signal(signal.SIGKILL)  # also whatever the ranks left behind in their groups
        for proc in self.procs:
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                _log.error("ftd run: rank pid %d did not die after SIGKILL", proc.pid)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to every rank's process group (the ranks and what they started)."""
        self._signal(sig)

    def _signal(self, sig: int) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, sig)  # its own session: the group id is its pid
            except ProcessLookupError:
                pass  # the group is empty: the rank and everything it started are gone
            except PermissionError:
                _log.warning("ftd run: no permission to signal rank pid %d", proc.pid)
