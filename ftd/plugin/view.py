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
from typing import Any, Protocol

from ftd.events import Event, JobAllocation, RankInfo

HISTORY_LIMIT = 256


@dataclass
class NodeRecord:
    name: str
    online: bool = False
    last_change: float = 0.0
    drained_by_ftd: bool = False
    drain_reason: str = ""


@dataclass(frozen=True)
class FaultRecord:
    """One past event as history keeps it: a fault (severity >= error) in ``node_history``, any
    event in ``node_events``. ``data`` is the event's own data (read-only: do not change it); the
    other fields are the parts rules group incidents by (GPU identity, job, pattern, signal)."""

    ts: float
    node: str
    kind: str
    code: int | None = None
    uuid: str | None = None
    event_id: str = ""
    severity: str = ""
    pci: str | None = None
    index: int | None = None
    job: str | None = None
    pattern: str | None = None  # log_pattern: the pattern's name
    signal: str | None = None  # gpu_health / ecc: data["signal"]
    count: int = 1
    data: Mapping[str, Any] = field(default_factory=dict)
    #: The jobs on the node when the event arrived (history fills it in for events that name no
    #: job, e.g. a kernel-log Xid), so an incident is linked per job, not per node.
    jobs: tuple[str, ...] = ()

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


def fault_of(event: Event, jobs: tuple[str, ...] = ()) -> FaultRecord:
    """``event`` as history keeps it; ``jobs``: those on its node when it arrived (see FaultRecord)."""
    data = event.data
    code: Any = data.get("code")
    if event.kind == "gpu_fallen_off_bus":
        code = 79
    index = _int(data.get("index"))
    if index is None and event.kind in ("gpu_health", "gpu_missing", "ecc", "row_remap", "thermal"):
        index = _int(data.get("gpu"))  # the NVML watcher names the GPU's index "gpu"
    # Every field set at once, as the dataclass's own __init__ would (but it sets a frozen class's
    # 16 fields one object.__setattr__ at a time: a tenth of the coordinator's time per event).
    record = object.__new__(FaultRecord)
    record.__dict__.update(
        ts=event.ts,
        node=event.node,
        kind=str(event.kind),
        code=_int(code),
        uuid=_text(data.get("uuid")),
        event_id=event.id,
        severity=str(event.severity),
        pci=_text(data.get("pci")),
        index=index,
        job=_text(data.get("job")),
        pattern=_text(data.get("pattern")) if event.kind == "log_pattern" else None,
        signal=_text(data.get("signal")),
        count=event.count,
        data=data,
        jobs=jobs,
    )
    return record


@dataclass
class JobRecord:
    """A job and where it runs: ``ranks_by_node`` (trainer ranks registered with the agents) and
    ``allocations`` (nodes whose scheduler hook, Slurm's Prolog, reported the job: a job without the
    client has these only). ``nodes`` is both; ``ranks`` only the registered ranks."""

    id: str
    ranks_by_node: dict[str, list[RankInfo]] = field(default_factory=dict)
    allocations: dict[str, JobAllocation] = field(default_factory=dict)

    @property
    def nodes(self) -> list[str]:
        return sorted({n for n, ranks in self.ranks_by_node.items() if ranks} | set(self.allocations))

    @property
    def ranks(self) -> set[int]:
        return {r.rank for ranks in self.ranks_by_node.values() for r in ranks}

    @property
    def last_step(self) -> int | None:
        steps = [r.step for ranks in self.ranks_by_node.values() for r in ranks if r.step is not None]
        return max(steps) if steps else None


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

    def filesystem_troubles(self) -> Mapping[str, Mapping[str, FaultRecord]]:
        """Filesystems in trouble now (read-only, full, unresponsive), by key (``netfs:<server>``,
        ``ro:<mount>``...): each node it is in trouble on, with the event that opened it, oldest
        first; a ``recovered`` event removes its node (:mod:`ftd.plugin.save_path`)."""
        ...
