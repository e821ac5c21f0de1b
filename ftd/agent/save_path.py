"""Relate a node's filesystem events to the jobs that save there, and probe a checkpoint directory.

What: :func:`parse_mounts` reads ``/proc/self/mounts``; :func:`mount_of` finds the mount a path is on
(the longest mount point above it); :func:`relate` adds to a ``fs_readonly``, ``storage``, ``netfs``
or ``fs_fill`` event the ``mount`` it concerns (resolved from the event's device or NFS server when
the kernel line named none), its ``fstype``, whether it is ``shared`` (NFS, Lustre, GPFS...) and the
``jobs`` whose ranks registered a ``checkpoint_dir`` on it; :func:`probe` checks a checkpoint
directory in a worker thread with a timeout: ``read_only`` (the mount's flags), ``full`` (no block or
inode left for an unprivileged writer) or ``unresponsive`` (``statvfs`` did not return in time: a hard
NFS mount whose server is gone blocks forever, so the agent never waits on one itself).

Why: a kernel line says "EXT4-fs (nvme0n1p1): Remounting filesystem read-only" or "nfs: server
nfs01 not responding"; only this node knows which mount that is and which of its ranks save there.
With ``mount`` and ``jobs`` in the event the coordinator asks no save of those jobs onto it
(:mod:`ftd.coordinator.decide.save_path`) and tells one shared filesystem's outage from a node fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ftd.events import Event, Kind, RankInfo, make_event
from ftd.plugin.save_path import SHARED_FS_TYPES, path_under

__all__ = [
    "Mount",
    "SavePathWatcher",
    "current_mounts",
    "mount_of",
    "parse_mounts",
    "probe",
    "read_mounts",
    "relate",
]

MOUNTS = Path("/proc/self/mounts")
#: The kinds whose events name a filesystem a save can land on.
FS_KINDS = frozenset({Kind.FS_READONLY, Kind.STORAGE, Kind.NETFS, Kind.FS_FILL})


@dataclass(frozen=True, slots=True)
class Mount:
    """One line of ``/proc/self/mounts``."""

    source: str
    point: str
    fstype: str
    options: frozenset[str]
    listed_shared: bool = False  # named in agent.fs.shared_mounts

    @property
    def read_only(self) -> bool:
        return "ro" in self.options

    @property
    def shared(self) -> bool:
        return self.listed_shared or self.fstype.lower() in SHARED_FS_TYPES


def _unescape(field: str) -> str:
    """The kernel writes space, tab, newline and backslash in mount fields as octal (``\\040``)."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        chunk = field[i + 1 : i + 4]
        if field[i] == "\\" and len(chunk) == 3 and all(c in "01234567" for c in chunk):
            out.append(chr(int(chunk, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mounts(text: str, shared: Iterable[str] = ()) -> list[Mount]:
    """The mounts of a ``/proc/self/mounts`` text (malformed lines skipped); a mount point listed in
    ``shared`` (``agent.fs.shared_mounts``) is shared whatever its fstype."""
    named = {p.rstrip("/") or "/" for p in shared}
    mounts: list[Mount] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        source, point, fstype, options = (_unescape(p) for p in parts[:4])
        mounts.append(Mount(source, point, fstype, frozenset(options.split(",")), point in named))
    return mounts


def read_mounts(shared: Iterable[str] = (), path: Path = MOUNTS) -> list[Mount]:
    """This process's mounts (none when the file cannot be read: nothing is related then)."""
    try:
        return parse_mounts(path.read_text(encoding="utf-8", errors="replace"), shared)
    except OSError:
        return []


_recent_mounts: tuple[float, tuple[str, ...], list[Mount]] = (-1.0, (), [])


def current_mounts(shared: Iterable[str] = (), max_age_s: float = 1.0) -> list[Mount]:
    """:func:`read_mounts`, read again at most every ``max_age_s`` (a storm of disk errors reads the
    mount table once a second, not once a line)."""
    global _recent_mounts
    now, listed = time.monotonic(), tuple(shared)
    at, was, mounts = _recent_mounts
    if at < 0 or now - at > max_age_s or listed != was:
        mounts = read_mounts(listed)
        _recent_mounts = (now, listed, mounts)
    return mounts


def mount_of(path: str, mounts: Iterable[Mount]) -> Mount | None:
    """The mount ``path`` is on: the last-mounted of the longest mount points above it."""
    best: Mount | None = None
    for mount in mounts:
        if path_under(path, mount.point) and (best is None or len(mount.point) >= len(best.point)):
            best = mount
    return best


def _by_event(data: Mapping[str, object], kind: str, mounts: list[Mount]) -> Mount | None:
    """The mount an event names: its ``mount``/``path``, else its device, else its NFS server."""
    for key in ("mount", "path"):
        value = data.get(key)
        if isinstance(value, str) and value.startswith("/"):
            return mount_of(value, mounts)
    device = data.get("device")
    if isinstance(device, str) and device:
        named = [m for m in mounts if m.source in (device, f"/dev/{device}")]
        if named:
            return named[-1]
    server = data.get("server")
    if kind == Kind.NETFS and isinstance(server, str) and server:
        served = [m for m in mounts if m.shared and m.source.split(":", 1)[0] == server]
        if served:
            return served[-1]
    return None


def relate(event: Event, jobs: Mapping[str, list[RankInfo]], mounts: list[Mount]) -> Event:
    """``event`` with ``mount``, ``fstype``, ``shared`` and ``jobs`` added where this node knows them
    (the event itself when it is not a filesystem's, or nothing can be added)."""
    if event.kind not in FS_KINDS:
        return event
    data = dict(event.data)
    mount = _by_event(data, str(event.kind), mounts)
    if mount is not None:
        data.setdefault("mount", mount.point)
        data.setdefault("fstype", mount.fstype)
        if mount.shared:
            data.setdefault("shared", True)
    where = data.get("mount")
    if isinstance(where, str):
        saving = sorted(
            job
            for job, ranks in jobs.items()
            if any(r.checkpoint_dir and path_under(r.checkpoint_dir, where) for r in ranks)
        )
        if saving:
            data["jobs"] = sorted(set(saving) | set(_listed(data.get("jobs"))))
    if data == event.data:
        return event
    return msgspec.structs.replace(event, data=data)


def _listed(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _statvfs_state(path: str, mounts: list[Mount]) -> str | None:
    mount = mount_of(path, mounts)
    if mount is not None and mount.read_only:
        return "read_only"
    st = os.statvfs(path)
    if st.f_flag & os.ST_RDONLY:
        return "read_only"
    if st.f_bavail == 0 or (st.f_files and st.f_favail == 0):
        return "full"
    return None


async def probe(path: str, timeout_s: float = 5.0, mounts: list[Mount] | None = None) -> str | None:
    """``read_only``, ``full``, ``unresponsive`` or None (fine) for a checkpoint directory; a path
    that does not exist (yet) is probed at the nearest existing parent. The ``statvfs`` runs in a
    daemon thread of its own that the agent waits on for ``timeout_s`` at most (a thread blocked on a
    dead NFS server is left behind, never a worker of a shared pool)."""
    known = mounts if mounts is not None else read_mounts()
    try:
        async with asyncio.timeout(timeout_s):
            return await _in_thread(_state_of, path, known)
    except TimeoutError:
        return "unresponsive"
    except OSError:
        return None  # gone or not ours to read: not a verdict about the filesystem


def _state_of(path: str, mounts: list[Mount]) -> str | None:
    target = path
    while target not in ("/", "") and not os.path.lexists(target):
        target = os.path.dirname(target.rstrip("/")) or "/"
    return _statvfs_state(target, mounts)


async def _in_thread(fn: Callable[[str, list[Mount]], str | None], *args: Any) -> str | None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[str | None] = loop.create_future()

    def settle(result: str | None, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def work() -> None:
        try:
            result, error = fn(*args), None
        except OSError as exc:
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed while the thread was blocked
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=work, name="ftd-save-path-probe", daemon=True).start()
    return await done


# --- the watcher ------------------------------------------------------------------------------------

Emit = Callable[[Event], Awaitable[None]]


class SavePathWatcher:
    """Probes the checkpoint directories the node's ranks registered, every ``interval_s``, and
    reports a change of their filesystem's state as the event a kernel line would have been:
    read-only (``fs_readonly``), unresponsive (``netfs`` not_responding for a shared filesystem,
    ``storage`` fault ``stat_timeout`` for a local one), full (``fs_fill`` at 100 %), and its end
    (``state`` rw / recovered, level ok). Each event names the ``path``, ``mount`` and ``jobs``."""

    name = "save_path"

    def __init__(
        self,
        node: str,
        emit: Emit,
        jobs: Callable[[], Mapping[str, list[RankInfo]]],
        *,
        interval_s: float = 60.0,
        timeout_s: float = 5.0,
        shared_mounts: Iterable[str] = (),
        mounts: Callable[[], list[Mount]] | None = None,
    ) -> None:
        self.node, self._emit, self._jobs = node, emit, jobs
        listed = tuple(shared_mounts)
        self._mounts = mounts if mounts is not None else lambda: read_mounts(listed)
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.states: dict[str, str | None] = {}  # directory -> its last verdict
        self.last_progress: float | None = None

    def directories(self) -> dict[str, list[str]]:
        """Each registered checkpoint directory and the jobs saving there."""
        out: dict[str, set[str]] = {}
        for job, ranks in self._jobs().items():
            for rank in ranks:
                if rank.checkpoint_dir:
                    out.setdefault(rank.checkpoint_dir, set()).add(job)
        return {d: sorted(jobs) for d, jobs in sorted(out.items())}

    async def check(self) -> list[Event]:
        """Probe every directory once; the events of the changes (also emitted)."""
        mounts = self._mounts()
        events: list[Event] = []
        for directory, jobs in self.directories().items():
            state = await probe(directory, self.timeout_s, mounts)
            before = self.states.get(directory)
            self.states[directory] = state
            if state == before:
                continue
            event = self._event(directory, jobs, state or "", before, mount_of(directory, mounts))
            if event is not None:
                events.append(event)
                await self._emit(event)
        return events

    def _event(
        self, path: str, jobs: list[str], state: str, before: str | None, mount: Mount | None
    ) -> Event | None:
        shown = state or before
        data: dict[str, Any] = {"path": path, "jobs": jobs, "probe": True}
        if mount is not None:
            data.update(mount=mount.point, fstype=mount.fstype, device=mount.source, shared=mount.shared)
        severity = "critical" if state else "info"
        if shown == "read_only":
            kind = Kind.FS_READONLY
            if not state:
                data["state"] = "rw"
        elif shown == "unresponsive" and mount is not None and mount.shared:
            kind = Kind.NETFS
            data.update(fs=mount.fstype, server=mount.source.split(":", 1)[0])
            data["state"] = "not_responding" if state else "recovered"
        elif shown == "unresponsive":
            kind = Kind.STORAGE
            data.update(subsystem="fs", fault="stat_timeout")
            if not state:
                data["state"] = "recovered"
        elif shown == "full":
            kind = Kind.FS_FILL
            data.update(reason="threshold", resource="bytes", level="critical" if state else "ok")
            data["used_pct"] = 100.0 if state else 0.0
        else:
            return None
        return make_event(self.node, kind, severity=severity, source="save_path", data=data)

    async def run(self) -> None:
        while True:
            self.last_progress = time.monotonic()
            await self.check()
            await asyncio.sleep(self.interval_s)
