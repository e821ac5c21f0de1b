"""Whether an interruption's deadline can be real (issue #37), for rules and the coordinator alike.

What: :func:`check_deadline` answers the seconds left until a deadline (epoch seconds) or raises
:class:`BadDeadline` with the reason: not a finite number, already past, or more than
:data:`MAX_AHEAD_S` ahead (a clock or unit error: milliseconds read as seconds land ~50 000 years
ahead). Why here: the interruption rule (ftd.rules) and the decision in the coordinator
(:mod:`ftd.coordinator.decide.deadline`) must refuse the same deadlines, and rules import only the
plugin contract. Pure: the caller passes "now".
"""

from __future__ import annotations

import math

#: A deadline further ahead than this is refused (30 days: maintenance is announced days ahead).
MAX_AHEAD_S = 30 * 86400.0


class BadDeadline(ValueError):
    """A deadline that cannot be real; ``reason`` says why in words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def check_deadline(now: float, deadline: object, max_ahead_s: float = MAX_AHEAD_S) -> float:
    """Seconds left until ``deadline``; raises :class:`BadDeadline` when it cannot be real."""
    if isinstance(deadline, bool) or not isinstance(deadline, int | float) or not math.isfinite(deadline):
        raise BadDeadline(f"deadline {deadline!r} is not a finite number of epoch seconds")
    left = float(deadline) - now
    if left <= 0:
        raise BadDeadline(f"deadline is {-left:.1f} s in the past")
    if left > max_ahead_s:
        raise BadDeadline(
            f"deadline is {left:.0f} s ahead, more than {max_ahead_s:.0f} s: a clock or unit error"
        )
    return left
