"""Real queueing delay on one node's link, between real agents in network namespaces: the node is found.

This kernel has no netem, so no fixed delay. Real delay it does give: one node's egress shaped by
``tc tbf rate 10mbit`` with a deep queue (``latency 300ms``) and a bulk TCP flow from that node held
on it (ftd/bench/netns_fleet.py ``bloat``, ftd/bench/bulk_flow.py): everything else the node sends
(a probe's pings, its answers to others' pings) waits behind the flow's bytes in the queue, a
congested link with a deep buffer. The kernel's TCP small-queues limit keeps one local flow's bytes
in the queue to about 12-16 KB, so the delay is not the queue's 300 ms but, measured here (2-core
host, a test suite running beside): probes touching the node 9.7-13.4 ms, clean probes 0.04-0.22 ms,
a pair test's round trip 13-23 ms.

The rig has no profile ``max_rtt_ms`` (veth has no spec), so the fleet's RTT baseline judges: the
median of the probes' round trips, x10, at least 1 ms. A bisection by probes (round trips only, a
slow one names neither side) must pin that node and no other; each node's own pingmesh must see
every probe to and from it slow; a clean fleet reports nobody. Needs root and iproute2 (skips with
the reason outside CI; fails under FTD_REQUIRE_REAL=1). Everything it creates is removed.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from ftd.bench.netns_fleet import RIG, NetnsFleet, available, hunt
from ftd.fabric.pairs import PairResult, fleet_rtt_baseline, judge_pair, rtt_limit

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))

MB = 1024 * 1024


@pytest.fixture(scope="module")
def fleet():  # type: ignore[no-untyped-def]
    with NetnsFleet(6, max_bytes=4 * MB, timeout_s=15.0) as made:
        yield made
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert made.tag not in left, "namespaces left behind"


@pytest.mark.parametrize("victim", ["node-03", "node-06"])
def test_the_node_whose_egress_queue_is_full_is_found_by_round_trips_and_no_other(
    fleet: NetnsFleet, victim: str
) -> None:
    fleet.bloat(victim, rate="10mbit", queue_ms=300)
    try:
        time.sleep(1.0)  # the flow fills the queue
        found = hunt(fleet, probe=True)
    finally:
        fleet.restore(victim)
    assert found.finding.bad_nodes == (victim,), (found.finding, found.verdicts)
    assert found.finding.confirmed and not found.finding.bad_links and not found.finding.untested
    assert all(r.probe for r in found.results), "round trips only: no bulk data moved"
    slow = [(r, v) for r, v in zip(found.results, found.verdicts, strict=True) if v["status"] == "slow"]
    assert len(slow) >= 2 and all(victim in (r.a, r.b) and not v["slow_senders"] for r, v in slow), slow
    # the delay is the queue's, not a hiccup: several milliseconds against a sub-millisecond fleet
    assert all(r.rtt_ms is not None and r.rtt_ms > 5.0 for r, _ in slow), slow


def test_each_nodes_pingmesh_sees_every_round_trip_through_the_full_queue_slow(fleet: NetnsFleet) -> None:
    victim = "node-04"
    fleet.bloat(victim, rate="10mbit", queue_ms=300)
    try:
        time.sleep(1.0)
        probes = [(node, p) for node in fleet.nodes for p in fleet.mesh(node, interval_s=0.2)]
        fleet.ask("node-01", fleet.test_request(victim))  # a pair test's round trip, before its bulk
        test = PairResult.from_dict(fleet.answer("node-01", 60.0))
    finally:
        fleet.restore(victim)
    assert all("rtt_ms" in p for _, p in probes), probes
    results = [PairResult(a=node, b=p["peer"], rtt_ms=p["rtt_ms"]) for node, p in probes]
    baseline = fleet_rtt_baseline(results)
    limit = rtt_limit(RIG, baseline)
    assert baseline is not None and limit is not None
    touching = [r for r in results if victim in (r.a, r.b)]
    others = [r for r in results if victim not in (r.a, r.b)]
    assert {(r.a, r.b) for r in results} == {(a, b) for a in fleet.nodes for b in fleet.nodes if a != b}
    verdicts = {(r.a, r.b): judge_pair(r, RIG, None, rtt_baseline_ms=baseline).status for r in results}
    seen = [(r.a, r.b, round(r.rtt_ms or -1, 3)) for r in results]
    assert all(verdicts[(r.a, r.b)] == "slow" for r in touching), (limit, seen)
    # A starved CPU slows a clean probe now and then on this busy 2-core host (2 of 20 above a
    # 1.8 ms limit once, with a browser test beside it); a bisection does not name a node for such
    # a probe unless it repeats. Most clean probes must pass: a limit that flags everything fails.
    assert sum(verdicts[(r.a, r.b)] == "slow" for r in others) <= 4, (limit, seen)
    assert not test.error and test.rtt_ms is not None and test.rtt_ms > limit[0], (test, limit)
    tested = judge_pair(test, RIG, None, rtt_baseline_ms=baseline)
    assert tested.status == "slow" and any(r.startswith(f"rtt {test.rtt_ms:.3g} ms") for r in tested.reasons)


def test_a_clean_fleet_reports_nobody_by_round_trips(fleet: NetnsFleet) -> None:
    for _ in range(3):
        found = hunt(fleet, probe=True)
        assert found.finding.clean and not found.finding.untested, (found.finding, found.verdicts)
