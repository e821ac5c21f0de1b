"""The checkpoint bench's fault cases (issue #34): what is injected, what is on disk, and the verdict.

What: the five cases of ``ftd bench checkpoint --cases`` that break a checkpoint rather than time one:

- ``kill_mid_save``: a node's ranks and its agent SIGKILLed while a save's background write runs;
- ``local_deleted``: a node's local checkpoint directory deleted (the node replaced by a spare);
- ``flip_byte``: one byte of a rank's newest shard inverted (size unchanged: only the hash sees it);
- ``truncate``: a rank's newest shard cut short;
- ``missing_manifest``: a rank's newest manifest removed.

This module holds the parts that do not need a running job, so they are tested on real files without
one: :func:`inject` (the fault, on real files), :func:`scan` (every checkpoint copy under the job's
directories, each rank's manifest verified with :func:`ftd.client.manifest.verify`, the same code the
trainer wrote with and the agent checks with), and :func:`judge` (pure: what was verified after the
fault and where every rank resumed -> the case's :class:`Outcome`). A resume is *right* when every
rank resumed, at the same step, from a checkpoint complete and verified at the level it names, and
never from one newer than the newest verified; it also reports the steps lost, whether the resume
was from the newest verified checkpoint, from a fast level (``local``/``partner``: no shared-directory
read) and at most one save interval old -- the targets of a node killed without warning.

Why apart from the runner: the verdict must not depend on the job's own account of itself (a trainer
that claims a step is checked against the files), and the injectors must do exactly one thing each.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftd.client import manifest

__all__ = [
    "CASES",
    "CORRUPTIONS",
    "FAST_LEVELS",
    "Copy",
    "InjectError",
    "Outcome",
    "inject",
    "judge",
    "newest_verified",
    "scan",
    "verified_steps",
]

CASES = ("kill_mid_save", "local_deleted", "flip_byte", "truncate", "missing_manifest")
CORRUPTIONS = ("flip_byte", "truncate", "missing_manifest")  # a rank's newest copy broken on disk
FAST_LEVELS = ("local", "partner")  # restored without reading the shared directory
_MANIFEST_SUFFIX = ".manifest.json"


class InjectError(RuntimeError):
    """The fault could not be injected (nothing to break): the case did not run."""


@dataclass(frozen=True)
class Copy:
    """One checkpoint (``step``) at one ``level``: which ranks' manifests verified there."""

    step: int
    level: str
    world_size: int
    verified_ranks: frozenset[int]
    problems: tuple[str, ...]  # a reason per manifest that did not verify

    @property
    def complete(self) -> bool:
        """Every rank of the job has a verifying manifest at this level."""
        return self.world_size > 0 and self.verified_ranks >= frozenset(range(self.world_size))


def _manifests(root: Path) -> Iterable[Path]:
    for directory, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            if name.startswith("rank-") and name.endswith(_MANIFEST_SUFFIX):
                yield Path(directory) / name


def scan(
    roots: Iterable[Path], *, hashes: bool = True, generation: int | None = None
) -> dict[tuple[int, str], Copy]:
    """Every checkpoint copy under ``roots`` (a node's local directory, the shared one...), keyed by
    (step, level): each manifest verified against its files (``generation``: only the copies that
    generation wrote). A manifest that cannot be read counts for no step (its reason is kept under
    step -1, level ``unreadable``)."""
    ranks: dict[tuple[int, str], set[int]] = {}
    worlds: dict[tuple[int, str], int] = {}
    problems: dict[tuple[int, str], list[str]] = {}
    for root in roots:
        if not root.is_dir():
            continue
        for path in _manifests(root):
            found, reason = manifest.verify(str(path), hashes=hashes)
            if found is not None and generation is not None and found.generation != generation:
                continue
            key = (found.step, found.level) if found is not None else (-1, "unreadable")
            ranks.setdefault(key, set())
            problems.setdefault(key, [])
            if found is not None:
                worlds[key] = max(worlds.get(key, 0), found.world_size)
            if reason:
                problems[key].append(reason)
            elif found is not None:
                ranks[key].add(found.rank)
    return {
        key: Copy(key[0], key[1], worlds.get(key, 0), frozenset(ranks[key]), tuple(problems[key]))
        for key in ranks
    }


def verified_steps(copies: Mapping[tuple[int, str], Copy]) -> dict[int, dict[int, frozenset[str]]]:
    """step -> rank -> the levels at which that rank's copy verifies, for the steps every rank can
    load from some level (a checkpoint the job can resume from: ranks may load from different levels,
    e.g. a replaced node's rank from its partner's replica)."""
    by_step: dict[int, dict[int, set[str]]] = {}
    worlds: dict[int, int] = {}
    for (step, level), copy in copies.items():
        if step < 0:
            continue
        worlds[step] = max(worlds.get(step, 0), copy.world_size)
        for rank in copy.verified_ranks:
            by_step.setdefault(step, {}).setdefault(rank, set()).add(level)
    return {
        step: {rank: frozenset(levels) for rank, levels in sorted(ranks.items())}
        for step, ranks in by_step.items()
        if worlds[step] > 0 and set(ranks) >= set(range(worlds[step]))
    }


def newest_verified(copies: Mapping[tuple[int, str], Copy]) -> int | None:
    steps = verified_steps(copies)
    return max(steps) if steps else None


def _newest_shard(root: Path, rank: int | None) -> tuple[Path, manifest.Manifest]:
    """The newest verified manifest under ``root`` (of ``rank`` when given) and that manifest."""
    best: tuple[int, Path, manifest.Manifest] | None = None
    for path in _manifests(root):
        found, reason = manifest.verify(str(path), hashes=False)
        if found is None or reason or (rank is not None and found.rank != rank) or not found.files:
            continue
        if best is None or found.step > best[0]:
            best = (found.step, path, found)
    if best is None:
        raise InjectError(f"no checkpoint with files under {root} to break")
    return best[1], best[2]


