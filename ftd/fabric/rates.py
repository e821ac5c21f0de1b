"""Counters as rates: a monotonic hardware counter's samples turned into increases and velocities.

What: :class:`CounterHistory` keeps one counter's recent samples (time, value) over a trailing
window (one hour by default) plus the one sample just before it, and answers :class:`Rate`: the
increase since the previous sample and per second over that interval, the increase over the window
(``per_hour`` is that increase when the history spans an hour or less -- never extrapolated from a
shorter span, so one symbol error in a 30 s poll is one error, not 120 per hour -- and the increase
averaged per hour over a longer span, as after an agent that was down two hours). A counter that went
down was reset or wrapped (a driver reload, ``perfquery -R``, a 32-bit wrap): the history restarts at
the new value with no rate, never a negative one. :meth:`CounterHistory.to_json` /
:meth:`CounterHistory.from_json` keep it across agent restarts (the agent saves it in its state dir),
so a rate over an hour spans the restart and a counter that rose while the agent was down is judged.
A run of one value is kept as its first and last sample, so a quiet counter's history is two
samples whatever the poll interval, and judges exactly as if every sample were kept.

:func:`saturated`: the IB PortCounters error counters are narrow (4 to 16 bits) and stop at their
maximum; one stopped there is not judged (it would read as "no new errors") but reported skipped.

Why a window and not the last two samples: the fabric's thresholds are standards' rates per hour
(the IBTA bit-error-rate limit as symbol errors per hour) and a burst between two polls is a
different fact from a sustained rate; both are answered here, with no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["HOUR_S", "IB_COUNTER_BITS", "CounterHistory", "Rate", "saturated"]

HOUR_S = 3600.0
#: Samples kept per counter inside the window (older ones inside it are thinned, oldest first).
MAX_SAMPLES = 128
#: The IB PortCounters error counters' widths (IBTA PortCounters attribute): they stop at their
#: maximum instead of wrapping, and a counter stopped there counts nothing more until it is reset.
IB_COUNTER_BITS = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
}


def saturated(source: str, counter: str, value: int) -> bool:
    """An IB error counter at its maximum: it can say nothing more until reset (``perfquery -R``)."""
    bits = IB_COUNTER_BITS.get(counter) if source == "ib" else None
    return bits is not None and value >= (1 << bits) - 1


@dataclass(frozen=True, slots=True)
class Rate:
    """One counter's motion at the latest sample."""

    value: int
    delta: int  # increase since the previous sample (0 on the first sample or after a reset)
    interval_s: float  # seconds since the previous sample (0.0 when there is none)
    per_s: float  # delta / interval_s (0.0 without an interval)
    window_increase: int  # increase since the oldest sample kept (the window's anchor)
    span_s: float  # seconds since that anchor
    per_hour: float  # window_increase, averaged per hour only when span_s is over an hour
    reset: bool = False  # the counter went down: history restarted here


class CounterHistory:
    """One monotonic counter's samples over a trailing ``window_s`` (module docstring)."""

    def __init__(self, window_s: float = HOUR_S, samples: list[tuple[float, int]] | None = None) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self.window_s = window_s
        self.samples: list[tuple[float, int]] = list(samples or [])

    def add(self, ts: float, value: int) -> Rate:
        """Record ``value`` read at ``ts``; the rate it makes with the history."""
        if value < 0:
            raise ValueError("a counter is never negative")
        last = self.samples[-1] if self.samples else None
        if last is not None and ts < last[0]:
            # The clock went back (NTP step): the history cannot be ordered; restart it.
            self.samples = []
            last = None
        if last is None:
            self.samples = [(ts, value)]
            return Rate(value, 0, 0.0, 0.0, 0, 0.0, 0.0)
        if value < last[1]:
            self.samples = [(ts, value)]
            return Rate(value, 0, 0.0, 0.0, 0, 0.0, 0.0, reset=True)
        self.samples.append((ts, value))
        if len(self.samples) >= 3 and self.samples[-3][1] == self.samples[-2][1] == value:
            del self.samples[-2]  # a run of one value is kept as its first and last sample
        self._prune(ts)
        interval = ts - last[0]
        delta = value - last[1]
        anchor_ts, anchor_value = self.samples[0]
        span = ts - anchor_ts
        increase = value - anchor_value
        if len(self.samples) > 1 and self.samples[1][1] == anchor_value:
            span = min(span, self.window_s)  # the value held from the anchor into the window: exact
        per_hour = float(increase) if span <= self.window_s else increase * HOUR_S / span
        per_s = delta / interval if interval > 0 else 0.0
        return Rate(value, delta, interval, per_s, increase, span, per_hour)

    def _prune(self, now: float) -> None:
        """Drop samples older than the window, keeping the newest of them as the anchor."""
        cut = now - self.window_s
        first_inside = next((i for i, (ts, _) in enumerate(self.samples) if ts >= cut), len(self.samples))
        if first_inside > 1:
            del self.samples[: first_inside - 1]
        if len(self.samples) > MAX_SAMPLES:  # keep the anchor and the newest; thin the middle
            middle = self.samples[1:-1][::2]
            self.samples = [self.samples[0], *middle, self.samples[-1]]

    def to_json(self) -> list[list[float]]:
        return [[ts, value] for ts, value in self.samples]

    @classmethod
    def from_json(cls, data: Any, window_s: float = HOUR_S) -> CounterHistory:
        """A history from :meth:`to_json`'s shape; anything else is an empty history (never a crash)."""
        samples: list[tuple[float, int]] = []
        if isinstance(data, list):
            for item in data:
                if (
                    isinstance(item, list)
                    and len(item) == 2
                    and isinstance(item[0], int | float)
                    and isinstance(item[1], int)
                    and not isinstance(item[1], bool)
                    and item[1] >= 0
                ):
                    if samples and (item[0] < samples[-1][0] or item[1] < samples[-1][1]):
                        return cls(window_s)  # out of order: not a history this module wrote
                    samples.append((float(item[0]), item[1]))
        return cls(window_s, samples[-MAX_SAMPLES:])
