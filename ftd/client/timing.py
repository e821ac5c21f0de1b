"""Per-rank step timing, kept in the training process and sent with its heartbeats (issue #33).

What: :class:`StepClock` counts, from the ``heartbeat(step)`` calls, how many steps the rank made and
how long they took, and, where the training code reports the time it spent blocked in collectives
(:meth:`StepClock.waited`; the torch helper does it for DDP's gradient all-reduce and its own
agreement all-reduce, :mod:`ftd.client.torch`), how much of each step was the rank's own work (the
rest). Why that split: in synchronous data parallelism every rank's step lasts as long as the
slowest one (they all wait in the all-reduce), so step durations are equal across ranks; the time
outside the collectives is what differs (the slow rank arrives last and waits least).

The counters are cumulative since the clock started: the heartbeat carries the latest totals (no
extra message per step), and a heartbeat lost or a presence report throttled loses nothing (the
coordinator takes differences). Hot-path cost: one ``time.monotonic()`` and a few additions per step.
Standard library only, Python 3.9 (it runs inside every training process).
"""

from __future__ import annotations

import time

TYPE_CHECKING = False  # not imported from typing: keeps `import ftd.client` light
if TYPE_CHECKING:
    from typing import Any

__all__ = ["StepClock"]


class StepClock:
    """Step counters of one rank. Not thread-safe by design: the training thread writes, the I/O
    thread reads a snapshot of three numbers (a torn read costs one sample, never an error)."""

    __slots__ = ("_last_step", "_start", "_wait", "compute_s", "marked", "step_s", "steps")

    def __init__(self) -> None:
        self._start: float | None = None
        self._wait = 0.0  # seconds blocked in collectives since the last beat
        self._last_step: int | None = None
        self.steps = 0
        self.step_s = 0.0
        self.compute_s = 0.0
        self.marked = False  # a collective was ever marked: compute_s means something

    def beat(self, step: int | None, now: float | None = None) -> None:
        """A heartbeat: the step ``step`` ended (a repeated step number is not a new step)."""
        if step is not None and step == self._last_step:
            return
        now = time.monotonic() if now is None else now
        start, last = self._start, self._last_step
        self._start, self._last_step = now, step
        wait, self._wait = self._wait, 0.0
        if start is None:
            return  # the first beat starts the clock
        n = 1
        if step is not None and last is not None and step > last:
            n = step - last  # a loop that beats every few steps: each step gets its share
        elif step is not None and last is not None:
            return  # the step went back (a resume, a new epoch's numbering): restart the clock
        self.steps += n
        self.step_s += now - start
        if self.marked:
            self.compute_s += max(0.0, (now - start) - wait)

    def waited(self, seconds: float) -> None:
        """The rank spent ``seconds`` blocked in a collective (waiting for its peers) in this step."""
        if seconds >= 0:
            self._wait += seconds
            self.marked = True

    def snapshot(self) -> dict[str, Any] | None:
        """The counters for the heartbeat (None before the first full step)."""
        if not self.steps:
            return None
        return {
            "steps": self.steps,
            "step_s": round(self.step_s, 6),
            "compute_s": round(self.compute_s, 6) if self.marked else None,
        }
