"""The coordinator's pair-test book and matrix (ftd/coordinator/model/pairs.py, GET /v1/fabric/pairs).

``pair_test`` events folded into the state give the newest result per pair, the baseline, a matrix
judged against the hardware profile's expectation (or the baseline only, saying why), and the
return-to-service answer, which fails closed: no test since the drain, a slow one, or a failed one
is not a pass.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import ApiConfig, Config, CoordinatorConfig
from ftd.config.schema import HardwareConfig
from ftd.coordinator.api import Api
from ftd.coordinator.ledger.sqlite import Ledger
from ftd.coordinator.model.pairs import fleet_expectation
from ftd.coordinator.model.state import ClusterState
from ftd.coordinator.wiring import build
from ftd.events import Event, Kind, Severity, make_event
from ftd.fabric.pairs import PairResult


def _event(a: str, b: str, ab: float | None, ba: float | None, ts: float, error: str = "") -> Event:
    result = PairResult(a=a, b=b, a_to_b_gbps=ab, b_to_a_gbps=ba, rtt_ms=0.2, bytes_moved=1, error=error)
    event = make_event(a, Kind.PAIR_TEST, severity=Severity.INFO, source="pair_tests", data=result.as_dict())
    return Event(**{**{f: getattr(event, f) for f in event.__struct_fields__}, "ts": ts})


def _state() -> ClusterState:
    state = ClusterState()
    for i, (a, b) in enumerate([("n1", "n2"), ("n3", "n4"), ("n5", "n6")]):
        state.apply_event(_event(a, b, 20.0, 21.0, 100.0 + i))
    return state


def test_events_make_the_matrix_judged_against_the_profile() -> None:
    state = _state()
    state.apply_event(_event("n7", "n8", 2.0, 20.0, 110.0))
    expect, profile, why = fleet_expectation(HardwareConfig(profile="h200-sxm"))
    assert expect is not None and profile == "h200-sxm" and why == ""
    matrix = state.pairs.matrix(expect, profile, now=120.0)
    assert matrix["nodes"] == ["n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8"]
    cells = {(c["from"], c["to"]): c for c in matrix["cells"]}
    assert len(cells) == 8
    assert cells[("n7", "n8")]["status"] == "slow" and cells[("n8", "n7")]["status"] == "pass"
    assert cells[("n1", "n2")]["status"] == "pass" and cells[("n1", "n2")]["age_s"] == 20.0


def test_an_unknown_profile_is_judged_against_the_baseline_only_and_says_so() -> None:
    expect, profile, why = fleet_expectation(HardwareConfig(profile="no-such"))
    assert expect is None and "unknown hardware profile no-such" in why
    assert "not set" in fleet_expectation(HardwareConfig())[2]
    state = _state()
    state.apply_event(_event("n7", "n8", 2.0, 20.0, 110.0))
    cells = {(c["from"], c["to"]): c for c in state.pairs.matrix(None, profile, 120.0)["cells"]}
    assert cells[("n7", "n8")]["status"] == "slow"
    assert any("baseline only" in r for r in cells[("n7", "n8")]["reasons"])


def test_return_to_service_needs_a_passing_pair_test_taken_after_the_drain() -> None:
    state = _state()
    expect, profile, _ = fleet_expectation(HardwareConfig(profile="h200-sxm"))
    ok, why = state.pairs.passed_since("n1", 150.0, expect, profile)
    assert not ok and "no pair test of n1" in why
    state.apply_event(_event("n1", "n3", 20.0, 20.0, 160.0, error="timed out after 10 s"))
    ok, why = state.pairs.passed_since("n1", 150.0, expect, profile)
    assert not ok and "failed" in why
    state.apply_event(_event("n1", "n4", 1.0, 20.0, 170.0))
    assert not state.pairs.passed_since("n1", 150.0, expect, profile)[0]
    state.apply_event(_event("n5", "n1", 20.0, 22.0, 180.0))
    ok, why = state.pairs.passed_since("n1", 150.0, expect, profile)
    assert ok and "with n5 passed" in why


def test_the_api_serves_the_matrix() -> None:
    async def get() -> tuple[int, Any]:
        hardware = HardwareConfig(profile="l40s")
        config = Config(coordinator=CoordinatorConfig(scheduler="slurm"), hardware=hardware)
        coordinator = build(config, bus=MemoryBus(MemoryBroker()), scheduler=None, ledger=Ledger(":memory:"))
        for event in (_event("n1", "n2", 9.0, 9.5, 1.0), _event("n3", "n4", 9.0, 1.0, 2.0)):
            coordinator.state.apply_event(event)
        client: TestClient[Any, Any] = TestClient(TestServer(Api(coordinator, ApiConfig()).app))
        await client.start_server()
        try:
            response = await client.get("/v1/fabric/pairs")
            return response.status, await response.json()
        finally:
            await client.close()

    status, body = asyncio.run(get())
    assert status == 200 and body["profile"] == "l40s" and body["expected_gbps"] == 10.0
    slow = [c for c in body["cells"] if c["status"] == "slow"]
    assert [(c["from"], c["to"]) for c in slow] == [("n4", "n3")]


def test_a_pingmesh_probe_is_judged_on_its_rtt_and_kept_apart_from_bandwidth() -> None:
    state = _state()
    expect, profile, _ = fleet_expectation(HardwareConfig(profile="h200-sxm"))
    for rtt, ts in ((0.3, 130.0), (5.0, 131.0)):
        probe = PairResult(a="n1" if rtt < 1 else "n3", b="n2", rtt_ms=rtt)
        assert probe.probe
        event = make_event(
            "n1", Kind.PAIR_TEST, severity=Severity.INFO, source="pair_tests", data=probe.as_dict()
        )
        state.apply_event(Event(**{**{f: getattr(event, f) for f in event.__struct_fields__}, "ts": ts}))
    matrix = state.pairs.matrix(expect, profile, now=140.0)
    probes = {(p["from"], p["to"]): p for p in matrix["probes"]}
    assert probes[("n1", "n2")]["status"] == "pass" and probes[("n3", "n2")]["status"] == "slow"
    assert state.pairs.pairs[("n1", "n2")].result.a_to_b_gbps == 20.0, (
        "a probe does not replace the bandwidth"
    )
    assert len(state.pairs.recent) == 3, "nor joins the baseline"
