"""checkpoint_restart's path choice for a job run by rank supervisors (``ftd run``, issue #24).

What: :func:`choose` decides, as a pure function of what the coordinator knows, how a stopped job
comes back: **in place** (a new generation on the same slot nodes: an application fault, a hang),
with **spares** (each bad slot node's slot goes to a distinct eligible hot spare of the job's
allocation, a new generation on every slot), or through a **scheduler requeue** (the job has no
supervisors, the rule asked for one -- a job-wide fault --, or there are fewer eligible spares than
bad slots). Why apart: the choice is the part that must never be wrong (a spare that failed
preflight, sits on a drained node or was already tried must never be chosen; two bad slots must
never share a spare), so unit and property tests drive it without a bus or a scheduler.

*Bad slot node*: a slot with no node, or whose node is in ``unfit`` (the rule's ``exclude`` and
``avoid``, nodes offline, drained, with critical conditions, or whose supervisor failed or was lost
during this restart; a spare with version drift when ``coordinator.drift.action = no_spare``).
*Eligible spare*: role ``spare``, state ``idle``, preflight ``ok`` (or not run yet, only when
``allow_unchecked``), not in ``unfit``. Spares are taken in name order, so the same
picture always gives the same plan (a resumed action re-derives nothing it has recorded, but a
reader of the ledger can replay it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ftd.events import SupervisorInfo

Path = Literal["in_place", "spare", "requeue"]


@dataclass(frozen=True)
class Choice:
    """What :func:`choose` decided: ``path``; for the in-allocation paths the ``generation`` to start,
    the node of each slot (``slots``), the nodes the job no longer uses (``out``; for a requeue: the
    bad slot nodes the scheduler must exclude), the eligible spares left after this choice
    (``spares_left``); ``why`` says why in one sentence (a requeue's reason)."""

    path: Path
    why: str
    generation: int | None = None
    slots: list[str] = field(default_factory=list)
    out: list[str] = field(default_factory=list)
    spares_left: int = 0
    swapped: dict[str, str] = field(default_factory=dict)  # bad slot node (or "slot N") -> its spare

    def detail(self) -> dict[str, Any]:
        """The action detail keys of this choice (checkpoint_restart's "requeue" phase)."""
        if self.path == "requeue":
            return {"path": "requeue", "restart_why": self.why, "out": list(self.out)}
        return {
            "path": self.path,
            "generation": self.generation,
            "slots": list(self.slots),
            "out": list(self.out),
            "spares_left": self.spares_left,
            "swapped": dict(self.swapped),
            "restart_why": self.why,
            "requeued": None,
        }


def eligible(info: SupervisorInfo, *, allow_unchecked: bool) -> bool:
    """Whether a supervisor's node may take a slot as a spare (its node's health is checked apart)."""
    passed = info.preflight == "ok" or (info.preflight is None and allow_unchecked)
    return info.role == "spare" and info.state == "idle" and passed


def next_generation(supervisors: Mapping[str, SupervisorInfo], *, at_least: int = 0) -> int:
    """A generation newer than any of the job's supervisors reports (and not below ``at_least``: one
    already sent during this restart), so no rank of an older generation can ever join it."""
    newest = max((s.generation for s in supervisors.values()), default=-1)
    return max(newest + 1, at_least)


def choose(
    slots: Sequence[str | None],
    supervisors: Mapping[str, SupervisorInfo],
    unfit: Mapping[str, str],
    *,
    generation: int,
    requeue_asked: str | None = None,
    allow_unchecked: bool = False,
) -> Choice:
    """The path for a job with ``slots`` (node per slot, None for a slot nobody holds) and these
    ``supervisors`` (node -> info), given the nodes that cannot hold a slot (``unfit``: node -> why).
    ``requeue_asked``: the rule's reason for a scheduler requeue (a job-wide fault), or None."""
    if not supervisors or not slots:
        return Choice("requeue", "the job has no rank supervisors (ftd run): the scheduler requeues it")
    if requeue_asked:
        return Choice("requeue", f"a scheduler requeue was asked: {requeue_asked}")
    bad = [i for i, node in enumerate(slots) if node is None or node in unfit]
    used = {n for n in slots if n is not None}
    spares = sorted(
        n
        for n, info in supervisors.items()
        if n not in unfit and n not in used and eligible(info, allow_unchecked=allow_unchecked)
    )
    if len(spares) < len(bad):
        names = ", ".join(_slot_name(slots, i) for i in bad)
        why = (
            f"{len(bad)} slot node(s) must be replaced ({names}) but the allocation has "
            f"{len(spares)} eligible spare(s): the scheduler requeues the job without the bad nodes"
        )
        return Choice("requeue", why, out=sorted({n for i in bad if (n := slots[i]) is not None}))
    new_slots = [n for n in slots if n is not None] if not bad else []
    swapped: dict[str, str] = {}
    if bad:
        take = iter(spares)
        new_slots = []
        for i, node in enumerate(slots):
            if i in bad:
                spare = next(take)
                swapped[_slot_name(slots, i)] = spare
                new_slots.append(spare)
            else:
                assert node is not None
                new_slots.append(node)
    left = len(spares) - len(bad)
    out = sorted(
        ({n for n in slots if n is not None} - set(new_slots))
        | {n for n, s in supervisors.items() if s.role == "out" and n not in new_slots}
    )
    if not bad:
        why = f"restart in place: generation {generation} on the same {len(new_slots)} node(s)"
        return Choice("in_place", why, generation, new_slots, out, left)
    moves = ", ".join(f"{old} -> {new}" for old, new in swapped.items())
    why = f"swap in spares ({moves}): generation {generation}, {left} eligible spare(s) left"
    return Choice("spare", why, generation, new_slots, out, left, swapped)


def _slot_name(slots: Sequence[str | None], index: int) -> str:
    node = slots[index]
    return node if node is not None else f"slot {index}"
