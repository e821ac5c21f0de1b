"""A burn-in's report, and its throughput compared with the profile and the fleet.

What: :class:`StepResult` is one step's outcome (``pass`` | ``fail`` | ``skip``, a reason, figures);
:class:`BurnInReport` the whole run with its verdict; :func:`judge_throughput` decides the
matrix-multiply step from each GPU's measured TFLOPS.

Verdicts: ``passed`` (every step ran and passed), ``failed`` (a step failed: the first one is the
reason), ``incomplete`` (none failed but a step was skipped: its tool, GPU or partner was absent, so
the node did not show it is fit; a gate that requires burn-in does not take it), ``refused`` (the
node was training: nothing ran). Pure: the agent runs the steps, the coordinator reads the report.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["BurnInReport", "StepResult", "judge_throughput"]

Status = Literal["pass", "fail", "skip"]
Verdict = Literal["passed", "failed", "incomplete", "refused"]


@dataclass(frozen=True)
class StepResult:
    name: str
    status: Status
    reason: str
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "reason": self.reason,
            "figures": self.figures,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class BurnInReport:
    node: str
    started: float
    finished: float = 0.0
    steps: list[StepResult] = field(default_factory=list)
    refused: str = ""
    profile: str | None = None

    @property
    def verdict(self) -> Verdict:
        if self.refused:
            return "refused"
        if any(s.status == "fail" for s in self.steps):
            return "failed"
        if not self.steps or any(s.status == "skip" for s in self.steps):
            return "incomplete"
        return "passed"

    @property
    def ok(self) -> bool:
        return self.verdict == "passed"

    @property
    def reason(self) -> str:
        verdict = self.verdict
        if verdict == "refused":
            return f"refused: {self.refused}"
        if verdict == "failed":
            step = next(s for s in self.steps if s.status == "fail")
            return f"{step.name}: {step.reason}"
        skipped = [f"{s.name}: {s.reason}" for s in self.steps if s.status == "skip"]
        if verdict == "incomplete":
            return "not every step ran (" + "; ".join(skipped or ["no step"]) + ")"
        return f"{len(self.steps)} step(s) passed"

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "profile": self.profile,
            "verdict": self.verdict,
            "ok": self.ok,
            "reason": self.reason,
            "started": self.started,
            "finished": self.finished,
            "steps": [s.to_dict() for s in self.steps],
        }

    def text(self) -> str:
        lines = [f"burn-in on {self.node} (profile {self.profile or 'none'}): {self.verdict}: {self.reason}"]
        for step in self.steps:
            lines.append(f"  {step.name:12} {step.status:4} {step.seconds:8.1f} s  {step.reason}".rstrip())
        return "\n".join(lines) + "\n"


def judge_throughput(
    tflops: dict[str, float],
    *,
    expected: float | None,
    min_fraction: float,
    fleet: float | None = None,
    fleet_min_fraction: float | None = None,
) -> StepResult:
    """The ``matmul`` step from each GPU's TFLOPS: a GPU below ``min_fraction`` of the profile's
    ``expected`` figure, or below ``fleet_min_fraction`` of the fleet's (the peers' median), or below
    ``fleet_min_fraction`` of this node's own median (one slow GPU among eight) fails. With neither a
    profile figure nor a fleet figure only the node's own spread is judged, and the reason says so."""
    if not tflops:
        return StepResult("matmul", "fail", "no GPU reported a figure")
    own = statistics.median(tflops.values())
    slow: list[str] = []
    why: list[str] = []
    for gpu, value in sorted(tflops.items()):
        if expected is not None and value < expected * min_fraction:
            slow.append(gpu)
            why.append(f"GPU {gpu} {value:.1f} TFLOPS < {min_fraction:.0%} of the profile's {expected:g}")
        elif fleet is not None and fleet_min_fraction is not None and value < fleet * fleet_min_fraction:
            slow.append(gpu)
            why.append(f"GPU {gpu} {value:.1f} TFLOPS < {fleet_min_fraction:.0%} of the fleet's {fleet:g}")
        elif fleet_min_fraction is not None and value < own * fleet_min_fraction:
            slow.append(gpu)
            why.append(
                f"GPU {gpu} {value:.1f} TFLOPS < {fleet_min_fraction:.0%} of this node's median {own:.1f}"
            )
    figures = {"tflops": dict(sorted(tflops.items())), "expected": expected, "fleet": fleet, "median": own}
    if slow:
        return StepResult("matmul", "fail", "; ".join(why[:4]), figures)
    against = [x for x, v in (("the profile", expected), ("the fleet", fleet)) if v is not None]
    said = " and ".join(against) if against else "this node's own GPUs only (no profile or fleet figure)"
    return StepResult(
        "matmul", "pass", f"{len(tflops)} GPU(s), median {own:.1f} TFLOPS, against {said}", figures
    )
