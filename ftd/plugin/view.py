"""What a rule may know about the cluster: a read-only view and the records it returns.

Rules receive a :class:`ClusterView` (a protocol; the coordinator's ``ClusterState`` implements it)
and must not change anything through it. The records are the coordinator's own (nodes, GPUs by
UUID with the fault history that follows a GPU across nodes, jobs and where their ranks run); they
live here, on the contract's floor, so a rule author imports them from :mod:`ftd.plugin` alone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

from ftd.events import Event, JobAllocation, RankInfo, SupervisorInfo

HISTORY_LIMIT = 256
_NO_DATA: Mapping[str, Any] = MappingProxyType({})


@dataclass
class NodeRecord:
    name: str
    online: bool = False
    last_change: float = 0.0
    drained_by_ftd: bool = False
    drain_reason: str = ""
    addresses: list[str] = field(default_factory=list)  # its IPs and host names, as its agent announced
    status: str = ""  # its agent's last status: online, offline (a Last Will), stopped (a clean stop)
    drift: tuple[str, ...] = ()  # the inventory fields on which it differs from its peers (issue #36)


class FaultRecord(NamedTuple):
    """One past event as history keeps it: a fault (severity >= error) in ``node_history``, any
    event in ``node_events``. ``data`` is the event's own data (read-only: do not change it); the
    other fields are the parts rules group incidents by (GPU identity, job, pattern, signal).

    A named tuple (immutable; built with keywords like a dataclass; its ``index`` and ``count`` are
    these fields, not tuple's methods): history keeps every event of every node, and a record
    without a ``__dict__`` is one object for the garbage collector to scan instead of two, and is
    built at C speed (:func:`fault_of`), so a large history costs the coordinator less (issue #25)."""

    ts: float
    node: str
    kind: str
    code: int | None = None
    uuid: str | None = None
    event_id: str = ""
    severity: str = ""
    pci: str | None = None
    index: int | None = None  # type: ignore[assignment]  # the field, not tuple.index
    job: str | None = None
    pattern: str | None = None  # log_pattern: the pattern's name
    signal: str | None = None  # gpu_health / ecc: data["signal"]
    count: int = 1  # type: ignore[assignment]  # the field, not tuple.count
    #: The jobs on the node when the event arrived (history fills it in for events that name no
    #: job, e.g. a kernel-log Xid), so an incident is linked per job, not per node.
    jobs: tuple[str, ...] = ()
    data: Mapping[str, Any] = _NO_DATA  # last: history keeps the other fields apart (record_fields)

    def concerns(self, job: str) -> bool:
        """Whether this event was about ``job``: it names it, or names none and the job was there."""
        return self.job == job if self.job is not None else job in self.jobs

    @property
    def signature(self) -> tuple[str, int | None]:
        """The kind and (for Xid/SXid) the code: what the fault was, wherever it happened."""
        return (self.kind, self.code)

    @property
    def gpu_id(self) -> str | None:
        """The GPU it names: its UUID, else its PCI address, else ``index:N``; None for node faults."""
        if self.uuid:
            return self.uuid
        if self.pci:
            return self.pci
        return f"index:{self.index}" if self.index is not None else None

    @property
    def linked(self) -> bool:
        """Part of an earlier event's incident: a storm summary (``repeat_of``) or a follow-on
        (``caused_by``, ``extra.caused_by_previous``), as storm control and the parser mark them."""
        extra = self.data.get("extra")
        return (
            self.data.get("repeat_of") is not None
            or self.data.get("caused_by") is not None
            or (isinstance(extra, dict) and extra.get("caused_by_previous") not in (None, False))
        )


@dataclass
class GpuRecord:
    """A GPU by UUID: where it is now, where it has been, what went wrong with it (newest last)."""

    uuid: str
    node: str
    pci: str | None = None
    nodes_seen: list[str] = field(default_factory=list)
    faults: deque[FaultRecord] = field(default_factory=lambda: deque(maxlen=HISTORY_LIMIT))


def _text(value: Any) -> str | None:
    if value is None:  # the common case first: most events carry few of these fields
        return None
    if type(value) is str:
        return value or None
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return str(value)


def _int(value: Any) -> int | None:
    if value is None:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def as_record(fields: tuple[Any, ...], data: Mapping[str, Any]) -> FaultRecord:
    """A record from :func:`record_fields`' tuple and the event's data, without the keyword handling
    of the generated ``__new__`` (C speed: history builds one per event a rule reads)."""
    return tuple.__new__(FaultRecord, fields + (data,))  # noqa: RUF005 (concatenation is faster)


def fault_of(event: Event, jobs: tuple[str, ...] = ()) -> FaultRecord:
    """``event`` as history keeps it; ``jobs``: those on its node when it arrived (see FaultRecord)."""
    return as_record(record_fields(event, jobs), event.data)


def record_fields(event: Event, jobs: tuple[str, ...] = ()) -> tuple[Any, ...]:
    """:func:`fault_of`'s fields but ``data`` (the last one) as a plain tuple, in
    :class:`FaultRecord`'s order. A plain tuple of plain values is one the garbage collector stops
    tracking (a tuple subclass, or one holding a dict, never is), so the coordinator keeps its
    every-event history in these (and the data apart) and builds records as rules read them."""
    data = event.data
    code: Any = data.get("code")
    if event.kind == "gpu_fallen_off_bus":
        code = 79
    index = _int(data.get("index"))
    if index is None and event.kind in ("gpu_health", "gpu_missing", "ecc", "row_remap", "thermal"):
        index = _int(data.get("gpu"))  # the NVML watcher names the GPU's index "gpu"
    return (
        event.ts,
        event.node,
        str(event.kind),
        _int(code),
        _text(data.get("uuid")),
        event.id,
        str(event.severity),
        _text(data.get("pci")),
        index,
        _text(data.get("job")),
        _text(data.get("pattern")) if event.kind == "log_pattern" else None,
        _text(data.get("signal")),
        event.count,
        jobs,
    )


@dataclass
class JobRecord:
    """A job and where it runs: ``ranks_by_node`` (trainer ranks registered with the agents),
    ``allocations`` (nodes whose scheduler hook, Slurm's Prolog, reported the job: a job without the
    client has these only) and ``supervisors`` (its rank supervisors, ``ftd run``, by node: issue #24).

    ``nodes`` is where the job trains (:meth:`trains_on`): nodes with ranks, allocated nodes and
    supervisors holding a slot, but not a hot spare, a node the job swapped out (``role`` spare /
    out) or a lost supervisor's node whose slot went to another, unless ranks are still there: a
    fault on a spare must not restart the job, and the job's save and stop directives go to its
    training nodes only. ``spares`` are the spare nodes; ``slots`` the node of each training slot in
    the newest generation; ``generation`` the newest any supervisor reports."""

    id: str
    ranks_by_node: dict[str, list[RankInfo]] = field(default_factory=dict)
    allocations: dict[str, JobAllocation] = field(default_factory=dict)
    supervisors: dict[str, SupervisorInfo] = field(default_factory=dict)

    @property
    def nodes(self) -> list[str]:
        every = {n for n, ranks in self.ranks_by_node.items() if ranks} | set(self.allocations)
        return sorted(n for n in every | set(self.supervisors) if self.trains_on(n))

    def trains_on(self, node: str) -> bool:
        """Whether the job trains on ``node``: ranks registered there; else, with a supervisor there,
        one that holds a slot of the newest generation (not a spare, not a node swapped out, not
        one whose slot went to another node while it was lost, not one whose ranks all exited 0:
        finished); else the scheduler allocated it."""
        if self.ranks_by_node.get(node):
            return True
        info = self.supervisors.get(node)
        if info is None:
            return node in self.allocations
        finished = info.state == "exited" and info.exit_code == 0  # its ranks ended: training done
        return info.role == "active" and node in self.slots and not finished

    @property
    def ranks(self) -> set[int]:
        return {r.rank for ranks in self.ranks_by_node.values() for r in ranks}

    @property
    def last_step(self) -> int | None:
        steps = [r.step for ranks in self.ranks_by_node.values() for r in ranks if r.step is not None]
        return max(steps) if steps else None

    @property
    def spares(self) -> list[str]:
        """The job's hot spares: nodes whose supervisor is idle in role ``spare``."""
        return sorted(n for n, s in self.supervisors.items() if s.role == "spare")

    @property
    def generation(self) -> int | None:
        """The newest generation any of the job's supervisors reports (None: no supervisor)."""
        return max((s.generation for s in self.supervisors.values()), default=None)

    @property
    def slots(self) -> list[str | None]:
        """The node of each training slot (0 .. nodes-1) among the active supervisors of the newest
        generation (None: no supervisor reports that slot); [] without supervisors."""
        active = [(n, s) for n, s in self.supervisors.items() if s.role == "active" and s.slot is not None]
        if not active:
            return []
        size = max(max(s.nodes for _, s in active), max(s.slot or 0 for _, s in active) + 1)
        slots: list[str | None] = [None] * size
        for node, info in sorted(active, key=lambda a: (a[1].generation, a[0])):  # the newest wins
            if info.slot is not None and 0 <= info.slot < size:
                slots[info.slot] = node
        return slots


class ClusterView(Protocol):
    """What a rule may know about the cluster (read-only)."""

    def node(self, name: str) -> NodeRecord | None: ...

    def jobs_on_node(self, node: str) -> list[str]: ...

    def job_nodes(self, job: str) -> list[str]: ...

    def online_nodes(self) -> list[str]: ...

    def gpu(self, uuid: str) -> GpuRecord | None: ...

    def node_history(self, node: str) -> Sequence[FaultRecord]: ...

    def node_events(self, node: str) -> Sequence[FaultRecord]:
        """Every recent event of ``node`` (any severity, oldest first, bounded), for incident context."""
        ...

    def job_restarts(self, job: str) -> Sequence[float]:
        """When ftd restarted ``job`` (its requeue through the scheduler returned), oldest first: a
        fault of the job after one of these is a new occurrence of its problem, not the same incident."""
        ...

    def node_of_address(self, address: str) -> str | None:
        """The node whose agent announced ``address`` (an IP or host name another node's error names,
        ``data.peer_address``), None when no node did (issue #33: peer naming)."""
        ...

    def filesystem_troubles(self) -> Mapping[str, Mapping[str, FaultRecord]]:
        """Filesystems in trouble now (read-only, full, unresponsive), by key (``netfs:<server>``,
        ``ro:<mount>``...): each node it is in trouble on, with the event that opened it, oldest
        first; a ``recovered`` event removes its node (:mod:`ftd.plugin.save_path`)."""
        ...
