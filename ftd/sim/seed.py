"""A large cluster put in front of a coordinator without a process, an agent or a bus connection per
node: the nodes are written into its :class:`~ftd.coordinator.model.state.ClusterState` as online, in
racks of :data:`RACK` (``coordinator.node_labels``), the way their agents' retained status would.

Why: ``ftd demo --serve --nodes 10000`` and ``ftd bench dashboard`` show the dashboard and its
queries at scale; 10,000 real agents in one process are 10,000 MQTT connections, unix sockets and
kernel-log files (the process runs out of file descriptors, the embedded broker out of breath) for
nodes that would only ever say "online". The nodes that matter (a job's, the incident's) run real
agents; the rest are seeded here (the demo says how many, and which).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ftd.config.schema import NodeLabelsConfig
from ftd.coordinator.model.state import ClusterState
from ftd.events import NodeStatus

RACK = 32  # nodes per rack label


def rack_labels(names: Sequence[str], rack: int = RACK) -> list[NodeLabelsConfig]:
    """``coordinator.node_labels`` putting ``names`` in racks of ``rack`` (r000, r001, ...), in order."""
    width = max(3, len(str(max(0, len(names) - 1) // rack)))
    return [
        NodeLabelsConfig(nodes=list(names[r : r + rack]), rack=f"r{r // rack:0{width}d}")
        for r in range(0, len(names), rack)
    ]


def seed_online(state: ClusterState, names: Sequence[str], ts: float | None = None) -> None:
    """Write ``names`` into ``state`` as online since ``ts`` (now by default), as their agents' birth
    messages would; nothing else about them (no jobs, no conditions)."""
    when = ts or time.time()
    for name in names:
        state.apply_status(NodeStatus(node=name, state="online", ts=when))
