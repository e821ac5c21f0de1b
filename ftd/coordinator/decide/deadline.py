"""The decision against an interruption's deadline (issue #37): save fully, save fast, or not at all.

What: :func:`decide_save` takes the time now, the deadline (epoch seconds, when the work is killed),
the job's p95 save time per checkpoint level (:class:`ftd.coordinator.model.save_times.SaveTimes`),
the job's usual level and a stop margin, and answers a :class:`SaveDecision`:

* ``full`` -- the usual level's p95 plus the margin fits in the time left: save as the job always does;
* ``fast`` -- only the node-local level (``local``) fits: save there, the tier copies it on later;
* ``none`` -- no save fits: stop cleanly now and resume from the last verified checkpoint.

A level with no recorded save uses :data:`ASSUMED_P95_S` (documented in docs/deadlines.md): a guess on
the slow side, so without a model ftd rather skips a save than loses the job inside one.

A deadline that cannot be real (:func:`ftd.plugin.deadline.check_deadline`: not a finite number,
already past, or more than 30 days ahead) raises :class:`BadDeadline` with the reason; the caller
logs it and acts on nothing (the gate fails closed). Pure: no clock, no I/O.

Properties (tests/unit/test_deadline_decision.py): monotone in the time left (more time never gives a
lesser choice), never a save whose p95 plus the margin exceeds the time left.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ftd.coordinator.model.save_times import DEFAULT_LEVEL
from ftd.plugin.deadline import MAX_AHEAD_S, BadDeadline, check_deadline

__all__ = ["MAX_AHEAD_S", "BadDeadline", "SaveDecision", "check_deadline", "decide_save"]

Choice = Literal["full", "fast", "none"]
#: Choices, least first (the order the monotonicity property is stated in).
ORDER: tuple[Choice, ...] = ("none", "fast", "full")
#: The node-local level, the fastest a checkpoint tier has.
FAST_LEVEL = "local"
#: The stop margin's default: time kept after the save for the stop to reach every rank.
DEFAULT_MARGIN_S = 5.0
#: The p95 assumed for a level with no recorded save: slow on purpose (see the module docstring).
ASSUMED_P95_S: dict[str, float] = {"local": 30.0, "partner": 60.0, "shared": 120.0, DEFAULT_LEVEL: 120.0}


@dataclass(frozen=True)
class SaveDecision:
    """What to do before the deadline. ``level`` is the level to save at (None for ``none``);
    ``time_left_s`` the seconds to the deadline; ``save_wait_s`` how long the save may take (time left
    less the margin, 0 for ``none``); ``p95_s`` the p95 the choice relied on (None for ``none``);
    ``assumed`` whether that p95 was the default assumption; ``reason`` the decision in words."""

    choice: Choice
    level: str | None
    time_left_s: float
    save_wait_s: float
    p95_s: float | None
    assumed: bool
    reason: str

    def as_params(self) -> dict[str, object]:
        """The decision as an action's params (JSON-safe)."""
        return {
            "choice": self.choice,
            "level": self.level,
            "time_left_s": round(self.time_left_s, 3),
            "save_wait_s": round(self.save_wait_s, 3),
            "p95_s": self.p95_s,
            "assumed": self.assumed,
            "reason": self.reason,
        }


def decide_save(
    now: float,
    deadline: float,
    p95_s: dict[str, float],
    usual_level: str | None = None,
    margin_s: float = DEFAULT_MARGIN_S,
    max_ahead_s: float = MAX_AHEAD_S,
) -> SaveDecision:
    """The decision (see the module docstring). ``usual_level`` None means the job's own choice
    (recorded as ``default``)."""
    if not math.isfinite(margin_s) or margin_s < 0:
        raise ValueError(f"stop margin {margin_s!r} must be a finite number >= 0")
    left = check_deadline(now, deadline, max_ahead_s)
    budget = left - margin_s
    usual = usual_level or DEFAULT_LEVEL
    candidates: list[tuple[Choice, str]] = [("full", usual)]
    if usual != FAST_LEVEL:
        candidates.append(("fast", FAST_LEVEL))
    for choice, level in candidates:
        known = p95_s.get(level)
        usable = known is not None and math.isfinite(known) and known >= 0
        p95 = (
            known if usable and known is not None else ASSUMED_P95_S.get(level, ASSUMED_P95_S[DEFAULT_LEVEL])
        )
        if p95 <= budget:
            how = "assumed" if not usable else "recorded"
            return SaveDecision(
                choice,
                level,
                left,
                budget,
                p95,
                not usable,
                f"{level} save p95 {p95:.1f} s ({how}) + margin {margin_s:.1f} s fits in {left:.1f} s left",
            )
    return SaveDecision(
        "none",
        None,
        left,
        0.0,
        None,
        False,
        f"no save fits in {left:.1f} s left (margin {margin_s:.1f} s): stop now, resume from the last "
        "verified checkpoint",
    )
