"""Every save known (issue #34): turn what a trainer wrote into a manifest the agent can verify.

What: :func:`manifest_for` takes what a rank reports -- the path of a manifest it wrote itself
(:mod:`ftd.client.manifest`), or a checkpoint directory (then the manifest of the rank's files there
is written now, last and atomically) -- and returns the manifest's absolute path and the bytes it
covers. :meth:`ftd.client.Client.report_checkpoint` sends it with the ``checkpoint`` op; the
checkpoint tier (:mod:`ftd.client.checkpoint`) writes its manifests itself and reports them the same
way. Standard library only; raises :class:`~ftd.client.manifest.ManifestError` (a ValueError) with
the reason when the path cannot be reported.
"""

from __future__ import annotations

import os
import time

from ftd.client import manifest as mf

__all__ = ["manifest_for"]

_SUFFIX = ".manifest.json"


def _files_under(directory: str) -> list[str]:
    """Regular files under ``directory`` (relative, sorted), manifests and temp files left out;
    links are not followed (a manifest never names one)."""
    found: list[str] = []
    for root, dirs, files in os.walk(directory, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(_SUFFIX) or _SUFFIX + ".tmp" in name:
                continue
            full = os.path.join(root, name)
            if os.path.islink(full) or not os.path.isfile(full):
                continue
            found.append(os.path.relpath(full, directory))
            if len(found) > mf.MAX_FILES:
                raise mf.ManifestError(f"{directory}: more than {mf.MAX_FILES} files")
    return found


def manifest_for(
    path: str,
    *,
    step: int,
    job: str,
    rank: int,
    world_size: int,
    generation: int = 0,
    level: str = "local",
    save_s: float | None = None,
    files: list[str] | None = None,
) -> tuple[str, int]:
    """``(manifest path, bytes)`` for ``path``: a manifest file (read and checked), or a directory
    whose files (``files``, relative to it, else every regular file under it) get a manifest now."""
    if level not in mf.LEVELS:
        raise mf.ManifestError(f"level must be one of {', '.join(mf.LEVELS)}, got {level!r}")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise mf.ManifestError(f"step must be an integer >= 0, got {step!r}")
    if not isinstance(path, str) or not os.path.isabs(path) or "\x00" in path:
        raise mf.ManifestError(f"{path!r}: a checkpoint must be reported by its absolute path")
    full = os.path.normpath(path)
    if os.path.isfile(full):
        m = mf.read(full)
        return full, sum(f.size for f in m.files)
    if not os.path.isdir(full):
        raise mf.ManifestError(f"{path}: neither a manifest nor a checkpoint directory")
    names = files if files is not None else _files_under(full)
    entries = []
    for name in names:
        rel = mf._relative(name, full)  # the manifest's own check: inside the directory
        try:
            entries.append(mf.file_entry(full, rel))
        except OSError as exc:
            raise mf.ManifestError(f"{full}: cannot read {rel}: {exc.strerror or exc}") from None
    manifest = mf.Manifest(
        job=job,
        step=step,
        rank=rank,
        world_size=max(1, world_size),
        generation=generation,
        level=level,
        created=time.time(),
        save_s=save_s,
        files=tuple(entries),
    )
    return mf.write(full, manifest), sum(e.size for e in entries)
