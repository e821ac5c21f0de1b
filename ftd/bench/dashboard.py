"""``ftd bench dashboard``: what the on-call dashboard's queries cost the coordinator at 10,000 nodes.

Why: the page asks ``/v1/summary`` and ``/v1/nodes?problems=1&sort=severity&limit=100`` every 2 s
(issue #22: the problems query <= 50 ms at 10,000 nodes). Measured over real HTTP on loopback (an
aiohttp client against the coordinator's own :class:`~ftd.coordinator.api.server.Api`) on an
in-process coordinator (memory bus, in-memory SQLite ledger, fake scheduler) whose state holds
``nodes`` nodes in racks of 32 (``coordinator.node_labels``), 300 jobs of 8 nodes, a dozen incidents
(agents gone, nodes drained with their actions, active conditions with a GPU reset running, a node
drained by an admin, a job being restarted) and 1,000 finished actions in the ledger. Each query runs
``samples`` times; the figures are the whole request as a client sees it (parse, filter, sort, page,
encode, the socket). The unpaged ``/v1/nodes`` (every node, as ``ftd status`` reads it) is measured too.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from ftd.bench.slurm_cluster import free_port

RACK = 32


def _ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 2),
    }


async def _seed(coordinator: Any, nodes: int) -> int:
    from ftd.events import JobPresence, NodeStatus, RankInfo
    from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState
    from ftd.sim.seed import seed_online

    state, ledger = coordinator.state, coordinator.ledger
    names = [f"gpu-{i:05d}" for i in range(nodes)]
    seed_online(state, names, ts=1000.0)  # as `ftd demo --nodes N` seeds the nodes beyond its agents
    for j in range(min(300, nodes // RACK)):
        for k in range(8):
            node = names[j * RACK + k]
            job = f"job-{j}"
            state.apply_presence(node, job, JobPresence(job=job, node=node, ranks=[RankInfo(rank=k, step=1)]))
    now = time.time()

    def record(i: int, kind: str, target: str, st: ActionState) -> ActionRecord:
        request = ActionRequest(kind=kind, target=target, reason=f"bench {i}", rule="bench")
        return ActionRecord(id=f"bench-{i}", request=request, state=st, created=now + i, updated=now + i)

    for i in range(1000):  # history: the ledger's recent actions are read on every query
        await ledger.save_action(record(i, "drain_node", names[(i * 7919) % nodes], ActionState.SUCCEEDED))
    step = max(1, nodes // 13)
    incidents = [names[i * step] for i in range(12)]
    for name in incidents[:3]:
        state.apply_status(NodeStatus(node=name, state="offline", ts=2000.0))
    for name in incidents[3:6]:
        state.mark_drained(name, "ftd: xid 79")
    for i, name in enumerate(incidents[6:9]):
        state.apply_conditions(name, ["xid 48: double-bit ECC"])
        await ledger.save_action(record(2000 + i, "gpu_reset", name, ActionState.RUNNING))
    state.mark_unavailable(incidents[9], "admin: cable swap")
    for i, name in enumerate(incidents[10:]):
        await ledger.save_action(record(3000 + i, "drain_node", name, ActionState.RUNNING))
    return len(incidents)


async def _bench(nodes: int, samples: int) -> dict[str, Any]:
    import aiohttp

    from ftd.bus.memory import MemoryBroker, MemoryBus
    from ftd.config import ApiConfig, Config, CoordinatorConfig
    from ftd.coordinator.actions.scheduler import FakeScheduler
    from ftd.coordinator.api.server import Api
    from ftd.coordinator.ledger.sqlite import Ledger
    from ftd.coordinator.wiring import build
    from ftd.sim.seed import rack_labels

    names = [f"gpu-{i:05d}" for i in range(nodes)]
    labels = rack_labels(names, RACK)
    config = Config(
        coordinator=CoordinatorConfig(ledger_path=":memory:", scheduler="slurm", node_labels=labels)
    )
    coordinator = build(
        config, bus=MemoryBus(MemoryBroker()), scheduler=FakeScheduler(), ledger=Ledger(":memory:")
    )
    incidents = await _seed(coordinator, nodes)
    port = free_port()  # for the API
    api = Api(coordinator, ApiConfig(port=port))
    await api.start()
    base = f"http://127.0.0.1:{port}"
    queries = {
        "problems": "/v1/nodes?problems=1&sort=severity&limit=100",
        "summary": "/v1/summary",
        "search": "/v1/nodes?q=r017&sort=severity&limit=100",
        "all_nodes": "/v1/nodes",
    }
    out: dict[str, Any] = {"nodes": nodes, "incidents": incidents, "samples": samples}
    try:
        async with aiohttp.ClientSession() as session:
            for name, path in queries.items():
                times: list[float] = []
                size = 0
                for i in range(samples if name != "all_nodes" else max(5, samples // 10)):
                    started = time.perf_counter()
                    async with session.get(base + path) as response:
                        body = await response.read()
                    times.append(time.perf_counter() - started)
                    if i == 0:
                        size = len(body)
                        if "X-Total-Count" in response.headers:  # /v1/nodes: how many matched
                            out[f"{name}_total"] = int(response.headers["X-Total-Count"])
                out[name] = {**_ms(times), "bytes": size}
    finally:
        await api.stop()
        await coordinator.engine.close()
    return out


def bench_dashboard(nodes: int = 10_000, samples: int = 100) -> dict[str, Any]:
    """The dashboard's queries at ``nodes`` nodes (see the module docstring)."""
    return asyncio.run(_bench(nodes, samples))
