"""What one recovery looked like, from the trainers' JSON lines and the coordinator's action detail.

What: :func:`timeline` (pure: records and times in, figures out) measures one fault's recovery of a
job run by :mod:`ftd.bench.recovery_trainer`. Every process's records carry its *incarnation*
``(restart, generation)`` (Slurm's restart count, ftd run's generation), so the incarnation training
when the fault was injected (*old*) and the first one after it that trained (*new*) are told apart
whatever path brought the job back (a new generation in the allocation, or a scheduler requeue that
starts generation 0 again with a higher restart count). Figures, in seconds after the fault:

- ``ranks_stopped_s``: the last record of the old incarnation's processes (the ``exit`` line each
  writes before it tears its process group down, or the last step of one that was killed);
- ``new_generation_started_s``: the first process of the new one started (``all_started_s``: the
  last); ``first_step_s``: the first step after the resume done on every rank.

And steps: ``save_step`` (the step every rank saved after the fault: the agreed save step; a
periodic checkpoint is not one), ``newest_checkpoint`` (the newest step the old incarnation saved
and recorded, agreed or periodic; 0: none), ``resumed_from`` (the checkpoint the new incarnation
loaded), ``steps_lost`` (saved but not resumed from: ``save_step - resumed_from``, or
``newest_checkpoint - resumed_from`` when no save followed the fault -- a rank that really stopped
cannot take part in one; 0 is the target), ``steps_redone`` (the old incarnation's last step minus
``resumed_from``: training done again after the resume, whatever the reason), ``steps_discarded``
(steps the old incarnation ran past the save before it stopped, redone after the resume: the save
margin's price),
``old_generation_ranks`` (ranks of the new incarnation whose rendezvous gathered another
generation: must be 0) and ``old_steps_after_new_start`` (steps an old process ran once a new one
had started: must be 0). Why apart: the bench and the e2e tests read the same figures the same way,
and the rules of reading are unit-tested without Slurm.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["Incarnation", "incarnation", "timeline"]

Incarnation = tuple[int, int]  # (Slurm restart count, ftd run generation)


def incarnation(record: Mapping[str, Any]) -> Incarnation:
    return int(record.get("restart") or 0), int(record.get("generation") or 0)


def _rel(t: float | None, fault_at: float) -> float | None:
    return None if t is None else round(t - fault_at, 3)


def _one(values: Iterable[int]) -> int | list[int] | None:
    """The single value, None for none, the sorted list when they differ (a defect to show)."""
    found = sorted(set(values))
    if not found:
        return None
    return found[0] if len(found) == 1 else found


def timeline(
    records: list[dict[str, Any]], fault_at: float, detail: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The figures of one recovery (see the module docstring); ``detail``: the coordinator's
    checkpoint_restart detail, whose times are given relative to the fault too. A figure that could
    not be measured (the job never came back) is None, never a guess."""
    by_inc: dict[Incarnation, list[dict[str, Any]]] = {}
    for r in records:
        by_inc.setdefault(incarnation(r), []).append(r)
    before = [incarnation(r) for r in records if r.get("what") == "step" and float(r["t"]) <= fault_at]
    old = max(before, default=None)
    after = sorted(i for i in by_inc if old is None or i > old)
    new = next((i for i in after if any(r.get("what") == "step" for r in by_inc[i])), None)
    out: dict[str, Any] = {"old": list(old) if old else None, "new": list(new) if new else None}

    old_recs = by_inc.get(old, []) if old is not None else []
    new_recs = by_inc.get(new, []) if new is not None else []
    saved = [
        int(r["step"])
        for r in old_recs
        if r.get("what") == "saved" and float(r["t"]) >= fault_at and not r.get("periodic")
    ]
    save_step = _one(saved)
    out["save_step"] = save_step
    newest = max((int(r["step"]) for r in old_recs if r.get("what") == "saved"), default=0)
    out["newest_checkpoint"] = newest
    # The old incarnation's processes: the last record of each is when it left (exit, or killed).
    last_by_pid: dict[int, float] = {}
    for r in old_recs:
        last_by_pid[int(r["pid"])] = max(last_by_pid.get(int(r["pid"]), 0.0), float(r["t"]))
    out["ranks_stopped_s"] = _rel(max(last_by_pid.values(), default=None), fault_at)
    old_steps = [int(r["step"]) for r in old_recs if r.get("what") == "step"]
    starts = [float(r["t"]) for r in new_recs if r.get("what") == "process_start"]
    out["new_generation_started_s"] = _rel(min(starts, default=None), fault_at)
    out["all_started_s"] = _rel(max(starts, default=None), fault_at)
    out["warm"] = sorted({bool(r.get("warm")) for r in new_recs if r.get("what") == "process_start"})
    resumed = _one(int(r["step"]) for r in new_recs if r.get("what") == "resumed")
    out["resumed_from"] = resumed
    new_steps = [r for r in new_recs if r.get("what") == "step"]
    first_step_s: float | None = None
    if new_steps:
        first = min(int(r["step"]) for r in new_steps)
        done = [float(r["t"]) for r in new_steps if int(r["step"]) == first]
        ranks = {int(r["rank"]) for r in new_steps if int(r["step"]) == first}
        world = {int(r["rank"]) for r in new_recs if r.get("what") == "rendezvous"}
        if ranks >= world:
            first_step_s = _rel(max(done), fault_at)
        out["first_step"] = first
    out["first_step_s"] = first_step_s
    kept = save_step if save_step is not None else newest  # a list (saves differ) is no figure
    out["steps_lost"] = kept - resumed if isinstance(kept, int) and isinstance(resumed, int) else None
    out["steps_redone"] = max(old_steps) - resumed if old_steps and isinstance(resumed, int) else None
    out["steps_discarded"] = max(old_steps) - save_step if old_steps and isinstance(save_step, int) else None
    rendezvous = [r for r in new_recs if r.get("what") == "rendezvous"]
    out["ranks"] = len(rendezvous)
    out["nodes"] = {str(r["rank"]): r.get("node") for r in sorted(rendezvous, key=lambda r: int(r["rank"]))}
    out["old_generation_ranks"] = sum(1 for r in rendezvous if not r.get("same"))
    new_start = min(starts, default=None)
    out["old_steps_after_new_start"] = (
        sum(1 for r in old_recs if r.get("what") == "step" and float(r["t"]) > new_start)
        if new_start is not None
        else None
    )
    if detail is not None:
        out["coordinator"] = coordinator_view(detail, fault_at)
    return out


def coordinator_view(detail: Mapping[str, Any], fault_at: float) -> dict[str, Any]:
    """The checkpoint_restart detail's path and times (seconds after the fault) the bench reports."""
    view: dict[str, Any] = {
        key: detail.get(key)
        for key in ("path", "generation", "slots", "out", "spares_left", "save_at_step", "resume_step")
        if key in detail
    }
    if "requeued" in detail:
        view["requeued"] = detail["requeued"] is not None
    for key in ("stopped_at", "requeued_at", "restart_sent_at", "restarted_at", "resumed_at"):
        value = detail.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            view[key.removesuffix("_at") + "_s"] = _rel(float(value), fault_at)
    return view
