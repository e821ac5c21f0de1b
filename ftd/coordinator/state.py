"""The coordinator's picture of the cluster: nodes, and which ranks of which jobs run where.

Built from the bus: retained node status (online/offline, with the Last Will for crashes) and
retained job presence published by each agent. Rules read it through :class:`ClusterView`, a
read-only protocol, so a rule cannot change state behind the engine's back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from ftd.events import JobPresence, NodeStatus, RankInfo


@dataclass
class NodeRecord:
    name: str
    online: bool = False
    last_change: float = 0.0
    drained_by_ftd: bool = False
    drain_reason: str = ""


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


class ClusterState:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeRecord] = {}
        self.jobs: dict[str, JobRecord] = {}

    # --- updates from the bus --------------------------------------------------------------

    def _node(self, name: str) -> NodeRecord:
        record = self.nodes.get(name)
        if record is None:
            record = self.nodes[name] = NodeRecord(name)
        return record

    def apply_status(self, status: NodeStatus) -> bool:
        """Record a node's status; True when it changed."""
        node = self._node(status.node)
        online = status.state == "online"
        changed = node.online != online
        node.online = online
        node.last_change = status.ts or time.time()
        return changed

    def apply_presence(self, node: str, job: str, presence: JobPresence | None) -> None:
        record = self.jobs.get(job)
        if presence is None or not presence.ranks:
            if record is not None:
                record.ranks_by_node.pop(node, None)
                if not record.ranks_by_node:
                    del self.jobs[job]
            return
        if record is None:
            record = self.jobs[job] = JobRecord(job)
        record.ranks_by_node[node] = list(presence.ranks)
        self._node(node)

    def mark_drained(self, node: str, reason: str, drained: bool = True) -> None:
        record = self._node(node)
        record.drained_by_ftd = drained
        record.drain_reason = reason if drained else ""

    # --- ClusterView -------------------------------------------------------------------------

    def node(self, name: str) -> NodeRecord | None:
        return self.nodes.get(name)

    def jobs_on_node(self, node: str) -> list[str]:
        return sorted(j.id for j in self.jobs.values() if j.ranks_by_node.get(node))

    def job_nodes(self, job: str) -> list[str]:
        record = self.jobs.get(job)
        return record.nodes if record else []

    def online_nodes(self) -> list[str]:
        return sorted(n.name for n in self.nodes.values() if n.online)
