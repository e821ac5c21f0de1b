"""Rule settings are handed to each engine's rules, typed: no process-wide global between two engines.

What: the built-in rules' settings (the crash-loop limits of ``policy.app_fault_*``) reach a rule as
the ``settings`` argument of ``ftd_evaluate`` (:class:`ftd.plugin.settings.RuleSettings`, built from
the engine's own config), so two engines in one process -- an HA runner's successive terms, ``ftd
rules test`` next to a coordinator, two sandboxes -- decide each with its own configuration.

Why: the rules used to read a module-level ``APP_POLICY`` that every ``ftd_startup`` overwrote from
whichever coordinator started last (found with ``getattr`` on an untyped coordinator), so an engine
decided with another engine's limits.
"""

from __future__ import annotations

import asyncio

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from ftd.config import CoordinatorConfig, PolicyConfig
from ftd.coordinator.decide.replay import Sandbox
from ftd.coordinator.ledger.sqlite import memory_store
from ftd.events import JobPresence, RankInfo
from ftd.plugin import Event, make_event
from ftd.plugin.settings import AppFaultPolicy, RuleSettings
from ftd.rules import xid_catalog
from ftd.testing import evaluate_rule, view_with


def _xid13(ts: float) -> Event:
    data = {"code": 13, "pci": "0000:3b:00.0", "uuid": "GPU-aaaa"}
    return make_event("node-1", "xid", severity="error", data=data, ts=ts, id=f"x-{ts:g}")


async def _decisions(box: Sandbox) -> list[str]:
    """What ``xid_catalog`` asks for two incidents of one application fault, 15 minutes apart."""
    box.state.apply_presence("node-1", "j1", JobPresence(job="j1", node="node-1", ranks=[RankInfo(rank=0)]))
    kinds: list[str] = []
    for ts in (1000.0, 1900.0):
        await box.clock.advance(ts)
        records = await box.engine.handle_event(_xid13(ts))
        kinds += [str(r.request.kind) for r in records if r.request.rule == "xid_catalog"]
        await box.settle()
        await asyncio.wait_for(box.finish(), timeout=10)
    return kinds


async def test_two_engines_in_one_process_decide_with_their_own_limits() -> None:
    strict_cfg = CoordinatorConfig(policy=PolicyConfig(app_fault_restart_limit=1))
    strict = Sandbox(strict_cfg, ledger=memory_store, entry_points=False, start=900.0)
    lenient = Sandbox(CoordinatorConfig(), ledger=memory_store, entry_points=False, start=900.0)
    try:
        # The lenient one started last; the strict one still stops after its one restart.
        assert await _decisions(strict) == ["checkpoint_restart", "notify"]
        assert await _decisions(lenient) == ["checkpoint_restart", "checkpoint_restart"]
    finally:
        await strict.engine.close()
        await lenient.engine.close()


def test_a_rule_gets_the_settings_it_is_handed() -> None:
    view = view_with(jobs={"j1": ["node-1"]})
    one = RuleSettings(app_faults=AppFaultPolicy(restart_limit=1))
    actions = evaluate_rule(xid_catalog, [_xid13(1000.0), _xid13(1900.0)], view, settings=one)
    assert [str(a.kind) for a in actions] == ["checkpoint_restart", "notify"]
    view = view_with(jobs={"j1": ["node-1"]})
    actions = evaluate_rule(xid_catalog, [_xid13(1000.0), _xid13(1900.0)], view)  # the defaults: 3
    assert [str(a.kind) for a in actions] == ["checkpoint_restart", "checkpoint_restart"]


@given(
    restart_limit=st.integers(min_value=0, max_value=1000),
    window_s=st.floats(min_value=1.0, max_value=1e6),
    backoff_s=st.floats(min_value=0.0, max_value=1e4),
    backoff_max_s=st.floats(min_value=0.0, max_value=1e5),
)
def test_the_settings_carry_every_app_fault_option(
    restart_limit: int, window_s: float, backoff_s: float, backoff_max_s: float
) -> None:
    policy = PolicyConfig(
        app_fault_restart_limit=restart_limit,
        app_fault_window_s=window_s,
        app_fault_backoff_s=backoff_s,
        app_fault_backoff_max_s=backoff_max_s,
    )
    got = RuleSettings.from_policy(policy).app_faults
    assert (got.restart_limit, got.window_s, got.backoff_s, got.backoff_max_s) == (
        restart_limit,
        window_s,
        backoff_s,
        backoff_max_s,
    )


def test_every_app_fault_option_of_the_config_has_a_setting() -> None:
    """A new ``policy.app_fault_*`` option must reach the rules too (a field of AppFaultPolicy)."""
    options = {f.name for f in msgspec.structs.fields(PolicyConfig) if f.name.startswith("app_fault_")}
    carried = {f"app_fault_{name}" for name in AppFaultPolicy.__dataclass_fields__}
    assert options == carried