def inject(case: str, root: Path, *, rank: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Break ``root`` (a node's local checkpoint directory) for ``case``; what was done, as a dict
    (``step``: the checkpoint broken, ``path``: the file). ``kill_mid_save`` breaks no file: the
    runner kills the processes. Raises InjectError when there is nothing to break."""
    rng = random.Random(seed)
    if case == "local_deleted":
        if not root.exists():
            raise InjectError(f"{root} does not exist")
        for _ in range(10):  # a thread of the dying process may still be writing there
            shutil.rmtree(root, ignore_errors=True)
            if not root.exists():
                break
        if root.exists():
            raise InjectError(f"{root} could not be deleted")
        return {"case": case, "path": str(root)}
    if case not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {case!r}: one of {', '.join(CORRUPTIONS)}, local_deleted")
    path, found = _newest_shard(root, rank)
    done: dict[str, Any] = {"case": case, "step": found.step, "rank": found.rank, "level": found.level}
    if case == "missing_manifest":
        path.unlink()
        done["path"] = str(path)
        return done
    sized = [f for f in found.files if f.size > 0]
    if not sized:
        raise InjectError(f"{path}: every file of step {found.step} is empty")
    entry = rng.choice(sized)
    target = path.parent / entry.path
    if case == "flip_byte":
        offset = rng.randrange(entry.size)
        with open(target, "r+b") as f:
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0xFF]))
            f.flush()
            os.fsync(f.fileno())
        done.update(path=str(target), offset=offset)
    else:  # truncate
        size = rng.randrange(entry.size)
        os.truncate(target, size)
        done.update(path=str(target), size=size, was=entry.size)
    return done


@dataclass(frozen=True)
class Outcome:
    """One run of one case (see the module docstring)."""

    case: str
    resumed_step: int | None  # the step every rank resumed from (None: they differ, or no resume)
    level: str | None  # the levels the ranks resumed from, comma-separated, when every rank said
    newest_verified: int | None  # after the fault, before the restart
    last_step: int | None  # the newest step trained before the fault
    steps_lost: int | None
    hang: bool
    consistent: bool  # every rank resumed, at the same step
    verified: bool  # that step complete and verified (at the level named, when one is)
    not_newer: bool  # never newer than the newest verified
    from_newest: bool
    fast_level: bool | None  # local or partner (None: no level named)
    within_interval: bool | None  # the checkpoint at most one save interval older than the fault
    right: bool
    why: str

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def judge(
    case: str,
    *,
    verified: Mapping[int, Mapping[int, Iterable[str]]],
    resumed: Mapping[int, tuple[int, str | None]],
    world_size: int,
    last_step: int | None,
    interval_steps: int | None = None,
    hang: bool = False,
) -> Outcome:
    """The verdict on one run: ``verified`` (step -> rank -> levels where that rank's copy verified,
    after the fault and before the restart: :func:`verified_steps`), ``resumed`` (rank -> (step,
    level) each rank of the new generation says it loaded), ``last_step`` (the newest step trained
    before the fault), ``interval_steps`` (the save interval), ``hang`` (no resume before the
    deadline)."""
    table = {step: {r: frozenset(ls) for r, ls in ranks.items()} for step, ranks in verified.items()}
    newest = max(table) if table else None
    steps = {s for s, _ in resumed.values()}
    consistent = not hang and set(resumed) == set(range(world_size)) and len(steps) == 1
    step = next(iter(steps)) if consistent else None
    used = sorted({lv for _, lv in resumed.values() if lv is not None}) if consistent else []
    named = consistent and all(lv is not None for _, lv in resumed.values())
    level = ",".join(used) if named else None
    why: list[str] = []
    if hang:
        why.append("no resume before the deadline")
    elif not consistent:
        missing = sorted(set(range(world_size)) - set(resumed))
        why.append(f"ranks did not resume at one step: {dict(sorted(resumed.items()))}, missing {missing}")
    if step is None:
        is_verified = not_newer = from_newest = False
    elif step == 0:  # from scratch: right only when nothing verified was left
        is_verified = newest is None
        not_newer = True
        from_newest = newest is None
        if newest is not None:
            why.append(f"started from scratch while step {newest} was verified")
    else:
        at = table.get(step, {})
        bad = [
            rank
            for rank, (_, lv) in sorted(resumed.items())
            if rank not in at or (lv is not None and lv not in at[rank])
        ]
        is_verified = bool(at) and not bad
        not_newer = newest is not None and step <= newest
        from_newest = step == newest
        if not is_verified:
            known = {s: {r: sorted(ls) for r, ls in rs.items()} for s, rs in sorted(table.items())}
            why.append(f"step {step} was not verified for ranks {bad or 'all'} (verified: {known})")
        if not not_newer:
            why.append(f"step {step} is newer than the newest verified ({newest})")
    fast = None if not named else all(lv in FAST_LEVELS for lv in used)
    lost = None if step is None or last_step is None else max(0, last_step - step)
    within = None if lost is None or interval_steps is None else lost <= interval_steps
    right = consistent and is_verified and not_newer
    return Outcome(
        case=case,
        resumed_step=step,
        level=level,
        newest_verified=newest,
        last_step=last_step,
        steps_lost=lost,
        hang=hang,
        consistent=consistent,
        verified=is_verified,
        not_newer=not_newer,
        from_newest=from_newest,
        fast_level=fast,
        within_interval=within,
        right=right,
        why="; ".join(why),
    )
