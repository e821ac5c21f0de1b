"""What a rule may know about the cluster: a read-only view and the records it returns.

Rules receive a :class:`ClusterView` (a protocol; the coordinator's ``ClusterState`` implements it)
and must not change anything through it. The records are the coordinator's own (nodes, GPUs by
UUID with the fault history that follows a GPU across nodes, jobs and where their ranks run); they
live here, on the contract's floor, so a rule author imports them from :mod:`ftd.plugin` alone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ftd.events import Event, RankInfo

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
    """One past fault: an event of severity >= error, as history keeps it."""

    ts: float
    node: str
    kind: str
    code: int | None = None
    uuid: str | None = None
    event_id: str = ""

    @property
    def signature(self) -> tuple[str, int | None]:
        """What makes two faults "the same fault": the kind and (for Xid/SXid) the code."""
        return (self.kind, self.code)


@dataclass
class GpuRecord:
    """A GPU by UUID: where it is now, where it has been, what went wrong with it (newest last)."""

    uuid: str
    node: str
    pci: str | None = None
    nodes_seen: list[str] = field(default_factory=list)
    faults: deque[FaultRecord] = field(default_factory=lambda: deque(maxlen=HISTORY_LIMIT))


def fault_of(event: Event) -> FaultRecord:
    code: Any = event.data.get("code")
    if event.kind == "gpu_fallen_off_bus":
        code = 79
    uuid = event.data.get("uuid")
    return FaultRecord(
        ts=event.ts,
        node=event.node,
        kind=str(event.kind),
        code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        uuid=uuid if isinstance(uuid, str) and uuid else None,
        event_id=event.id,
    )


@dataclass
class JobRecord:
    id: str
    ranks_by_node: dict[str, list[RankInfo]] = field(default_factory=dict)

    @property
    def nodes(self) -> list[str]:
        return sorted(n for n, ranks in self.ranks_by_node.items() if ranks)

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
