"""Resume from the newest checkpoint every rank can load (issue #34): local, partner or shared.

::

    from ftd.client.resume import load_resume

    resumed = load_resume("/local/ckpt", "/shared/ckpt/job42")  # every rank calls it
    if resumed is not None:
        model.load_state_dict(resumed.state["model"]); opt.load_state_dict(resumed.state["optim"])
        start = resumed.step + 1

Which step: ``$FTD_RESUME_STEP`` when the restart set it (with ``$FTD_RESUME_PATH``, the checkpoint
directory the coordinator chose, and ``$FTD_RESUME_LEVEL``); else the newest step every rank can
get, agreed by all ranks. Where each rank's shard comes from, in order: ``$FTD_RESUME_PATH`` when it
holds this rank's manifest; this node's own ``local`` copy; a ``partner`` copy, sent over the gloo
group by the rank that holds it (a swapped-in spare has no local copy) and written into this rank's
local directory; the ``shared`` copy. Every manifest is verified (sizes and SHA-256,
:func:`ftd.client.manifest.verify`) before its state is loaded; nothing unverified is loaded.

Collective when torch.distributed is initialised: every rank calls it with the same arguments.
When some rank cannot load the asked step (a copy damaged after it verified: a flipped byte, a
truncation, a deleted directory), every rank takes the newest older step they can all load instead,
and says so in the log; RuntimeError (the same on every rank) only when no step is left.
"""

from __future__ import annotations

import logging
import os
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from ftd.client import manifest as mf
from ftd.client.checkpoint import PARTNER, STATE_FILE, exchange, rank_dir, step_dir, steps_in
from ftd.client.environment import env, env_int

__all__ = ["Resumed", "copy_into", "load_resume"]

_log = logging.getLogger("ftd.client")


class Resumed(NamedTuple):
    step: int
    level: str
    manifest: str  # the verified manifest the state was read from
    state: Any


def _verified(manifest: str, rank: int, step: int) -> bool:
    m, why = mf.verify(manifest)
    return m is not None and not why and m.rank == rank and m.step == step


def _own(root: str | None, rank: int, step: int) -> str | None:
    if not root:
        return None
    path = os.path.join(step_dir(root, step), mf.manifest_name(rank))
    return path if os.path.exists(path) else None


def _whole(root: str | None, rank: int, step: int) -> bool:
    """This rank's manifest at ``step`` under ``root`` is there and its files have their sizes (the
    cheap check, to choose a step; the chosen one is verified with hashes before it is loaded)."""
    path = _own(root, rank, step)
    if path is None:
        return False
    m, why = mf.verify(path, hashes=False)
    return m is not None and not why and m.rank == rank and m.step == step


def _inventory(local_dir: str, shared_dir: str | None, rank: int, world: int) -> dict[str, Any]:
    """The steps this rank can offer: its own local and shared copies, the partner copies it holds."""
    local = [s for s in steps_in(local_dir) if _whole(local_dir, rank, s)]
    shared = [s for s in steps_in(shared_dir) if _whole(shared_dir, rank, s)] if shared_dir else []
    partner_root = os.path.join(local_dir, PARTNER)
    held: dict[int, list[int]] = {}
    for s in steps_in(partner_root):
        for r in range(world):
            if _whole(partner_root, r, s):
                held.setdefault(s, []).append(r)
    return {"local": local, "shared": shared, "held": held}


def _choose_step(inv: list[dict[str, Any]], below: int | None = None) -> int | None:
    world = len(inv)
    candidates: set[int] = set()
    for i in inv:
        candidates.update(i["local"], i["shared"], i["held"])
    for step in sorted(candidates, reverse=True):
        if below is not None and step >= below:
            continue
        if all(_reachable(inv, r, step) for r in range(world)):
            return step
    return None


def _reachable(inv: list[dict[str, Any]], rank: int, step: int) -> bool:
    mine = inv[rank]
    return (
        step in mine["local"] or step in mine["shared"] or any(rank in i["held"].get(step, []) for i in inv)
    )


def load_resume(
    local_dir: str,
    shared_dir: str | None = None,
    *,
    group: Any = None,
    map_location: Any = "cpu",
    weights_only: bool = True,
) -> Resumed | None:
    """Load this rank's shard of the checkpoint to resume from (see the module docstring); None when
    there is none anywhere (a fresh start)."""
    local_dir = os.path.abspath(local_dir)
    shared_dir = os.path.abspath(shared_dir) if shared_dir else None
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else (env_int("RANK", "SLURM_PROCID") or 0)
    world = dist.get_world_size() if distributed else 1
    asked = env_int("FTD_RESUME_STEP")
    hint_path, hint_level = env("FTD_RESUME_PATH"), env("FTD_RESUME_LEVEL") or "local"
    inv = _inventory(local_dir, shared_dir, rank, world)
    if distributed:
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, inv, group=group)
        # json-like round trip turns the held dict's int keys into ints already (pickle): fine
    else:
        gathered = [inv]
    step = asked if asked is not None else _choose_step(gathered)
    if step is None:
        return None
    refused: list[str] = []
    while True:
        chosen, bad = _load_step(
            step, rank, world, local_dir, shared_dir, gathered, group, hint_path, hint_level
        )
        if not bad:
            break
        # A copy damaged after it verified (a flipped byte, a truncation, a deleted file): no rank
        # loads this step. Every rank saw the same ``bad`` (gathered), so all take the same older step,
        # instead of raising on every rank and failing the restart for good (issue #34).
        refused.append(f"step {step}: no verified checkpoint of rank(s) {bad} at any level")
        _log.warning("ftd resume: %s; trying an older step", refused[-1])
        hint_path = None  # the coordinator's path named the refused step
        step = _choose_step(gathered, below=step)
        if step is None:
            raise RuntimeError("no checkpoint every rank can load: " + "; ".join(refused))
    assert chosen is not None
    level, manifest = chosen
    m = mf.read(manifest)
    base = os.path.dirname(manifest)
    state_file = next((f.path for f in m.files if f.path.endswith(STATE_FILE)), m.files[0].path)
    state = torch.load(os.path.join(base, state_file), map_location=map_location, weights_only=weights_only)
    return Resumed(step, level, manifest, state)


