"""Which checkpoints of each job are whole, where, and which one a restart resumes from (issue #34).

What: :class:`CheckpointCatalogue` folds the agents' ``checkpoint`` events (a rank's manifest verified
or rejected on its node, :mod:`ftd.agent.checkpoints`) into, per job, step and level (``local``,
``partner``, ``shared``), which shards verified and on which node each copy lives.
:meth:`CheckpointCatalogue.choose` picks the resume checkpoint: the newest step, not quarantined, of
which *every* shard (``0 .. world_size-1``) has a verified copy a restart can read -- a ``local`` or
``partner`` copy on a node that is not lost, else the ``shared`` copy -- and says at which level (the
slowest any shard needs) and why. :meth:`quarantine` takes a step out (a copy rejected after it had
verified, or a generation that resumed from it and failed before training a step).

Why here: the choice needs what only the coordinator knows (which nodes died or were swapped out,
which saves completed on every rank), and it must be cheap: a job with 1,000 checkpoint steps is chosen
in well under a second (one pass over the job's steps, newest first). It is plain data, rebuilt from
the ledger's recent events at start-up like the rest of :class:`~ftd.coordinator.model.state.ClusterState`.

A copy the agent says was deleted since it verified (``deleted: true``: the tier's retention, or an
operator's ``rm``; :class:`ftd.agent.checkpoints.VerifiedCopies`) is dropped: not a rejection, not a
quarantine, just no longer a place to resume from.

Bounded: :data:`STEPS_KEPT` newest steps per job (older ones are forgotten, not deleted anywhere).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from ftd.events import Event, Kind

__all__ = ["LEVELS", "STEPS_KEPT", "CheckpointCatalogue", "Copy", "ResumeChoice"]

LEVELS = ("local", "partner", "shared")  # fastest first
STEPS_KEPT = 2048


@dataclass(frozen=True)
class Copy:
    """One verified copy of one shard."""

    node: str
    level: str
    root: str  # the checkpoint's directory on that node (the step's, holding the manifests)
    ts: float


@dataclass
class _Step:
    world_size: int | None = None
    copies: dict[int, list[Copy]] = field(default_factory=dict)  # shard rank -> its verified copies
    rejected: dict[str, str] = field(default_factory=dict)  # "node/level/rank" -> why
    save_s: float | None = None  # the longest save time a rank reported for this step
    newest_ts: float = 0.0


@dataclass(frozen=True)
class ResumeChoice:
    step: int
    level: str  # the slowest level any shard is read from
    root: str  # that level's checkpoint directory, for FTD_RESUME_PATH
    why: str

    def as_params(self) -> dict[str, Any]:
        return {"step": self.step, "level": self.level, "path": self.root, "why": self.why}


class CheckpointCatalogue:
    def __init__(self) -> None:
        self._jobs: dict[str, dict[int, _Step]] = {}
        self._quarantined: dict[str, dict[int, str]] = {}

    # --- updates -------------------------------------------------------------------------------

    def note(self, event: Event) -> None:
        """Fold one ``checkpoint`` event in (other kinds are ignored; bad fields are ignored)."""
        if event.kind != Kind.CHECKPOINT:
            return
        data = event.data
        job, step, level = data.get("job"), _nonneg(data.get("step")), data.get("level")
        if not isinstance(job, str) or step is None or level not in LEVELS:
            return
        steps = self._jobs.setdefault(job, {})
        if data.get("deleted") is True:  # a copy that verified and is gone since: no longer a choice
            self._deleted(steps, step, event.node, level, _nonneg(data.get("shard_rank", data.get("rank"))))
            return
        entry = steps.get(step)
        if entry is None:
            entry = steps[step] = _Step()
            if len(steps) > STEPS_KEPT:
                del steps[min(steps)]
        shard = _nonneg(data.get("shard_rank", data.get("rank")))
        if shard is None:
            return
        key = f"{event.node}/{level}/{shard}"
        if not data.get("ok"):
            entry.rejected[key] = str(data.get("reason") or "rejected")[:300]
            copies = entry.copies.get(shard, [])
            entry.copies[shard] = [c for c in copies if not (c.node == event.node and c.level == level)]
            return
        world = _nonneg(data.get("world_size"))
        if world:
            entry.world_size = world
        root = data.get("root") if isinstance(data.get("root"), str) else ""
        copies = [c for c in entry.copies.get(shard, []) if not (c.node == event.node and c.level == level)]
        copies.append(Copy(node=event.node, level=level, root=root or "", ts=event.ts))
        entry.copies[shard] = copies
        entry.rejected.pop(key, None)
        entry.newest_ts = max(entry.newest_ts, event.ts)
        save_s = data.get("save_s")
        if isinstance(save_s, int | float) and not isinstance(save_s, bool):
            entry.save_s = max(entry.save_s or 0.0, float(save_s))

    @staticmethod
    def _deleted(steps: dict[int, _Step], step: int, node: str, level: str, shard: int | None) -> None:
        entry = steps.get(step)
        if entry is None or shard is None:
            return
        entry.copies[shard] = [
            c for c in entry.copies.get(shard, []) if not (c.node == node and c.level == level)
        ]
        if not any(entry.copies.values()) and not entry.rejected:
            del steps[step]

    def quarantine(self, job: str, step: int, why: str) -> None:
        self._quarantined.setdefault(job, {})[step] = why[:300]

    def forget(self, job: str) -> None:
        self._jobs.pop(job, None)
        self._quarantined.pop(job, None)

    # --- reading -------------------------------------------------------------------------------

    def jobs(self) -> list[str]:
        return sorted(self._jobs)

    def quarantined(self, job: str) -> Mapping[str, str]:
        return {str(s): why for s, why in sorted(self._quarantined.get(job, {}).items())}

    def newest_verified(self, job: str, level: str) -> tuple[int, float] | None:
        """(step, when its last shard verified) of the newest step whole at ``level`` on every rank."""
        bad = self._quarantined.get(job, {})
        for step in sorted(self._jobs.get(job, {}), reverse=True):
            entry = self._jobs[job][step]
            if step in bad or not entry.world_size:
                continue
            if all(any(c.level == level for c in entry.copies.get(r, ())) for r in range(entry.world_size)):
                return step, max(
                    c.ts for r in range(entry.world_size) for c in entry.copies[r] if c.level == level
                )
        return None

    def save_seconds(self, job: str) -> float | None:
        """The save time the ranks reported for the job's newest checkpoint that has one."""
        steps = self._jobs.get(job, {})
        for step in sorted(steps, reverse=True):
            if steps[step].save_s is not None:
                return steps[step].save_s
        return None

    def choose(self, job: str, lost_nodes: Collection[str] = ()) -> ResumeChoice | None:
        """The checkpoint a restart of ``job`` resumes from, or None when no step is whole anywhere a
        restart can read it. ``lost_nodes``: nodes whose disks the restart cannot read (dead, swapped
        out, excluded)."""
        bad = self._quarantined.get(job, {})
        lost = set(lost_nodes)
        skipped: list[str] = []
        for step in sorted(self._jobs.get(job, {}), reverse=True):
            entry = self._jobs[job][step]
            if step in bad:
                skipped.append(f"step {step} quarantined ({bad[step]})")
                continue
            if not entry.world_size:
                continue
            worst = 0
            roots: dict[str, str] = {}
            missing: list[int] = []
            for shard in range(entry.world_size):
                readable = [
                    c for c in entry.copies.get(shard, ()) if c.level == "shared" or c.node not in lost
                ]
                if not readable:
                    missing.append(shard)
                    continue
                best = min(readable, key=lambda c: LEVELS.index(c.level))
                worst = max(worst, LEVELS.index(best.level))
                roots.setdefault(best.level, best.root)
            if missing:
                skipped.append(f"step {step}: no readable verified copy of shard(s) {_ranges(missing)}")
                continue
            level = LEVELS[worst]
            why = f"newest step verified on all {entry.world_size} ranks with a copy a restart can read"
            if lost:
                why += f" (nodes lost: {', '.join(sorted(lost))})"
            if skipped:
                why += "; newer: " + "; ".join(skipped[:3])
            return ResumeChoice(step=step, level=level, root=roots.get(level, ""), why=why)
        return None


def _nonneg(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _ranges(numbers: list[int]) -> str:
    out: list[str] = []
    for n in sorted(numbers):
        if out and out[-1].split("-")[-1] == str(n - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ",".join(out)
