"""The coordinator's Prometheus metrics: each family's exact value from a known state.

What an operator alerts on (deploy/prometheus/ftd-alerts.yml) must be right: nodes counted once by
exclusive state, conditions by kind, actions held, running and stuck, the drain budget, the bus and
the age of the last event, and the finished-action totals surviving a coordinator restart.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from prometheus_client import generate_latest

from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import ApiConfig, Config, CoordinatorConfig, PolicyConfig
from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.coordinator.api import Api
from ftd.coordinator.daemon import Coordinator
from ftd.coordinator.ledger.sqlite import Ledger
from ftd.coordinator.model.deadlines import stuck_after_s
from ftd.coordinator.wiring import build
from ftd.events import Kind, NodeStatus, Severity, make_event
from ftd.plugin.actions import ActionRequest


def coordinator(
    scheduler: FakeScheduler | None = None,
    *,
    ledger: Ledger | None = None,
    policy: PolicyConfig | None = None,
) -> Coordinator:
    policy = policy or PolicyConfig()
    cfg = Config(coordinator=CoordinatorConfig(ledger_path=":memory:", scheduler="slurm", policy=policy))
    return build(cfg, bus=MemoryBus(MemoryBroker()), scheduler=scheduler, ledger=ledger or Ledger(":memory:"))


def scrape(api: Api) -> set[str]:
    return set(generate_latest(api.registry).decode().splitlines())


async def settle(c: Coordinator) -> None:
    for _ in range(200):
        if not c.engine.active() or all(r.state == "awaiting_approval" for r in c.engine.active()):
            return
        await asyncio.sleep(0.01)


async def test_nodes_by_exclusive_state_and_conditions_by_kind() -> None:
    c = coordinator()
    for name in ("node-1", "node-2", "node-3", "node-4"):
        c.state.apply_status(NodeStatus(node=name, state="online", ts=1.0))
    c.state.apply_status(NodeStatus(node="node-2", state="offline", ts=2.0))
    c.state.mark_drained("node-3", "ftd: xid 79")  # online and drained: counted once, as drained
    c.state.mark_unavailable("node-4", "DRAIN: maintenance")
    c.state.mark_unavailable("node-9", "DOWN")  # known to the scheduler only
    c.state.apply_conditions("node-1", ["xid 79 on 0000:05:00", "ecc dbe"], ["xid", "ecc"])
    c.state.apply_conditions("node-2", ["from an older agent"])  # no kinds
    c.state.apply_conditions("node-4", ["made up"], ["not-a-kind"])
    # issue #32: a drill's condition is marked; a watcher that cannot watch is an error, not critical
    nvml = "nvml unavailable on a node with NVIDIA GPUs (dev/nvidia0): nvmlInit failed"
    c.state.apply_conditions("node-5", ["xid 79 on 0000:3b:00.0 (drill)", nvml], ["xid", "agent_health"])
    lines = scrape(Api(c, ApiConfig(), token=None))
    assert {
        'ftd_nodes{state="online"} 1.0',
        'ftd_nodes{state="offline"} 1.0',
        'ftd_nodes{state="drained"} 1.0',
        'ftd_nodes{state="unavailable"} 2.0',
        'ftd_node_conditions{drill="false",kind="xid",severity="critical"} 1.0',
        'ftd_node_conditions{drill="true",kind="xid",severity="critical"} 1.0',
        'ftd_node_conditions{drill="false",kind="ecc",severity="critical"} 1.0',
        'ftd_node_conditions{drill="false",kind="unknown",severity="critical"} 1.0',
        'ftd_node_conditions{drill="false",kind="other",severity="critical"} 1.0',
        'ftd_node_conditions{drill="false",kind="agent_health",severity="error"} 1.0',
    } <= lines, sorted(x for x in lines if "node_conditions" in x)
    c.state.apply_conditions("node-1", [])
    c.state.apply_conditions("node-5", [])
    lines = scrape(Api(c, ApiConfig(), token=None))
    assert not any('kind="xid"' in line for line in lines if line.startswith("ftd_node_conditions{"))
    await c.engine.close()


async def test_bus_connected_and_last_event_age() -> None:
    c = coordinator()
    api = Api(c, ApiConfig(), token=None)
    assert {"ftd_bus_connected 0.0", "ftd_last_event_timestamp_seconds 0.0"} <= scrape(api)
    await c.bus.start()
    before = time.time()
    await c.engine.handle_event(make_event("node-1", Kind.ECC, severity=Severity.WARNING, id="e1"))
    lines = scrape(api)
    assert "ftd_bus_connected 1.0" in lines
    (stamp,) = [line for line in lines if line.startswith("ftd_last_event_timestamp_seconds ")]
    assert before <= float(stamp.split()[1]) <= time.time()
    await c.bus.stop()
    assert "ftd_bus_connected 0.0" in scrape(api)
    await c.engine.close()


async def test_held_running_and_stuck_actions_and_the_drain_budget() -> None:
    class SlowScheduler(FakeScheduler):
        release = asyncio.Event()

        async def drain(self, node: str, reason: str) -> None:
            await self.release.wait()
            await super().drain(node, reason)

    scheduler = SlowScheduler()
    for name in ("node-1", "node-2", "node-3", "node-4"):
        scheduler.add_node(name)
    long_ago = time.time() - 10 * stuck_after_s("drain_node", CoordinatorConfig())
    policy = PolicyConfig(max_drained_fraction=0.5, approval_required_kinds=["resume_node"])
    c = coordinator(scheduler, ledger=Ledger(":memory:", clock=lambda: long_ago), policy=policy)
    for name in ("node-1", "node-2", "node-3", "node-4"):
        c.state.apply_status(NodeStatus(node=name, state="online", ts=1.0))
    api = Api(c, ApiConfig(), token=None)
    await c.engine.submit(ActionRequest(kind="drain_node", target="node-1", reason="xid 79", rule="t"))
    await c.engine.submit(ActionRequest(kind="resume_node", target="node-2", reason="ok", rule="t"))
    await asyncio.sleep(0.05)
    lines = scrape(api)
    assert {
        'ftd_actions{kind="drain_node",state="running"} 1.0',
        'ftd_actions{kind="resume_node",state="awaiting_approval"} 1.0',
        "ftd_actions_awaiting_approval 1.0",
        "ftd_actions_stuck 1.0",  # started "long ago" by the ledger's clock, still running
        "ftd_drain_budget 2.0",  # max(1, floor(0.5 x 4))
        "ftd_drain_budget_used 1.0",  # the drain in flight counts
    } <= lines
    SlowScheduler.release.set()
    await settle(c)
    lines = scrape(api)
    assert "ftd_actions_stuck 0.0" in lines
    assert 'ftd_actions_finished_total{kind="drain_node",state="succeeded"} 1.0' in lines
    await c.engine.close()


async def test_finished_totals_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    scheduler = FakeScheduler()
    scheduler.add_node("node-1")
    first = coordinator(scheduler, ledger=Ledger(path))
    first.state.apply_status(NodeStatus(node="node-1", state="online", ts=1.0))
    await first.engine.submit(ActionRequest(kind="drain_node", target="node-1", reason="xid 79", rule="t"))
    await settle(first)
    await first.engine.close()
    await first.ledger.close()

    second = coordinator(scheduler, ledger=Ledger(path))
    api = Api(second, ApiConfig(), token=None)
    assert not any(line.startswith("ftd_actions_finished_total{") for line in scrape(api))
    await api.action_totals.load(second)
    assert 'ftd_actions_finished_total{kind="drain_node",state="succeeded"} 1.0' in scrape(api)
    await second.engine.close()
