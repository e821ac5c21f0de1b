"""The real engine in a sandbox (ftd.coordinator.decide.replay): simulated time, nothing executed for real."""

from __future__ import annotations

import asyncio
from typing import Any

from ftd.config import CoordinatorConfig
from ftd.coordinator.decide.plugins import DEFAULT_RULES, default_rule_name
from ftd.coordinator.decide.replay import Sandbox, SimClock
from ftd.coordinator.ledger.sqlite import memory_store
from ftd.events import JobPresence, RankInfo
from ftd.plugin import ActionKind, ActionRecord, ActionRequest, ClusterView, Event, Kind, hookimpl, make_event


class DrainOnEcc:
    plugin_name = "drain_on_ecc"

    @hookimpl
    def ftd_evaluate(self, event: Event, view: ClusterView) -> list[ActionRequest]:
        if event.kind == Kind.ECC:
            return [ActionRequest(kind=ActionKind.DRAIN_NODE, target=event.node, reason="ecc")]
        return []


class PageOnCall:
    """A plugin with its own action kind and a *real* executor that must never run in a sandbox."""

    plugin_name = "page_on_call"

    def __init__(self) -> None:
        self.paged: list[str] = []

    async def _page(self, record: ActionRecord) -> dict[str, Any]:
        self.paged.append(record.request.target)
        return {}

    @hookimpl
    def ftd_register_actions(self) -> dict[str, Any]:
        return {"page": self._page}

    @hookimpl
    def ftd_evaluate(self, event: Event, view: ClusterView) -> list[ActionRequest]:
        if event.kind == Kind.THERMAL:
            return [ActionRequest(kind="page", target=event.node, reason="hot")]
        return []


async def test_sim_clock_wakes_sleepers_in_order_at_their_due_time() -> None:
    clock = SimClock(100.0)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock()))

    tasks = [asyncio.create_task(sleeper(n, s)) for n, s in (("late", 30), ("early", 10), ("never", 500))]
    await asyncio.sleep(0)
    await clock.advance(150.0)
    assert woke == [("early", 110.0), ("late", 130.0)]
    assert clock() == 150.0 and clock.next_due == 600.0
    await clock.advance(120.0)  # never backwards
    assert clock() == 150.0
    tasks[2].cancel()


def _ecc(node: str, ts: float, id_: str) -> Event:
    return make_event(node, "ecc", severity="error", data={"dbe": 1}, ts=ts, id=id_)


async def test_actions_finish_on_simulated_time_and_cooldown_starts_at_their_end() -> None:
    builtins = [default_rule_name(m) for m in DEFAULT_RULES]
    cfg = CoordinatorConfig(disabled_rules=builtins)  # only DrainOnEcc decides; cooldown_s is 600
    box = Sandbox(
        cfg, ledger=memory_store, action_s=60.0, entry_points=False, extra=(DrainOnEcc(),), start=1000.0
    )
    decided: list[tuple[str, str]] = []
    box.engine.observe(
        lambda what, p: (
            decided.append((p.request.target, str(p.state)))
            if what == "action" and p.state in ("pending", "suppressed")
            else None
        )
    )
    for ts, id_ in ((1000.0, "a"), (1030.0, "b"), (1061.0 + 590.0, "c"), (1061.0 + 601.0, "d")):
        await box.clock.advance(ts)
        await box.engine.handle_event(_ecc("node-1", ts, id_))
        await box.settle()
    await box.finish()
    # a: allowed; b: the drain is still running (dedupe); c: 590 s after it finished at 1060 (cooldown);
    # d: 602 s after it finished: allowed again. The action's end is simulated, not the next event.
    assert [s for _, s in decided] == ["pending", "suppressed", "suppressed", "pending"]
    assert box.state.node("node-1") is not None and box.state.node("node-1").drained_by_ftd  # type: ignore[union-attr]
    assert box.engine.counters["events"] == 4
    await box.engine.close()


async def test_a_plugins_own_executor_is_simulated_not_run() -> None:
    plugin = PageOnCall()
    box = Sandbox(CoordinatorConfig(), ledger=memory_store, entry_points=False, extra=(plugin,))
    records = await box.engine.handle_event(
        make_event("node-3", "thermal", severity="warning", ts=5.0, id="t")
    )
    await box.settle()
    await box.finish()
    assert [(r.request.kind, str(r.state)) for r in records] == [("page", "succeeded")]
    assert records[0].detail == {"simulated": True}
    assert plugin.paged == []
    await box.engine.close()


async def test_finish_runs_a_plans_later_steps_too() -> None:
    """A plan's later step (the drain after the job's save and stop) starts only once the earlier
    one ends, so it sets its timer after the clock moved: finish() used to stop advancing and wait
    for it forever."""
    box = Sandbox(CoordinatorConfig(), ledger=memory_store, entry_points=False, start=1000.0)
    presence = JobPresence(job="j1", node="node-1", ranks=[RankInfo(rank=0)])
    box.state.apply_presence("node-1", "j1", presence)
    data = {"pci": "0000:3b:00.0"}
    event = make_event("node-1", "gpu_fallen_off_bus", severity="critical", data=data, ts=1000.0)
    records = await box.engine.handle_event(event)
    await box.settle()
    await asyncio.wait_for(box.finish(), timeout=10)
    assert sorted((str(r.request.kind), str(r.state)) for r in records) == [
        ("checkpoint_restart", "succeeded"),
        ("drain_node", "succeeded"),
    ]
    await box.engine.close()
