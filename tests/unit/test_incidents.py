"""Incidents, not events (issue #10 item 1): application faults never make a node a repeat offender.

The first tests reproduce what was reported: with every built-in rule loaded, two Xid 13, two CUDA
OOM lines, filesystem events or one Xid 13 on three GPUs drained the node (``repeat_offender``
counted any two events of severity >= error with the same ``(kind, code)``). They run all built-ins
together, the way the coordinator does, and check that no rule asks for a drain; positive controls
show a hardware fault still drains.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.coordinator.decide.plugins import evaluate, make_plugin_manager
from ftd.coordinator.model.state import ClusterState
from ftd.events import Event, JobPresence, Kind, RankInfo
from ftd.plugin import ActionRequest
from ftd.plugin.settings import AppFaultPolicy, RuleSettings
from ftd.rules import _incidents, app_faults, repeat_offender, xid_catalog
from ftd.testing import evaluate_rule, make_event, view_with
from tests.properties import examples

GPUS = [("0000:1b:00.0", "GPU-aaaa"), ("0000:3b:00.0", "GPU-bbbb"), ("0000:5b:00.0", "GPU-cccc")]


def all_builtins(events: Iterable[Event], view: ClusterState) -> list[ActionRequest]:
    """Every request the built-in rules make for ``events`` in order (history folded in between)."""
    pm = make_plugin_manager(entry_points=False)
    out: list[ActionRequest] = []
    for event in events:
        result = evaluate(pm, event, view, RuleSettings(), slow_s=float("inf"))
        assert not result.errors, result.errors
        out.extend(result.requests)
        view.apply_event(event)
    return out


def kinds(actions: list[ActionRequest]) -> list[tuple[str, str, str]]:
    return [(a.rule, str(a.kind), a.target) for a in actions]


def xid(code: int, ts: float, gpu: int = 0, node: str = "node-1", **data: Any) -> Event:
    pci, uuid = GPUS[gpu]
    severity = "critical" if code in (48, 64, 79) else "error"
    data = {"code": code, "pci": pci, "uuid": uuid, **data}
    return make_event(node, Kind.XID, severity=severity, data=data, ts=ts)


def log(pattern: str, ts: float, node: str = "node-1", rank: int = 0, severity: str = "error") -> Event:
    return make_event(
        node,
        Kind.LOG_PATTERN,
        severity=severity,
        source="logs",
        data={"file": f"/logs/rank{rank}.out", "pattern": pattern, "text": "...", "line": 1},
        ts=ts,
    )


# --- reproductions: no drain for application faults ------------------------------------------------


def test_two_xid_13_restart_the_job_and_never_drain() -> None:
    view = view_with(jobs={"j1": ["node-1", "node-2"]})
    actions = all_builtins([xid(13, 1000), xid(13, 1000 + 3600 * 2)], view)
    assert ("repeat_offender", "drain_node", "node-1") not in kinds(actions)
    assert [a.kind for a in actions] == ["checkpoint_restart", "checkpoint_restart"]
    assert [a.params["exclude"] for a in actions] == [[], []]  # the node stays in the job's pool


def test_xid_13_on_three_gpus_is_one_incident_one_restart() -> None:
    view = view_with(jobs={"j1": ["node-1"]})
    actions = all_builtins([xid(13, 1000.0, gpu=g) for g in range(3)], view)
    assert kinds(actions) == [("xid_catalog", "checkpoint_restart", "j1")]


def test_the_next_job_on_the_node_is_its_own_incident() -> None:
    """An Xid 13 names no job: it is linked to the jobs on the node when it arrived, so a new job's
    first Xid 13 a few seconds after the last job's is restarted, not taken for the same incident
    (``ftd bench e2e`` runs one job after another on one node exactly like this)."""
    view = view_with(jobs={"a": ["node-1"]})
    first = all_builtins([xid(13, 1000.0)], view)
    view.apply_presence("node-1", "a", None)  # job a left; job b starts on the same node
    view.apply_presence("node-1", "b", JobPresence(job="b", node="node-1", ranks=[RankInfo(rank=0)]))
    second = all_builtins([xid(13, 1005.0, gpu=1)], view)
    assert kinds(first) == [("xid_catalog", "checkpoint_restart", "a")]
    assert kinds(second) == [("xid_catalog", "checkpoint_restart", "b")]


def test_two_cuda_oom_lines_never_drain() -> None:
    view = view_with(jobs={"j1": ["node-1"]})
    actions = all_builtins([log("cuda_oom", 1000, rank=0), log("cuda_oom", 1001, rank=1)], view)
    assert kinds(actions) == [("app_faults", "checkpoint_restart", "j1")]  # one incident: both ranks
    later = all_builtins([log("cuda_oom", 3000)], view)
    assert [a.kind for a in later] == ["checkpoint_restart"] and later[0].params["delay_s"] == 30.0


def test_filesystem_and_memory_events_never_drain() -> None:
    view = view_with(jobs={"j1": ["node-1"]})
    fs = [
        make_event("node-1", Kind.FS_FILL, severity="critical", data={"level": "critical", "path": "/"}, ts=t)
        for t in (1000, 2000, 3000)
    ]
    mem = [
        make_event("node-1", Kind.MEM_PRESSURE, severity="critical", data={"level": "critical"}, ts=t)
        for t in (4000, 5000)
    ]
    actions = all_builtins([*fs, *mem], view)
    assert "drain_node" not in {a.kind for a in actions}
    assert actions, "the events must still be acted on (save / restart)"


def test_one_more_xid_13_after_an_in_place_restart_does_not_drain() -> None:
    view = view_with(jobs={"j1": ["node-1"]})
    actions = all_builtins([xid(13, 1000), xid(13, 1100), xid(31, 1200)], view)
    assert "drain_node" not in {a.kind for a in actions}


def test_storm_summaries_are_not_extra_occurrences() -> None:
    view = view_with(jobs={"j1": ["node-1"]})
    first = xid(48, 1000)
    summary = make_event(
        "node-1", Kind.XID, severity="critical", data={**first.data, "repeat_of": first.id}, ts=1500, count=40
    )
    actions = all_builtins([first, summary], view)
    assert "drain_node" not in {a.kind for a in actions}  # one Xid 48 incident: a reset, no drain


# --- positive controls: hardware still drains ----------------------------------------------------


def test_xid_79_drains() -> None:
    view = view_with(jobs={"j1": ["node-1"]})
    actions = all_builtins([xid(79, 1000)], view)
    assert kinds(actions) == [
        ("xid_catalog", "checkpoint_restart", "j1"),
        ("xid_catalog", "drain_node", "node-1"),
    ]


def test_the_same_hardware_fault_on_the_same_gpu_twice_is_a_repeat_offender() -> None:
    view = view_with(jobs={"j1": ["node-1"]})
    actions = all_builtins([xid(64, 1000), xid(64, 1000 + 3600)], view)
    assert ("repeat_offender", "drain_node", "node-1") in kinds(actions)


def test_the_same_code_on_another_gpu_is_not_a_repeat() -> None:
    view = view_with(jobs={"j1": ["node-1"]})
    actions = evaluate_rule(repeat_offender, [xid(64, 1000, gpu=0), xid(64, 4600, gpu=1)], view)
    assert actions == []


def test_lines_of_one_hardware_incident_are_not_a_repeat() -> None:
    view = view_with(jobs={"j1": ["node-1"]})
    assert evaluate_rule(repeat_offender, [xid(64, 1000), xid(64, 1010)], view) == []


def test_signature_without_uuid_uses_pci_then_index() -> None:
    a = make_event("node-1", Kind.GPU_MISSING, severity="critical", data={"gpu": 3}, ts=1)
    b = make_event("node-1", Kind.GPU_MISSING, severity="critical", data={"gpu": 4}, ts=5000)
    c = make_event("node-1", Kind.GPU_MISSING, severity="critical", data={"gpu": 3}, ts=9000)
    view = view_with(jobs={"j1": ["node-1"]})
    actions = evaluate_rule(repeat_offender, [a, b, c], view)
    assert [x.kind for x in actions] == ["checkpoint_restart", "drain_node"]
    assert "index:3" in actions[1].reason


@pytest.mark.parametrize(
    ("kind", "data", "severity", "hardware"),
    [
        (Kind.XID, {"code": 13}, "error", False),
        (Kind.XID, {"code": 31}, "error", False),
        (Kind.XID, {"code": 94}, "error", False),
        (Kind.XID, {"code": 45}, "info", False),
        (Kind.XID, {"code": 79}, "critical", True),
        (Kind.XID, {"code": 48}, "critical", True),
        (Kind.XID, {"code": 48, "caused_by": "x"}, "critical", False),
        (Kind.XID, {"code": 48, "repeat_of": "x"}, "critical", False),
        (Kind.SXID, {"code": 24007, "extra": {"fatal": True}}, "critical", True),
        (Kind.SXID, {"code": 11004, "extra": {"fatal": False}}, "warning", False),
        (Kind.LOG_PATTERN, {"pattern": "cuda_oom"}, "error", False),
        (Kind.LOG_PATTERN, {"pattern": "nccl_watchdog_timeout"}, "critical", False),
        (Kind.FS_FILL, {"level": "critical"}, "critical", False),
        (Kind.MEM_PRESSURE, {"level": "critical"}, "critical", False),
        (Kind.THERMAL, {"active": True, "sustained": True}, "error", False),
        (Kind.RANK_HEARTBEAT_LOST, {"rank": 1}, "error", False),
        (Kind.GPU_MISSING, {"gpu": 1}, "critical", True),
        (Kind.GPU_HEALTH, {"signal": "nvlink_down", "links_down": [2]}, "error", True),
        (Kind.GPU_HEALTH, {"signal": "pcie_replay"}, "warning", False),
        (Kind.ECC, {"signal": "correctable_rate", "rate_per_hour": 5000}, "warning", False),
        (Kind.ROW_REMAP, {"reasons": ["failure"], "failure": True}, "critical", True),
        (Kind.ROW_REMAP, {"reasons": ["correctable_grew"], "failure": True}, "warning", False),
    ],
)
def test_what_implicates_hardware(kind: Kind, data: dict[str, Any], severity: str, hardware: bool) -> None:
    from ftd.plugin import fault_of

    record = fault_of(make_event("node-1", kind, severity=severity, data=data))
    assert _incidents.implicates_hardware(record) is hardware


# --- the job-level application-fault policy --------------------------------------------------------


def test_crash_loop_backoff_then_notify_after_the_limit() -> None:
    view = view_with(jobs={"j1": ["node-1", "node-2"]})
    hour = 600.0  # incidents 10 minutes apart: all within the 1 h window
    events = [xid(13, 1000 + i * hour, node="node-1" if i % 2 == 0 else "node-2") for i in range(5)]
    actions = evaluate_rule(xid_catalog, events, view)
    assert [a.kind for a in actions] == ["checkpoint_restart"] * 3 + ["notify"] * 2
    assert [a.params["delay_s"] for a in actions[:3]] == [0.0, 30.0, 60.0]
    assert [a.params["attempt"] for a in actions[:3]] == [1, 2, 3]
    assert "crash loop" in actions[3].reason and "not restarting" in actions[3].reason
    assert all(a.kind != "drain_node" for a in actions)


def test_the_window_forgets_old_restarts() -> None:
    view = view_with(jobs={"j1": ["node-1"]})
    events = [xid(13, t) for t in (0, 600, 1200, 1200 + 3601 + 1200)]
    actions = evaluate_rule(xid_catalog, events, view)
    assert [a.kind for a in actions] == ["checkpoint_restart"] * 4


def test_a_different_signature_counts_on_its_own() -> None:
    view = view_with(jobs={"j1": ["node-1"]})
    events = [xid(13, 0), xid(13, 600), xid(13, 1200), log("cuda_oom", 1800)]
    actions = evaluate_rule(xid_catalog, events[:3], view) + evaluate_rule(app_faults, events[3:], view)
    assert [a.kind for a in actions] == ["checkpoint_restart"] * 4
    assert actions[-1].params["delay_s"] == 0.0


def test_the_limits_come_from_the_config() -> None:
    from ftd.config import PolicyConfig

    policy = PolicyConfig(app_fault_restart_limit=1, app_fault_backoff_s=5.0)
    view = view_with(jobs={"j1": ["node-1"]})
    rule_settings = RuleSettings.from_policy(policy)
    actions = evaluate_rule(xid_catalog, [xid(13, 0), xid(13, 600)], view, settings=rule_settings)
    assert [a.kind for a in actions] == ["checkpoint_restart", "notify"]


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(min_value=0, max_value=12), st.floats(min_value=0, max_value=1e4), st.floats(0, 1e5))
def test_backoff_is_monotonic_and_bounded(n: int, base: float, ceiling: float) -> None:
    policy = AppFaultPolicy(backoff_s=base, backoff_max_s=ceiling)
    delays = [policy.delay(i) for i in range(n + 2)]
    assert delays[0] == 0.0
    assert all(a <= b or b == ceiling for a, b in itertools.pairwise(delays))
    assert all(0.0 <= d <= max(ceiling, 0.0) or d == 0.0 for d in delays)


@settings(max_examples=examples(80), deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=10_000), min_size=1, max_size=30))
def test_incident_starts_cover_every_record_within_one_window(stamps: list[float]) -> None:
    from ftd.plugin import FaultRecord

    records = [FaultRecord(ts=t, node="n", kind="xid") for t in stamps]
    starts = _incidents.incident_starts(records)
    assert starts == sorted(starts) and starts[0] == min(stamps)
    assert all(b - a > _incidents.INCIDENT_WINDOW_S for a, b in itertools.pairwise(starts))
    for t in stamps:  # every record lies in the window its incident opened
        opened = max(s for s in starts if s <= t)
        assert t - opened <= _incidents.INCIDENT_WINDOW_S


def test_a_moved_gpu_is_flagged_for_its_hardware_past_only() -> None:
    uuid = GPUS[0][1]
    app = xid(13, 10)
    arrived = make_event("node-7", Kind.GPU_HEALTH, severity="info", data={"uuid": uuid}, ts=5000)
    assert evaluate_rule(repeat_offender, arrived, view_with(history=[app])) == []
    hw = xid(48, 20)
    [flag] = evaluate_rule(repeat_offender, arrived, view_with(history=[app, hw]))
    assert flag.kind == "notify" and "xid 48" in flag.reason and flag.params["faults"] == 1