def _load_step(
    step: int,
    rank: int,
    world: int,
    local_dir: str,
    shared_dir: str | None,
    gathered: list[Any],
    group: Any,
    hint_path: str | None,
    hint_level: str,
) -> tuple[tuple[str, str] | None, list[int]]:
    """This rank's verified manifest of ``step`` and the ranks (every rank's view, agreed through
    the group) that have none at any level. Collective when distributed."""
    distributed = dist.is_available() and dist.is_initialized()

    # The coordinator's path first, then local, then the partner copy (fetched), then shared.
    order: list[tuple[str, str | None]] = []
    if hint_path:
        hinted = os.path.join(hint_path, mf.manifest_name(rank))
        order.append((hint_level if hint_level in mf.LEVELS else "local", hinted))
    order.append(("local", _own(local_dir, rank, step)))
    chosen: tuple[str, str] | None = None
    for level, path in order:
        if path and os.path.exists(path) and _verified(path, rank, step):
            chosen = (level, path)
            break

    # Who lacks a verified local copy? Those get their partner copy from whoever holds it.
    need: list[Any] = [chosen is None]
    if distributed:
        needs: list[Any] = [None] * world
        dist.all_gather_object(needs, chosen is None, group=group)
    else:
        needs = need
    if distributed and any(needs):
        fetched = _fetch_partner_copies(local_dir, step, rank, world, needs, gathered, group)
        if chosen is None and fetched and _verified(fetched, rank, step):
            chosen = ("partner", fetched)
    if chosen is None and shared_dir:
        path = _own(shared_dir, rank, step)
        if path and _verified(path, rank, step):
            chosen = ("shared", path)
    failed: list[Any] = [chosen is None]
    if distributed:
        failed_all: list[Any] = [None] * world
        dist.all_gather_object(failed_all, chosen is None, group=group)
    else:
        failed_all = failed
    return chosen, [r for r, f in enumerate(failed_all) if f]


def _fetch_partner_copies(
    local_dir: str,
    step: int,
    rank: int,
    world: int,
    needs: list[Any],
    inv: list[dict[str, Any]],
    group: Any,
) -> str | None:
    """Every rank without a local copy gets its partner copy from the lowest rank holding one, into
    its own local directory (level ``local`` again once verified). Returns this rank's manifest."""
    holder: dict[int, int] = {}
    for r in range(world):
        if needs[r]:
            for h in range(world):
                if r in inv[h]["held"].get(step, []) and h != r:
                    holder[r] = h
                    break
    # One exchange round per needing rank, in rank order, so every pair agrees on the order.
    mine: str | None = None
    partner_root = os.path.join(local_dir, PARTNER)
    for r, h in sorted(holder.items()):
        if rank == h:
            path = os.path.join(step_dir(partner_root, step), mf.manifest_name(r))
            m, why = mf.verify(path)
            files = (
                []
                if m is None or why
                else [
                    (f.path, os.path.join(os.path.dirname(path), f.path), f.size, f.sha256) for f in m.files
                ]
            )
            exchange(group, step, files, r, [], local_dir)
        elif rank == r:
            got = exchange(group, step, [], None, [h], local_dir).get(h)
            if got:
                mine = mf.write(
                    step_dir(local_dir, step),
                    mf.Manifest(
                        job=env("FTD_JOB", "SLURM_JOB_ID") or "default",
                        step=step,
                        rank=rank,
                        world_size=world,
                        generation=env_int("FTD_GENERATION") or 0,
                        level="local",
                        created=os.path.getmtime(rank_dir(local_dir, step, rank)),
                        save_s=None,
                        files=tuple(got),
                    ),
                )
    return mine


def copy_into(target: Any, loaded: Any) -> None:
    """Copy a loaded state into a live one in place, tensor by tensor (a DTensor's local shard
    included): for FSDP models whose ``load_state_dict`` wants DTensors, same world size only."""
    if isinstance(target, dict):
        for k, v in target.items():
            if k in loaded:
                copy_into(v, loaded[k])
    elif isinstance(target, (list, tuple)):
        for i, t in enumerate(target):
            if i < len(loaded):
                copy_into(t, loaded[i])
    elif isinstance(target, torch.Tensor):
        local = target.to_local() if hasattr(target, "to_local") else target
        with torch.no_grad():
            local.copy_(loaded)
