"""Checkpoint manifests (issue #34): what a rank wrote for one checkpoint, written last, checked before
it counts.

A manifest is one JSON object per rank and checkpoint, ``rank-{rank:05d}.manifest.json`` in the
checkpoint's directory, written *after* every file it names (temp file, fsync, rename), so a save
interrupted at any point leaves either no manifest or a whole one::

    {"format": "ftd-checkpoint/1", "job": "1234", "step": 1200, "rank": 3, "world_size": 8,
     "generation": 0, "level": "local", "created": 1733318400.0, "save_s": 0.42,
     "files": [{"path": "rank-00003/model.pt", "size": 104857600, "sha256": "9f86d0..."}]}

``path`` is relative to the manifest's directory and must stay inside it. ``level`` is where this copy
lives: ``local`` (the node's own disk), ``partner`` (a replica on another node) or ``shared`` (the job's
shared checkpoint directory). A checkpoint *counts* at a level only once every rank's manifest there
verifies (:func:`verify`: each file exists, has its size and its SHA-256).

Standard library only (the trainer client's rule): the agent verifies with the same code the trainer
wrote with. Hostile manifests -- huge, not JSON, paths outside the directory, links, sizes that are not
numbers -- are refused with a reason by :func:`read`, never followed.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from typing import Any, NamedTuple

__all__ = [
    "FORMAT",
    "LEVELS",
    "MANIFEST_SUFFIX",
    "FileEntry",
    "Manifest",
    "ManifestError",
    "file_entry",
    "manifest_name",
    "read",
    "verify",
    "write",
]

FORMAT = "ftd-checkpoint/1"
LEVELS = ("local", "partner", "shared")
MAX_MANIFEST_BYTES = 4 * 1024 * 1024  # a manifest of ~30,000 files; a bigger one is refused
MAX_FILES = 100_000
_CHUNK = 4 * 1024 * 1024


class ManifestError(ValueError):
    """A manifest that cannot be trusted; ``str()`` says why, naming the manifest."""


class FileEntry(NamedTuple):
    path: str  # relative to the manifest's directory
    size: int
    sha256: str


class Manifest(NamedTuple):
    job: str
    step: int
    rank: int
    world_size: int
    generation: int
    level: str
    created: float
    save_s: float | None
    files: tuple[FileEntry, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "job": self.job,
            "step": self.step,
            "rank": self.rank,
            "world_size": self.world_size,
            "generation": self.generation,
            "level": self.level,
            "created": self.created,
            "save_s": self.save_s,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
        }


MANIFEST_SUFFIX = ".manifest.json"


def manifest_name(rank: int) -> str:
    return f"rank-{rank:05d}{MANIFEST_SUFFIX}"


def sha256_of(path: str) -> str:
    """The SHA-256 of a file, read in 4 MiB chunks (never whole into memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            digest.update(chunk)
    return digest.hexdigest()


def file_entry(directory: str, relative: str) -> FileEntry:
    """The entry for a file the rank just wrote (size and hash read from disk)."""
    full = os.path.join(directory, relative)
    return FileEntry(relative, os.path.getsize(full), sha256_of(full))


def write(directory: str, manifest: Manifest) -> str:
    """Write ``manifest`` into ``directory`` atomically, after fsyncing it; returns its path."""
    target = os.path.join(directory, manifest_name(manifest.rank))
    tmp = f"{target}.tmp.{os.getpid()}"
    data = json.dumps(manifest.to_json(), sort_keys=True).encode()
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    try:  # the rename itself durable: fsync the directory (not possible on every filesystem)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
    return target


def _int(raw: Any, what: str, where: str, minimum: int = 0) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < minimum:
        raise ManifestError(f"{where}: {what} must be an integer >= {minimum}, got {raw!r}")
    return raw


def _relative(raw: Any, where: str) -> str:
    if not isinstance(raw, str) or not raw or len(raw) > 4096 or "\x00" in raw:
        raise ManifestError(f"{where}: a file path must be a non-empty string")
    if os.path.isabs(raw):
        raise ManifestError(f"{where}: file path {raw!r} is absolute (must be inside the checkpoint)")
    parts = raw.replace("\\", "/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ManifestError(f"{where}: file path {raw!r} leaves or wanders the checkpoint directory")
    return raw


def read(path: str) -> Manifest:
    """Read and check a manifest's shape (not its files: see :func:`verify`). Raises ManifestError."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read the manifest: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ManifestError(f"{path}: the manifest is not a regular file")
    if info.st_size > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{path}: the manifest is {info.st_size} bytes (at most {MAX_MANIFEST_BYTES})")
    try:
        with open(path, "rb") as f:
            raw = json.loads(f.read(MAX_MANIFEST_BYTES + 1))
    except (OSError, ValueError, RecursionError) as exc:
        raise ManifestError(f"{path}: the manifest is not readable JSON: {str(exc)[:200]}") from None
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: the manifest must be a JSON object")
    if raw.get("format") != FORMAT:
        raise ManifestError(
            "{}: unknown manifest format {!r} (want {!r})".format(path, raw.get("format"), FORMAT)
        )
    level = raw.get("level")
    if level not in LEVELS:
        raise ManifestError("{}: level must be one of {}, got {!r}".format(path, ", ".join(LEVELS), level))
    job = raw.get("job")
    if not isinstance(job, str) or len(job) > 256:
        raise ManifestError(f"{path}: job must be a string")
    created = raw.get("created")
    if isinstance(created, bool) or not isinstance(created, (int, float)):
        raise ManifestError(f"{path}: created must be a number")
    save_s = raw.get("save_s")
    if save_s is not None and (
        isinstance(save_s, bool) or not isinstance(save_s, (int, float)) or save_s < 0
    ):
        raise ManifestError(f"{path}: save_s must be a non-negative number or null")
    files_raw = raw.get("files")
    if not isinstance(files_raw, list) or len(files_raw) > MAX_FILES:
        raise ManifestError(f"{path}: files must be a list of at most {MAX_FILES} entries")
    files: list[FileEntry] = []
    seen = set()
    for i, entry in enumerate(files_raw):
        where = f"{path}: files[{i}]"
        if not isinstance(entry, dict):
            raise ManifestError(f"{where} must be an object")
        rel = _relative(entry.get("path"), where)
        if rel in seen:
            raise ManifestError(f"{where}: {rel!r} is listed twice")
        seen.add(rel)
        size = _int(entry.get("size"), "size", where)
        digest = entry.get("sha256")
        if (
            not isinstance(digest, str)
            or len(digest) != 64
            or any(c not in "0123456789abcdef" for c in digest)
        ):
            raise ManifestError(f"{where}: sha256 must be 64 lowercase hex digits")
        files.append(FileEntry(rel, size, digest))
    return Manifest(
        job=job,
        step=_int(raw.get("step"), "step", path),
        rank=_int(raw.get("rank"), "rank", path),
        world_size=_int(raw.get("world_size"), "world_size", path, minimum=1),
        generation=_int(raw.get("generation"), "generation", path),
        level=level,
        created=float(created),
        save_s=None if save_s is None else float(save_s),
        files=tuple(files),
    )


def verify(path: str, *, hashes: bool = True) -> tuple[Manifest | None, str]:
    """Check a manifest and every file it names: ``(manifest, "")`` when whole, ``(manifest or None,
    reason)`` when not. Files are regular files (no links) inside the manifest's directory, of the
    recorded size and (``hashes``) SHA-256. Reads in chunks; runs on a worker, never an event loop."""
    try:
        manifest = read(path)
    except ManifestError as exc:
        return None, str(exc)
    directory = os.path.dirname(os.path.abspath(path))
    root = os.path.realpath(directory)
    for entry in manifest.files:
        full = os.path.join(directory, entry.path)
        try:
            info = os.lstat(full)
        except OSError:
            return manifest, f"{path}: {entry.path} is missing"
        if not stat.S_ISREG(info.st_mode):
            return manifest, f"{path}: {entry.path} is not a regular file"
        real = os.path.realpath(full)
        if os.path.commonpath([root, real]) != root:
            return manifest, f"{path}: {entry.path} resolves outside the checkpoint directory"
        if info.st_size != entry.size:
            return manifest, (f"{path}: {entry.path} is {info.st_size} bytes, the manifest says {entry.size}")
        if hashes:
            try:
                digest = sha256_of(full)
            except OSError as exc:
                return manifest, f"{path}: cannot read {entry.path}: {exc.strerror or exc}"
            if digest != entry.sha256:
                return manifest, f"{path}: {entry.path} does not match its SHA-256 (corrupt)"
    return manifest, ""
