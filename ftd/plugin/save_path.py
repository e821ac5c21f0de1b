"""The health of the filesystems a job saves to, from the cluster's filesystem events (pure).

What: :func:`reading_of` says what a ``fs_readonly``, ``netfs``, ``storage`` or ``fs_fill`` event
means for saves: which filesystem (a key: the NFS server, the mount), and whether it is now
read-only, full or unresponsive, or recovered. :class:`FilesystemBook` keeps, per filesystem, the
nodes on which it is in trouble now (the cluster state holds one, :meth:`ClusterView.filesystem_troubles`
reads it: an outage on 10,000 nodes is looked up, never scanned for). :func:`troubles` lists the
troubles on some nodes; :func:`save_trouble` says whether a job's save would meet one: on the job's
nodes the event names the job (``data.job`` / ``data.jobs``: the agent relates its mounts to the
checkpoint directories its ranks registered) or the job's checkpoint directory lies under the event's
``mount`` / ``path``; a shared filesystem's trouble on any node counts for every job saving there.
:func:`is_shared` says whether an event's filesystem is shared by many nodes (an NFS, Lustre, GPFS,
BeeGFS... fstype, a ``netfs`` event, or ``data.shared``).

Why here, on the contract's floor: the coordinator's decision stage (which must never ask a job to
save onto a filesystem that cannot take the save) and the rules (which must tell one shared
filesystem outage from N node faults) both need it, and neither may import the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ftd.plugin.view import FaultRecord

__all__ = [
    "FS_EVENT_KINDS",
    "MEMORY_S",
    "SHARED_FS_TYPES",
    "FilesystemBook",
    "Trouble",
    "is_shared",
    "path_under",
    "reading_of",
    "save_trouble",
    "trouble_of",
    "trouble_under",
    "troubles",
]

#: The event kinds that say something about a filesystem a save can land on.
FS_EVENT_KINDS = frozenset({"fs_readonly", "netfs", "storage", "fs_fill"})

#: Filesystem types mounted by many nodes at once: trouble there is the cluster's, not one node's.
SHARED_FS_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "beegfs",
        "cifs",
        "smb3",
        "ceph",
        "cephfs",
        "glusterfs",
        "fuse.glusterfs",
        "wekafs",
        "panfs",
        "fuse.juicefs",
        "fuse.s3fs",
        "virtiofs",
    }
)
#: How long a filesystem trouble is remembered when no event says it ended.
MEMORY_S = 6 * 3600.0
#: ``netfs`` states that mean the server does not answer (or threw the client out).
NETFS_DOWN = frozenset({"not_responding", "evicted", "lock_reclaim_failed"})
#: States in a later event that end a trouble of the same filesystem.
RECOVERED = frozenset({"recovered", "ok", "cleared", "clear", "rw", "read_write"})
#: ``storage`` faults after which a filesystem takes no more writes.
_UNWRITABLE = ("readonly", "read_only", "superblock", "io_error", "write_error")
#: Fill at or above which a filesystem is full for a save (a critical threshold may still leave room).
FULL_PCT = 99.5


@dataclass(frozen=True)
class Trouble:
    """One filesystem that cannot take a save now: where, what, since when, and which jobs it names."""

    node: str
    state: str  # "read_only" | "unresponsive" | "full"
    where: str  # the mount, path, server or device the event names
    since: float
    jobs: tuple[str, ...] = ()
    shared: bool = False
    server: str | None = None  # a network filesystem's server, when the event names it

    def concerns(self, job: str, dirs: Iterable[str]) -> bool:
        """Whether ``job`` saves here: the event named it, or a checkpoint dir lies under ``where``."""
        return job in self.jobs or any(path_under(d, self.where) for d in dirs)

    @property
    def text(self) -> str:
        what = {"read_only": "is read-only", "unresponsive": "does not respond", "full": "is full"}
        noun = "server" if self.state == "unresponsive" and not self.where.startswith("/") else "filesystem"
        return f"{noun} {self.where} {what.get(self.state, self.state)} on {self.node}"


def path_under(path: str, mount: str) -> bool:
    """``path`` is ``mount`` or inside it (component-wise: /ckpt2 is not under /ckpt)."""
    if not mount.startswith("/") or not path.startswith("/"):
        return False
    mount = mount.rstrip("/") or "/"
    return mount == "/" or path == mount or path.startswith(mount + "/")


def is_shared(kind: str, data: dict[str, object] | object) -> bool:
    """A shared filesystem's event: ``netfs``, ``data.shared``, or a shared ``fstype``."""
    if kind == "netfs":
        return True
    if not isinstance(data, dict):
        return False
    if data.get("shared") is True:
        return True
    fstype = data.get("fstype") or data.get("fs")
    return isinstance(fstype, str) and fstype.lower() in SHARED_FS_TYPES


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _jobs(record: FaultRecord) -> tuple[str, ...]:
    jobs = record.data.get("jobs")
    named = [j for j in jobs if isinstance(j, str)] if isinstance(jobs, list) else []
    if record.job:
        named.append(record.job)
    return tuple(sorted(set(named)))


