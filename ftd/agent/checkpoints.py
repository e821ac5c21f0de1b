"""A rank's checkpoint report checked against its manifest before it counts (issue #34).

What: a rank reports every checkpoint it wrote (the ``checkpoint`` op of :mod:`ftd.client.protocol`:
step, manifest path, level, save time, size); :func:`verify_report` reads the manifest and every file
it names (:func:`ftd.client.manifest.verify`: existence, size, SHA-256) and returns the ``checkpoint``
event the agent publishes through its one door, ``ok`` or the reason it was rejected. A save
directive's acknowledgement that names a manifest (the tier acks with it) is relayed only once
:func:`verify_ack` found it whole; otherwise it reaches the coordinator as a failed save, with why.

Why here and this way: the coordinator counts a checkpoint only when the agent of the node holding it
says every file is whole, so a save interrupted at any point, a truncated shard or a flipped byte never
becomes the checkpoint a restart resumes from. Hashing a 1 GB shard takes seconds: it runs in a worker
thread (``asyncio.to_thread``), at most :data:`MAX_CONCURRENT` at once, never on the event loop.

Authority: the agent runs as root and the rank does not, so a manifest is followed only when it is
owned by the rank's own user (its connection's ``SO_PEERCRED`` uid) or by root; otherwise a rank could
make the agent read files it cannot read itself. The manifest's own checks refuse paths that leave the
checkpoint directory, links and non-regular files.
"""

from __future__ import annotations

import asyncio
import os
import time
import weakref
from dataclasses import dataclass

from ftd.client import manifest as mf
from ftd.events import Event, Kind, Severity, make_event

__all__ = [
    "MAX_CONCURRENT",
    "CheckpointReport",
    "VerifiedCopies",
    "names_manifest",
    "verify_ack",
    "verify_report",
]

MAX_CONCURRENT = 2  # manifests hashed at once (each streams its files in 4 MiB chunks)
# One bound per event loop: an asyncio.Semaphore belongs to the loop it first waited in.
_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _workers() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    slots = _slots.get(loop)
    if slots is None:
        slots = _slots[loop] = asyncio.Semaphore(MAX_CONCURRENT)
    return slots


@dataclass(frozen=True)
class CheckpointReport:
    """What a rank said (the decoded ``checkpoint`` op), with who said it."""

    node: str
    job: str
    rank: int
    step: int
    manifest: str
    level: str
    save_s: float | None
    nbytes: int | None
    directive_id: str | None
    uid: int | None  # the rank's connection's uid (None: the platform gives none, or any job allowed)


def _owner_refusal(path: str, uid: int | None) -> str:
    if uid is None or uid == 0:
        return ""
    try:
        owner = os.lstat(path).st_uid
    except OSError as exc:
        return f"{path}: cannot read the manifest: {exc.strerror or exc}"
    if owner not in (uid, 0):
        return f"{path}: the manifest belongs to uid {owner}, not to the rank's uid {uid}: not followed"
    return ""


def _check(report: CheckpointReport) -> tuple[mf.Manifest | None, str]:
    refusal = _owner_refusal(report.manifest, report.uid)
    if refusal:
        return None, refusal
    manifest, why = mf.verify(report.manifest)
    if manifest is None or why:
        return manifest, why
    if report.step >= 0 and manifest.step != report.step:
        return (
            manifest,
            f"{report.manifest}: the manifest is for step {manifest.step}, the rank said {report.step}",
        )
    if report.level and manifest.level != report.level:
        return (
            manifest,
            f"{report.manifest}: the manifest is level {manifest.level}, the rank said {report.level}",
        )
    if manifest.job and manifest.job != report.job:
        return manifest, f"{report.manifest}: the manifest is job {manifest.job}'s, not job {report.job}'s"
    return manifest, ""


def names_manifest(path: str | None) -> bool:
    """Whether a save's acknowledgement names a manifest (the tier acks with it), so the agent
    verifies it before the acknowledgement counts."""
    return path is not None and os.path.isabs(path) and path.endswith(mf.MANIFEST_SUFFIX)


async def verify_ack(report: CheckpointReport) -> str:
    """Why the manifest a save's acknowledgement names does not verify, or "" when it does (``step``
    -1 or ``level`` "" in ``report``: not compared). In a worker; never raises."""
    async with _workers():
        try:
            _manifest, why = await asyncio.to_thread(_check, report)
        except Exception as exc:
            why = f"{report.manifest}: verification failed: {type(exc).__name__}: {exc}"
    return why


