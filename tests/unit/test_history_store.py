"""The cluster state's every-event history (issue #25 part 1): kept as plain tuples the garbage
collector stops tracking, read back as the same records rules always saw; and the set of nodes ftd
drained, kept by ``mark_drained`` instead of scanned per drain, gives the gate the same verdicts."""

from __future__ import annotations

import gc

from ftd.coordinator.decide.policy import PolicyGate
from ftd.coordinator.model.state import ClusterState
from ftd.events import Event, make_event
from ftd.plugin import ActionKind, ActionRequest, FaultRecord, fault_of
from ftd.plugin.view import HISTORY_LIMIT


def _events(node: str, n: int) -> list[Event]:
    kinds = [
        ("gpu_health", "info", {"gpu": 3, "power_w": 412.5}),
        ("xid", "error", {"code": 79, "pci": "0000:3b:00.0", "uuid": "GPU-a"}),
        (
            "log_pattern",
            "warning",
            {"pattern": "nccl_timeout", "job": "7", "extra": {"caused_by_previous": True}},
        ),
        ("thermal", "info", {"gpu": 1, "temp_c": 71, "throttle": ["hw_slowdown"]}),
    ]
    return [
        make_event(node, kind, severity=sev, data=dict(data), ts=1000.0 + i, id=f"{node}-{i}")
        for i, (kind, sev, data) in ((i, kinds[i % len(kinds)]) for i in range(n))
    ]


def test_node_events_are_the_records_fault_of_builds_oldest_first_bounded() -> None:
    state = ClusterState()
    events = _events("node-1", HISTORY_LIMIT + 4)
    for event in events:
        state.apply_event(event)
    got = state.node_events("node-1")
    kept = events[4:]  # the oldest 4 fell out of the bound
    assert len(got) == HISTORY_LIMIT
    assert all(type(r) is FaultRecord for r in got)
    assert list(got) == [fault_of(e) for e in kept]
    assert [r.event_id for r in got] == [e.id for e in kept]
    assert got[1].data is kept[1].data  # the event's own data, not a copy
    assert got[3].data["throttle"] == ["hw_slowdown"]
    assert got[0].index == 3 and got[0].count == 1  # the fields, not tuple's methods
    assert got[1].signature == ("xid", 79) and got[1].gpu_id == "GPU-a"
    assert got[2].linked and got[2].concerns("7") and not got[2].concerns("8")
    assert state.node_events("node-2") == ()
    assert [r.event_id for r in state.node_history("node-1")] == [e.id for e in events if e.kind == "xid"]


def test_history_tuples_are_left_out_of_the_garbage_collectors_scans() -> None:
    state = ClusterState()
    for event in _events("node-1", 40):
        state.apply_event(event)
    gc.collect()  # a collection is where CPython stops tracking tuples of untracked values
    untracked = [fields for fields in state.recent["node-1"] if not gc.is_tracked(fields)]
    assert len(untracked) == 40


def test_keyword_construction_and_immutability_of_a_record() -> None:
    record = FaultRecord(ts=1.0, node="n", kind="xid", code=48)
    assert (record.data, record.jobs, record.count, record.index) == ({}, (), 1, None)
    try:
        record.code = 79  # type: ignore[misc]
    except AttributeError:
        pass
    else:
        raise AssertionError("a FaultRecord must not be changed")


def test_the_gate_counts_drained_nodes_kept_by_mark_drained() -> None:
    state = ClusterState()
    for i in range(10):
        state.mark_drained(f"node-{i}", "x", drained=False)  # known, in service
    gate = PolicyGate(max_drained_fraction=0.2)  # budget 2 of 10
    state.mark_drained("node-1", "xid 79")
    state.mark_drained("node-2", "xid 79")
    assert state.drained_by_ftd() == {"node-1", "node-2"}
    drain = ActionRequest(kind=ActionKind.DRAIN_NODE, target="node-3", reason="xid 79")
    verdict = gate.decide(drain, state)
    assert not verdict.allowed and "3 of 10 nodes" in verdict.reason
    state.mark_drained("node-2", "", drained=False)  # back in service
    assert state.drained_by_ftd() == {"node-1"}
    assert gate.decide(drain, state).allowed
    assert state.drained_nodes() == {"node-1": "xid 79"}
    # a node the state has never seen counts towards the cluster's size
    unknown = ActionRequest(kind=ActionKind.DRAIN_NODE, target="node-99", reason="xid 79")
    assert gate.decide(unknown, state).allowed