def reading_of(record: FaultRecord) -> tuple[str, str, str | None] | None:
    """(key, where, state) of a filesystem event: state None when it says the trouble ended."""
    data = record.data
    state = _text(data.get("state"))
    cleared = state is not None and state.lower() in RECOVERED
    if record.kind == "fs_readonly":
        where = _text(data.get("mount")) or _text(data.get("path")) or _text(data.get("device"))
        return (f"ro:{where}", where, None if cleared else "read_only") if where else None
    if record.kind == "netfs":
        server = _text(data.get("server"))
        where = _text(data.get("mount")) or server
        if where is None or state is None:
            return None
        if state not in NETFS_DOWN and not cleared:
            return None
        return (f"netfs:{server or where}", where, "unresponsive" if state in NETFS_DOWN else None)
    if record.kind == "storage":
        mount = _text(data.get("mount"))
        fault = str(data.get("fault") or "").lower()
        if mount is None:
            return None
        if "timeout" in fault or "no_path" in fault or "no available path" in fault:
            return (f"hung:{mount}", mount, None if cleared else "unresponsive")
        if cleared:
            return (f"ro:{mount}", mount, None)
        return (f"ro:{mount}", mount, "read_only") if any(w in fault for w in _UNWRITABLE) else None
    if record.kind == "fs_fill":
        where = _text(data.get("path")) or _text(data.get("mount"))
        if where is None or data.get("reason") == "forecast":
            return None
        used = max(_number(data.get("used_pct")) or 0.0, _number(data.get("inodes_used_pct")) or 0.0)
        return (f"full:{where}", where, "full" if used >= FULL_PCT else None)
    return None


class FilesystemBook:
    """Per filesystem key, the nodes it is in trouble on now and the event that opened each
    (oldest first); fed every event by the cluster state, read through the view."""

    def __init__(self) -> None:
        self.open: dict[str, dict[str, FaultRecord]] = {}

    def note(self, record: FaultRecord) -> None:
        if record.kind not in FS_EVENT_KINDS:
            return
        reading = reading_of(record)
        if reading is None:
            return
        key, _, state = reading
        if state is not None:
            self.open.setdefault(key, {}).setdefault(record.node, record)
            return
        nodes = self.open.get(key)
        if nodes is not None:
            nodes.pop(record.node, None)
            if not nodes:
                del self.open[key]


class _Troubled(Protocol):
    def job_nodes(self, job: str) -> list[str]: ...

    def filesystem_troubles(self) -> Mapping[str, Mapping[str, FaultRecord]]: ...


def trouble_of(record: FaultRecord) -> Trouble | None:
    """The trouble an event opened (None: it opened none)."""
    reading = reading_of(record)
    if reading is None:
        return None
    _, where, state = reading
    if state is None:
        return None
    shared = is_shared(record.kind, dict(record.data))
    server = _text(record.data.get("server"))
    return Trouble(record.node, state, where, record.ts, _jobs(record), shared, server)


def _fresh(record: FaultRecord, now: float) -> bool:
    return 0 <= now - record.ts <= MEMORY_S


def troubles(view: _Troubled, nodes: Iterable[str], now: float) -> list[Trouble]:
    """The filesystems read-only, full or unresponsive on ``nodes`` at ``now`` (oldest first)."""
    wanted = set(nodes)
    out = [
        trouble
        for by_node in view.filesystem_troubles().values()
        for node in wanted & by_node.keys()
        if _fresh(by_node[node], now) and (trouble := trouble_of(by_node[node])) is not None
    ]
    return sorted(out, key=lambda t: (t.since, t.node))


def save_trouble(view: _Troubled, job: str, now: float, dirs: Iterable[str] = ()) -> Trouble | None:
    """The trouble a save of ``job`` would meet (None: none known): on the job's nodes, one naming
    the job or holding its checkpoint directory; on any node, a shared filesystem's holding it."""
    dirs = [d for d in dirs if d]
    job_nodes = view.job_nodes(job)
    for by_node in view.filesystem_troubles().values():
        for node in job_nodes:
            record = by_node.get(node)
            if record is not None and _fresh(record, now):
                trouble = trouble_of(record)
                if trouble is not None and trouble.concerns(job, dirs):
                    return trouble
        first = next(iter(by_node.values()), None)  # the outage as its first node reported it
        if first is not None and _fresh(first, now):
            trouble = trouble_of(first)
            if trouble is not None and trouble.shared and trouble.concerns(job, dirs):
                return trouble
    return None


def trouble_under(view: _Troubled, job: str, path: str, now: float) -> Trouble | None:
    """A trouble that a save of ``job`` into ``path`` would meet: on the job's nodes, or a shared
    filesystem's anywhere, whose mount ``path`` lies under (a fallback on the broken filesystem)."""
    job_nodes = view.job_nodes(job)
    for by_node in view.filesystem_troubles().values():
        records = [by_node[n] for n in job_nodes if n in by_node]
        first = next(iter(by_node.values()), None)
        for record in [*records, *([first] if first is not None else [])]:
            trouble = trouble_of(record) if _fresh(record, now) else None
            if trouble is None or (record is first and record not in records and not trouble.shared):
                continue
            if path_under(path, trouble.where):
                return trouble
    return None