async def verify_report(report: CheckpointReport) -> Event:
    """The ``checkpoint`` event for ``report``: verified in a worker thread; never raises for bad input."""
    started = time.monotonic()
    async with _workers():
        try:
            manifest, why = await asyncio.to_thread(_check, report)
        except Exception as exc:  # a filesystem error the checks did not foresee: rejected, said
            manifest, why = None, f"{report.manifest}: verification failed: {type(exc).__name__}: {exc}"
    ok = manifest is not None and not why
    data: dict[str, object] = {
        "job": report.job,
        "rank": report.rank,
        "step": report.step,
        "level": report.level,
        "manifest": report.manifest,
        "root": os.path.dirname(report.manifest),  # the checkpoint's (step's) directory
        "ok": ok,
        "reason": why[:500],
        "save_s": report.save_s,
        "bytes": report.nbytes,
        "directive_id": report.directive_id,
        "verify_s": round(time.monotonic() - started, 3),
    }
    if manifest is not None:
        data.update(
            shard_rank=manifest.rank,
            world_size=manifest.world_size,
            generation=manifest.generation,
            files=len(manifest.files),
            created=manifest.created,
        )
    return make_event(
        report.node,
        Kind.CHECKPOINT,
        severity=Severity.INFO if ok else Severity.WARNING,
        source="agent",
        data=data,
    )


@dataclass(frozen=True)
class _Copy:
    job: str
    rank: int  # the rank that reported it
    shard_rank: int  # the shard it holds (another rank's, for a partner copy)
    step: int
    level: str
    manifest: str


class VerifiedCopies:
    """The copies this node verified, so that one deleted since is said (issue #34).

    The tier's retention deletes old steps, an operator may ``rm`` a directory: the coordinator's
    catalogue must not keep offering a copy that is gone as the checkpoint a restart resumes from.
    After each report of a rank, :meth:`gone` looks (in a worker thread, the files may be on a network
    file system) whether the manifests of the copies it verified before, for the same job, rank and
    level, are still there, and returns one ``checkpoint`` event with ``deleted: true`` for each that
    is not. Bounded: the newest :data:`KEPT` copies per job, rank and level; forgotten on agent restart
    (a copy deleted meanwhile is then found only when a restart cannot load it, and the step before it
    is taken).
    """

    KEPT = 64

    def __init__(self, node: str) -> None:
        self.node = node
        self._copies: dict[tuple[str, int, str], dict[str, _Copy]] = {}

    def note(self, event: Event) -> None:
        """Remember a verified copy (a ``checkpoint`` event with ``ok``; others are ignored)."""
        data = event.data
        if event.kind != Kind.CHECKPOINT or data.get("ok") is not True or data.get("deleted"):
            return
        job, rank, step, level, manifest = (data.get(k) for k in ("job", "rank", "step", "level", "manifest"))
        shard = data.get("shard_rank", rank)
        if not (
            isinstance(job, str)
            and isinstance(rank, int)
            and isinstance(shard, int)
            and isinstance(step, int)
            and isinstance(level, str)
            and isinstance(manifest, str)
        ):
            return
        copies = self._copies.setdefault((job, rank, level), {})
        copies.pop(manifest, None)
        copies[manifest] = _Copy(job, rank, shard, step, level, manifest)
        while len(copies) > self.KEPT:
            del copies[next(iter(copies))]

    def forget_job(self, job: str) -> None:
        for key in [k for k in self._copies if k[0] == job]:
            del self._copies[key]

    async def gone(self, job: str, rank: int, level: str) -> list[Event]:
        """``deleted`` events for the copies of (``job``, ``rank``, ``level``) whose manifest is gone."""
        copies = self._copies.get((job, rank, level))
        if not copies:
            return []
        listed = list(copies.values())
        async with _workers():
            try:
                missing = await asyncio.to_thread(
                    lambda: [c for c in listed if not os.path.lexists(c.manifest)]
                )
            except Exception:  # unreadable now is not gone: look again after the next report
                return []
        events = []
        for copy in missing:
            copies.pop(copy.manifest, None)
            events.append(
                make_event(
                    self.node,
                    Kind.CHECKPOINT,
                    severity=Severity.INFO,
                    source="agent",
                    data={
                        "job": copy.job,
                        "rank": copy.rank,
                        "shard_rank": copy.shard_rank,
                        "step": copy.step,
                        "level": copy.level,
                        "manifest": copy.manifest,
                        "root": os.path.dirname(copy.manifest),
                        "ok": False,
                        "deleted": True,
                        "reason": f"{copy.manifest}: deleted since it verified (retention, or by hand)",
                    },
                )
            )
        return events
