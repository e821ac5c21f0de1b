"""Which checkpoints a rank may delete: keep the newest N complete ones, never the last verified.

What: :func:`plan` takes one level's checkpoints as ``(step, complete)`` pairs (complete: this
rank's manifest there verifies) and returns the steps to delete. Rules, in order:

- the newest ``keep`` complete checkpoints stay;
- the newest complete checkpoint stays whatever ``keep`` says (it is what a restart resumes from);
- an incomplete checkpoint newer than the newest complete one stays (a save may still be writing
  it); older incomplete ones go (an interrupted save that will never finish).

Pure and standard library only: the checkpoint tier lists the directories and verifies the
manifests, this decides; unit and property tests pin the rules.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["plan"]


def plan(checkpoints: Iterable[tuple[int, bool]], keep: int) -> list[int]:
    """The steps to delete, oldest first (``keep`` < 1 counts as 1)."""
    complete: dict[int, bool] = {}
    for step, ok in checkpoints:
        complete[step] = complete.get(step, False) or bool(ok)
    done = sorted((s for s, ok in complete.items() if ok), reverse=True)
    kept = set(done[: max(1, keep)])
    newest = done[0] if done else None
    delete = []
    for step in sorted(complete):
        if step in kept:
            continue
        if not complete[step] and (newest is None or step > newest):
            continue  # maybe still being written
        delete.append(step)
    return delete
