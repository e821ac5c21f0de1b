"""Never fold novelty (ftd.coordinator.intake.novelty, used by Admission.triage): over its rate a
node's critical events and the first event of each signature in the window are decided, the rest
folded; every event is either decided or counted in the node's fold summary, exactly once."""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.coordinator.intake.admission import Admission
from ftd.coordinator.intake.fairness import InputBook, RateLimiter
from ftd.coordinator.intake.novelty import Novelty, is_critical, signature_of
from ftd.coordinator.intake.placement import Placement
from ftd.events import Event, Kind, Severity, make_event
from tests.properties import examples


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _admission(clock: Clock, *, burst: float = 5, reserve: float = 2, max_signatures: int = 64) -> Admission:
    return Admission(
        placement=cast(Placement, None),  # triage never asks it (only heartbeat events do, in admit)
        limiter=RateLimiter(rate=1e-6, burst=burst, reserve=reserve, clock=clock),
        inputs=InputBook(window_s=60, clock=clock),
        novelty=Novelty(window_s=60, max_signatures=max_signatures, clock=clock),
    )


def _xid(node: str, code: int, severity: Severity = Severity.WARNING) -> Event:
    return make_event(node, Kind.XID, severity=severity, data={"code": code})


def test_signature_is_what_the_fault_is_not_which_event() -> None:
    a, b = _xid("n1", 43), _xid("n1", 43)
    assert a.id != b.id and signature_of(a) == signature_of(b) == ("xid", 43, "")
    assert signature_of(_xid("n1", 79)) != signature_of(a)
    pattern = make_event("n1", Kind.LOG_PATTERN, data={"pattern": "cuda_oom", "signal": "x"})
    assert signature_of(pattern) == ("log_pattern", None, "cuda_oom")
    health = make_event("n1", Kind.GPU_HEALTH, data={"signal": "throttle", "code": True})
    assert signature_of(health) == ("gpu_health", None, "throttle")  # a bool is no code


@pytest.mark.parametrize(
    ("event", "critical"),
    [
        (_xid("n", 79, Severity.WARNING), True),  # the catalog calls 79 fatal, whatever the severity
        (_xid("n", 48, Severity.ERROR), True),
        (_xid("n", 43, Severity.ERROR), False),
        (_xid("n", 43, Severity.CRITICAL), True),
        (make_event("n", Kind.GPU_FALLEN_OFF_BUS, severity=Severity.ERROR), True),
        (make_event("n", Kind.GPU_HEALTH, severity=Severity.ERROR, data={"code": 79}), False),
    ],
)
def test_critical_events(event: Event, critical: bool) -> None:
    assert is_critical(event) is critical


def test_xid_79_in_an_xid_43_flood_is_decided_and_the_rest_folded() -> None:
    clock = Clock()
    admission = _admission(clock)
    flood = [_xid("n1", 43, Severity.ERROR) for _ in range(500)]
    flood.insert(250, _xid("n1", 79, Severity.ERROR))
    decided = admission.triage(flood)
    # burst 5 + reserve 2 (error may take it); over the rate the first 43 (new in the window), then
    # the 79 (critical); the other 43s are no news any more
    assert [e.id for e in decided] == [e.id for e in flood[:8]] + [flood[250].id]
    assert admission.inputs.folded_total == len(flood) - 9
    assert admission.novelty.evaluated_critical == 1 and admission.novelty.evaluated_novel == 1


def test_first_of_each_signature_per_window_then_the_cap() -> None:
    clock = Clock()
    admission = _admission(clock, burst=1, reserve=0, max_signatures=3)
    assert len(admission.triage([_xid("n1", 43)])) == 1  # the burst
    decided = admission.triage([_xid("n1", code) for code in (43, 43, 13, 13, 31, 45, 13)])
    assert [e.data["code"] for e in decided] == [43, 13, 31]  # 45: over the cap of 3 new signatures
    assert admission.triage([_xid("n2", 43)])  # another node: its own bucket and window
    clock.now += 61  # a new window: 43 is news again, once
    assert [e.data["code"] for e in admission.triage([_xid("n1", 43), _xid("n1", 43)])] == [43]


_kinds = st.sampled_from([Kind.XID, Kind.GPU_HEALTH, Kind.LOG_PATTERN, Kind.THERMAL])
_severities = st.sampled_from(list(Severity))


@st.composite
def _events(draw: Any) -> list[tuple[Event, float]]:
    out = []
    for _ in range(draw(st.integers(0, 120))):
        kind = draw(_kinds)
        data: dict[str, Any] = {}
        if kind == Kind.XID:
            data["code"] = draw(st.sampled_from([13, 31, 43, 48, 79]))
        elif kind == Kind.LOG_PATTERN:
            data["pattern"] = draw(st.sampled_from(["a", "b"]))
        event = make_event(draw(st.sampled_from(["n1", "n2"])), kind, severity=draw(_severities), data=data)
        out.append((event, draw(st.sampled_from([0.0, 0.0, 0.0, 30.0]))))  # time passing before it
    return out


@settings(max_examples=examples(200), deadline=None)
@given(_events(), st.integers(1, 4))
def test_every_event_is_decided_or_folded_exactly_once(stream: list[tuple[Event, float]], cap: int) -> None:
    clock = Clock()
    admission = _admission(clock, burst=3, reserve=2, max_signatures=cap)
    decided: list[Event] = []
    for event, wait in stream:
        clock.now += wait
        got = admission.triage([event])
        decided.extend(got)
        if is_critical(event):
            assert got == [event]  # critical: never folded
    folded = admission.inputs.pending()
    folded_count = Counter({s.node: int(s.data["folded"]) for s in folded})
    decided_count = Counter(e.node for e in decided)
    sent_count = Counter(e.node for e, _ in stream)
    assert decided_count + folded_count == sent_count  # exact accounting, per node
    assert len({e.id for e in decided}) == len(decided)  # none decided twice
    folded_ids = [i for w in admission.inputs._open.values() for i in w.folded_ids]
    assert sorted(folded_ids + [e.id for e in decided]) == sorted(e.id for e, _ in stream)
