"""A rule for every signal the agent detects (issue #10 item 2), and the filesystem rule (item 3).

Each test feeds the event shape the agent sends (the watcher's data keys) to one built-in rule and
checks the default action, its order (save before drain / reset) and the reason text.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ftd.coordinator.decide.plugins import evaluate, make_plugin_manager
from ftd.coordinator.decide.policy import PolicyGate
from ftd.events import Kind
from ftd.plugin import ActionKind, ActionRecord, ActionRequest, ActionState
from ftd.plugin.settings import RuleSettings
from ftd.rules import ecc_remap, fs_fill, gpu_health, memory, nccl_ib, sxid, thermal, xid_catalog
from ftd.testing import evaluate_rule, make_event, view_with
from tests.properties import examples

PCI, UUID = "0000:3b:00.0", "GPU-1111"
GPU = {"pci": PCI, "uuid": UUID, "gpu": 2}


def kinds(actions: list[ActionRequest]) -> list[tuple[str, str]]:
    return [(str(a.kind), a.target) for a in actions]


def view():  # type: ignore[no-untyped-def]
    return view_with(jobs={"j1": ["node-1", "node-2"]})


def test_gpu_missing_drains_after_moving_the_job() -> None:
    event = make_event("node-1", Kind.GPU_MISSING, severity="critical", data={**GPU, "reason": "lost"})
    actions = evaluate_rule(gpu_health, event, view())
    assert kinds(actions) == [("checkpoint_restart", "j1"), ("drain_node", "node-1")]
    assert actions[0].params["exclude"] == ["node-1"] and UUID in actions[1].reason
    count = make_event(
        "node-1", Kind.GPU_MISSING, severity="critical", data={"expected": 8, "found": 7, "missing_uuids": []}
    )
    assert "7 of 8 gpus present" in evaluate_rule(gpu_health, count, view())[1].reason


def test_nvlink_down_restarts_excluding_the_node_and_drains() -> None:
    event = make_event(
        "node-1",
        Kind.GPU_HEALTH,
        severity="error",
        data={**GPU, "signal": "nvlink_down", "links_down": [3, 5]},
    )
    actions = evaluate_rule(gpu_health, event, view())
    assert kinds(actions) == [("checkpoint_restart", "j1"), ("drain_node", "node-1")]
    assert "links 3, 5" in actions[1].reason and actions[0].params["exclude"] == ["node-1"]


def test_gpu_health_warnings_notify_and_old_keys_still_match() -> None:
    replay = make_event("node-1", Kind.GPU_HEALTH, data={**GPU, "pcie_replay_burst": 120})  # no signal key
    [note] = evaluate_rule(gpu_health, replay, view())
    assert (note.kind, "pcie replays" in note.reason) == ("notify", True)
    retired = make_event("node-1", Kind.GPU_HEALTH, severity="error", data={**GPU, "signal": "retired_pages"})
    assert kinds(evaluate_rule(gpu_health, retired, view())) == [
        ("checkpoint_restart", "j1"),
        ("gpu_reset", "node-1"),
    ]
    over = make_event("node-1", Kind.GPU_HEALTH, severity="info", data={**GPU, "stalled": False})
    assert evaluate_rule(gpu_health, over, view()) == []


def test_memory_leak_saves_first_then_restarts_when_it_continues() -> None:
    v = view()
    leak = {"leak": True, "job": "j1", "rank": 3, "pid": 77, "rss_mb": 9000, "growth_mb_per_min": 120}
    first = make_event("node-1", Kind.MEM_PRESSURE, data={**leak, "time_to_exhaustion_s": 900}, ts=100)
    [save] = evaluate_rule(memory, first, v)
    assert (save.kind, save.target, save.params["stop"], save.params["rank"]) == (
        "checkpoint",
        "j1",
        False,
        3,
    )
    assert "before the OOM killer" in save.reason
    again = make_event("node-1", Kind.MEM_PRESSURE, data={**leak, "time_to_exhaustion_s": 400}, ts=700)
    [restart] = evaluate_rule(memory, again, v)
    assert (restart.kind, restart.params["exclude"]) == ("checkpoint_restart", [])
    critical = make_event("node-2", Kind.MEM_PRESSURE, severity="critical", data=leak, ts=800)
    assert [a.kind for a in evaluate_rule(memory, critical, view())] == ["checkpoint_restart"]


def test_host_memory_levels() -> None:
    low = make_event(
        "node-1", Kind.MEM_PRESSURE, data={"leak": False, "level": "warning", "mem_available_pct": 7}
    )
    assert [(a.kind, a.params.get("stop")) for a in evaluate_rule(memory, low, view())] == [
        ("checkpoint", False)
    ]
    crit = make_event(
        "node-1", Kind.MEM_PRESSURE, severity="critical", data={"leak": False, "level": "critical"}
    )
    assert [a.kind for a in evaluate_rule(memory, crit, view())] == ["checkpoint_restart"]
    ok = make_event("node-1", Kind.MEM_PRESSURE, severity="info", data={"leak": False, "level": "ok"})
    assert evaluate_rule(memory, ok, view()) == []


def _nccl(node: str, ts: float, pattern: str = "nccl_watchdog_timeout"):  # type: ignore[no-untyped-def]
    return make_event(
        node,
        Kind.LOG_PATTERN,
        severity="critical",
        source="logs",
        data={"pattern": pattern, "file": "/l"},
        ts=ts,
    )


def test_nccl_restarts_in_place_once_per_incident() -> None:
    v = view()
    actions = evaluate_rule(nccl_ib, [_nccl("node-1", 1000), _nccl("node-2", 1000.4)], v)
    assert kinds(actions) == [("checkpoint_restart", "j1")] and actions[0].params["exclude"] == []
    assert evaluate_rule(nccl_ib, _nccl("node-1", 2000, "nccl_warn"), v) == []


def test_nccl_drains_only_on_hardware_evidence_on_that_node() -> None:
    v = view()
    link = make_event(
        "node-2",
        Kind.IB_LINK,
        severity="error",
        source="kmsg",
        data={"pci": "0000:c1:00.0", "message": "ibp193s0: Link down", "extra": {"interface": "ibp193s0"}},
        ts=500,
    )
    [note] = evaluate_rule(nccl_ib, link, v)
    assert note.kind == "notify" and "ibp193s0" in note.reason
    actions = evaluate_rule(nccl_ib, _nccl("node-2", 1000), v)
    assert kinds(actions) == [("checkpoint_restart", "j1"), ("drain_node", "node-2")]
    assert "ib link ibp193s0 down" in actions[1].reason and actions[0].params["exclude"] == ["node-2"]
    late = evaluate_rule(nccl_ib, _nccl("node-2", 500 + 901), view())
    assert "drain_node" not in {a.kind for a in late}


def test_fatal_sxid_drains_nonfatal_is_recorded() -> None:
    fatal = make_event(
        "node-1",
        Kind.SXID,
        severity="critical",
        data={"code": 24007, "pci": PCI, "extra": {"fatal": True, "link": 12}},
    )
    actions = evaluate_rule(sxid, fatal, view())
    assert kinds(actions) == [("checkpoint_restart", "j1"), ("drain_node", "node-1")]
    assert "fatal sxid 24007" in actions[1].reason and "link 12" in actions[1].reason
    mild = make_event(
        "node-1", Kind.SXID, severity="warning", data={"code": 11004, "extra": {"fatal": False}}
    )
    assert evaluate_rule(sxid, mild, view()) == []


def test_thermal_notifies_then_saves_on_sustained_throttling() -> None:
    hot = make_event("node-1", Kind.THERMAL, data={**GPU, "active": True, "temperature_c": 91})
    [note] = evaluate_rule(thermal, hot, view())
    assert note.kind == "notify" and "91C" in note.reason
    sustained = make_event(
        "node-1",
        Kind.THERMAL,
        severity="error",
        data={
            **GPU,
            "active": True,
            "sustained": True,
            "sustained_s": 320,
            "throttle_reasons": ["hw_slowdown"],
        },
    )
    actions = evaluate_rule(thermal, sustained, view())
    assert kinds(actions) == [("checkpoint", "j1"), ("notify", "node-1")]
    assert actions[0].params["stop"] is False and "sustained throttling for 320s" in actions[0].reason
    cleared = make_event("node-1", Kind.THERMAL, severity="info", data={**GPU, "active": False})
    assert evaluate_rule(thermal, cleared, view()) == []


def test_no_spare_rows_drains_for_rma_after_the_save() -> None:
    failed = make_event(
        "node-1", Kind.ROW_REMAP, severity="critical", data={**GPU, "reasons": ["failure"], "failure": True}
    )
    actions = evaluate_rule(ecc_remap, failed, view())
    assert kinds(actions) == [("checkpoint_restart", "j1"), ("drain_node", "node-1")]
    assert "no spare rows" in actions[1].reason and "RMA" in actions[1].reason
    later = make_event(  # the GPU failed long ago; a correctable remap now is no new failure
        "node-1",
        Kind.ROW_REMAP,
        severity="warning",
        data={**GPU, "reasons": ["correctable_grew"], "failure": True},
    )
    assert evaluate_rule(ecc_remap, later, view()) == []


def test_correctable_ecc_rate_notifies() -> None:
    data = {**GPU, "signal": "correctable_rate", "rate_per_hour": 4200.0, "threshold_per_hour": 1000.0}
    [note] = evaluate_rule(ecc_remap, make_event("node-1", Kind.ECC, data=data), view())
    assert note.kind == "notify" and "4200/h" in note.reason
    under = {**data, "rate_per_hour": 10.0}
    assert evaluate_rule(ecc_remap, make_event("node-1", Kind.ECC, data=under), view()) == []


def test_xid_48_alone_resets_with_63_drains() -> None:
    v = view()
    x48 = make_event(
        "node-1", Kind.XID, severity="critical", data={"code": 48, "pci": PCI, "uuid": UUID}, ts=10
    )
    assert kinds(evaluate_rule(xid_catalog, x48, v)) == [
        ("checkpoint_restart", "j1"),
        ("gpu_reset", "node-1"),
    ]
    x63 = make_event("node-1", Kind.XID, severity="info", data={"code": 63, "pci": PCI, "uuid": UUID}, ts=11)
    actions = evaluate_rule(xid_catalog, x63, v)
    assert kinds(actions) == [("checkpoint_restart", "j1"), ("drain_node", "node-1")]
    assert "xid 48 with xid 63/64" in actions[1].reason and actions[1].params["severity"] == "critical"
    other_gpu = make_event(
        "node-1", Kind.XID, severity="info", data={"code": 63, "pci": "0000:5b:00.0"}, ts=12
    )
    assert evaluate_rule(xid_catalog, other_gpu, view_with(jobs={"j1": ["node-1"]}, history=[x48])) == []


# --- filesystem ------------------------------------------------------------------------------------


def test_inodes_are_named_and_no_far_forecast_is_printed() -> None:
    event = make_event(
        "node-1",
        Kind.FS_FILL,
        severity="critical",
        data={
            "reason": "threshold",
            "level": "critical",
            "resource": "inodes",
            "path": "/scratch",
            "used_pct": 0.4,
            "inodes_used_pct": 97.2,
            "time_to_full_s": 1900800.0,
        },
    )
    actions = evaluate_rule(fs_fill, event, view())
    assert "filesystem /scratch inodes at 97%" in actions[0].reason
    assert "at 0%" not in actions[0].reason and "full in" not in actions[0].reason


def test_a_forecast_saves_and_never_stops_even_when_near() -> None:
    burst = make_event(
        "node-1",
        Kind.FS_FILL,
        severity="critical",
        data={"reason": "forecast", "level": "ok", "path": "/", "used_pct": 40.0, "time_to_full_s": 1.9},
    )
    actions = evaluate_rule(fs_fill, burst, view())
    assert kinds(actions) == [("checkpoint", "j1"), ("notify", "node-1")]
    assert actions[0].params["stop"] is False and "forecast" in actions[0].reason


def test_a_job_back_on_a_still_full_filesystem_is_moved_off() -> None:
    v = view()
    full = make_event(
        "node-1",
        Kind.FS_FILL,
        severity="critical",
        data={"reason": "threshold", "level": "critical", "path": "/"},
        ts=100,
    )
    evaluate_rule(fs_fill, full, v)
    disk_full = make_event(
        "node-1", Kind.LOG_PATTERN, severity="error", data={"pattern": "disk_full", "job": "j9"}, ts=900
    )
    actions = evaluate_rule(fs_fill, disk_full, v)
    assert kinds(actions) == [("checkpoint_restart", "j9"), ("notify", "node-1")]
    assert actions[0].params["exclude"] == ["node-1"]
    cleared = make_event(
        "node-1",
        Kind.FS_FILL,
        severity="info",
        data={"reason": "threshold", "level": "ok", "path": "/"},
        ts=1000,
    )
    evaluate_rule(fs_fill, cleared, v)
    assert (
        evaluate_rule(
            fs_fill, make_event("node-1", Kind.LOG_PATTERN, data={"pattern": "disk_full"}, ts=1100), v
        )
        == []
    )


def test_the_critical_crossing_is_not_blocked_by_the_forecast_save() -> None:
    """The reported sequence: a forecast, the job goes on, the critical crossing 14 s later acts."""
    clock = [0.0]
    gate = PolicyGate(cooldown_s=600, clock=lambda: clock[0])
    v = view()
    forecast = make_event(
        "node-1",
        Kind.FS_FILL,
        severity="warning",
        data={"reason": "forecast", "level": "warning", "path": "/", "time_to_full_s": 300},
        ts=0,
    )
    critical = make_event(
        "node-1",
        Kind.FS_FILL,
        severity="critical",
        data={"reason": "threshold", "level": "critical", "path": "/"},
        ts=14,
    )
    for i, request in enumerate(evaluate_rule(fs_fill, forecast, v)):
        record = ActionRecord(id=f"a{i}", request=request, state=ActionState.PENDING)
        assert gate.decide(request, v).allowed
        gate.started(record)
        gate.finished(record)
    clock[0] = 14.0
    verdicts = [gate.decide(r, v) for r in evaluate_rule(fs_fill, critical, v)]
    assert [v_.allowed for v_ in verdicts] == [True, True], [v_.reason for v_ in verdicts]


def test_gate_lets_a_higher_severity_through_the_cooldown_of_a_lower_one() -> None:
    clock = [0.0]
    gate = PolicyGate(cooldown_s=600, clock=lambda: clock[0])
    low = ActionRequest(kind=ActionKind.NOTIFY, target="node-1", reason="r", params={"severity": "warning"})
    record = ActionRecord(id="a1", request=low, state=ActionState.PENDING)
    gate.started(record)
    gate.finished(record)
    clock[0] = 10.0
    assert not gate.decide(low).allowed  # same severity: cooling down
    lower = ActionRequest(kind=ActionKind.NOTIFY, target="node-1", reason="r", params={"severity": "info"})
    assert not gate.decide(lower).allowed
    unsaid = ActionRequest(kind=ActionKind.NOTIFY, target="node-1", reason="r")
    assert not gate.decide(unsaid).allowed  # no severity: cooldown as before
    high = ActionRequest(kind=ActionKind.NOTIFY, target="node-1", reason="r", params={"severity": "critical"})
    assert gate.decide(high).allowed
    record2 = ActionRecord(id="a2", request=high, state=ActionState.PENDING)
    gate.started(record2)
    gate.finished(record2)
    clock[0] = 20.0
    assert not gate.decide(high).allowed and not gate.decide(low).allowed  # now the critical one cools


def test_gate_restores_severity_from_the_ledger() -> None:
    high = ActionRequest(kind=ActionKind.DRAIN_NODE, target="n", reason="r", params={"severity": "error"})
    gate = PolicyGate(cooldown_s=600, clock=lambda: 100.0)
    gate.restore([ActionRecord(id="a", request=high, state=ActionState.SUCCEEDED, updated=50.0)])
    assert not gate.decide(high).allowed
    crit = ActionRequest(kind=ActionKind.DRAIN_NODE, target="n", reason="r", params={"severity": "critical"})
    assert gate.decide(crit).allowed


def test_gate_acts_again_when_the_job_came_back_onto_the_node_it_was_moved_off() -> None:
    clock = [0.0]
    gate = PolicyGate(cooldown_s=600, clock=lambda: clock[0])
    params = {"node": "node-1", "exclude": ["node-1"], "severity": "critical"}
    moved = ActionRequest(kind=ActionKind.CHECKPOINT_RESTART, target="j1", reason="full", params=params)
    record = ActionRecord(id="a1", request=moved, state=ActionState.PENDING)
    gate.started(record)
    gate.finished(record)
    clock[0] = 60.0
    elsewhere = view_with(jobs={"j1": ["node-2"]})
    assert not gate.decide(moved, elsewhere).allowed  # it went elsewhere: cooldown as usual
    back = view_with(jobs={"j1": ["node-1"]})
    assert gate.decide(moved, back).allowed  # back on the node it was moved off: act again
    in_place = ActionRequest(
        kind=ActionKind.CHECKPOINT_RESTART, target="j2", reason="r", params={"node": "node-1", "exclude": []}
    )
    record2 = ActionRecord(id="a2", request=in_place, state=ActionState.PENDING)
    gate.started(record2)
    gate.finished(record2)
    assert not gate.decide(in_place, view_with(jobs={"j2": ["node-1"]})).allowed  # never moved: cooldown


def test_nvlink5_follows_the_parsers_decode_and_names_its_sub_code() -> None:
    from ftd.agent.kmsg_parse import parse_lines
    from ftd.agent.watchers.kmsg import kernel_event_to_event

    fatal_line = (
        "[ 900.1] NVRM: Xid (PCI:0000:1b:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 04 "
        "(0x00470a11 0x00000000 0x00000000 0x00000000 0x00000000 0x00000002)"
    )
    benign_line = (
        "[ 901.1] NVRM: Xid (PCI:0000:1b:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 01 (0x00000004 0x0)"
    )
    fatal, benign = (
        kernel_event_to_event("node-1", k) for line in (fatal_line, benign_line) for k in parse_lines([line])
    )
    actions = evaluate_rule(xid_catalog, fatal, view())
    assert kinds(actions) == [("checkpoint_restart", "j1"), ("gpu_reset", "node-1")]
    assert "NETIR_LINK_EVT, link 4, sub-code 4, intr 0x00470a11" in actions[1].reason
    assert kinds(evaluate_rule(xid_catalog, benign, view())) == [("notify", "node-1")]


def test_kernel_events_aer_oom_hung_task() -> None:
    from ftd.rules import kernel

    fatal = make_event(
        "node-1", Kind.PCIE_AER, severity="critical", data={"pci": PCI, "extra": {"aer": "Fatal"}}
    )
    actions = evaluate_rule(kernel, fatal, view())
    assert kinds(actions) == [("checkpoint_restart", "j1"), ("drain_node", "node-1")]
    assert actions[0].params["exclude"] == ["node-1"]
    nonfatal = make_event("node-1", Kind.PCIE_AER, severity="error", data={"pci": PCI})
    assert kinds(evaluate_rule(kernel, nonfatal, view())) == [("notify", "node-1")]
    corrected = make_event("node-1", Kind.PCIE_AER, severity="info", data={"pci": PCI})
    assert evaluate_rule(kernel, corrected, view()) == []
    oom = make_event("node-1", Kind.OOM_KILL, severity="error", data={"pid": 42, "process": "python"})
    [note] = evaluate_rule(kernel, oom, view())
    assert note.kind == "notify" and "python (pid 42)" in note.reason
    hung = make_event(
        "node-1", Kind.HUNG_TASK, data={"pid": 43, "process": "python", "extra": {"blocked_s": 120}}
    )
    assert "blocked for 120s" in evaluate_rule(kernel, hung, view())[0].reason


# --- bad input: no built-in rule raises, whatever the data ---------------------------------------

_KEYS = [
    "code", "pci", "uuid", "index", "gpu", "job", "rank", "pid", "pattern", "signal", "level", "reason",
    "resource", "used_pct", "inodes_used_pct", "time_to_full_s", "eta_s", "leak", "links_down", "active",
    "sustained", "sustained_s", "throttle_reasons", "temperature_c", "rate_per_hour", "threshold_per_hour",
    "reasons", "failure", "pending", "extra", "message", "action", "repeat_of", "caused_by", "path", "mount",
    "stalled", "missing_uuids", "expected", "found", "rss_mb", "growth_mb_per_min", "time_to_exhaustion_s",
    "mem_available_pct", "counters", "sram_uncorrectable", "dbe", "file", "jobs",
]  # fmt: skip
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 200),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.one_of(st.integers(-2, 9), st.text(max_size=5)), max_size=3),
    st.dictionaries(st.sampled_from(["fatal", "caused_by_previous", "link", "nvlink5_unit", "aer"]),
                    st.one_of(st.booleans(), st.integers(), st.text(max_size=5)), max_size=3),
)  # fmt: skip
_PM = make_plugin_manager(entry_points=False)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([k.value for k in Kind]),
            st.sampled_from(["info", "warning", "error", "critical"]),
            st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=8),
        ),
        min_size=1,
        max_size=4,
    )
)
@example(events=[("log_pattern", "info", {"pattern": []})])  # CI 2026-12-04: hang's set lookup raised
def test_no_builtin_rule_raises_on_any_data(events: list[tuple[str, str, dict[str, object]]]) -> None:
    state = view_with(jobs={"j1": ["node-1", "node-2"]})
    for i, (kind, severity, data) in enumerate(events):
        event = make_event("node-1", kind, severity=severity, data=data, ts=1000.0 + i)
        result = evaluate(_PM, event, state, RuleSettings(), slow_s=float("inf"))
        assert result.errors == [], result.errors
        state.apply_event(event)
