"""The fleet's pair-test results: the newest per pair, the baseline, the matrix, the gate's answer.

What: :class:`PairBook` folds the agents' ``pair_test`` events (:mod:`ftd.agent.pair_tests.service`)
into the newest :class:`~ftd.fabric.pairs.PairResult` per ordered pair (``a`` ran it against ``b``;
pingmesh probes, round trips only, apart in :attr:`PairBook.probes`)
and a bounded list of recent completed results, whose median is the fleet's baseline
(:func:`~ftd.fabric.pairs.fleet_baseline`), and one of recent round trips, probes' and tests' alike,
whose median is the fleet's RTT baseline (:func:`~ftd.fabric.pairs.fleet_rtt_baseline`: what judges
a round trip when the profile names no ``max_rtt_ms``, or a pair much slower than its peers).
:meth:`PairBook.matrix` answers the matrix the API and the dashboard show: one cell per pair and
direction, each with its throughput, RTT, age and verdict (:func:`~ftd.fabric.pairs.judge_pair`
against the profile's expectation and the baselines; no profile: baselines only, and the matrix says
so). :meth:`PairBook.passed_since` is what a return to
service asks: has this node's newest pair test, taken after ``since``, passed?

Why here: the coordinator is the only one that sees every pair; plain data rebuilt from the ledger's
recent events at start-up like the rest of :class:`~ftd.coordinator.model.state.ClusterState`.
Bounded: :data:`RECENT_KEPT` results for the baseline, :data:`PAIRS_KEPT` pairs.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftd.catalog.hardware_profiles import HardwareCatalogError, load_hardware_catalog
from ftd.config.schema import HardwareConfig
from ftd.events import Event, Kind
from ftd.fabric.pairs import (
    PairExpectation,
    PairResult,
    PairVerdict,
    expectation,
    fleet_allreduce_baseline,
    fleet_baseline,
    fleet_rtt_baseline,
    judge_pair,
    rtt_limit,
)

__all__ = ["PAIRS_KEPT", "RECENT_KEPT", "PairBook", "Tested", "fleet_expectation"]

RECENT_KEPT = 256
PAIRS_KEPT = 65_536


@dataclass(frozen=True)
class Tested:
    """One pair's newest result and when it was taken (the event's ``ts``)."""

    result: PairResult
    ts: float


class PairBook:
    def __init__(self) -> None:
        self.pairs: OrderedDict[tuple[str, str], Tested] = OrderedDict()
        self.probes: OrderedDict[tuple[str, str], Tested] = OrderedDict()  # pingmesh: RTT only
        self.recent: deque[PairResult] = deque(maxlen=RECENT_KEPT)
        #: completed probes and tests, for the RTT baseline (probes apart from ``recent``: they are
        #: frequent, and would push the bandwidth results the bandwidth baseline needs out of it)
        self.round_trips: deque[PairResult] = deque(maxlen=RECENT_KEPT)

    def note(self, event: Event) -> None:
        if event.kind != Kind.PAIR_TEST:
            return
        result = PairResult.from_dict(event.data)
        if not result.a or not result.b:
            return
        key = (result.a, result.b)
        if not result.error and result.rtt_ms is not None:
            self.round_trips.append(result)
        if result.probe:  # a pingmesh probe: its RTT, apart (it says nothing of bandwidth)
            self.probes.pop(key, None)
            self.probes[key] = Tested(result, event.ts)
            while len(self.probes) > PAIRS_KEPT:
                self.probes.popitem(last=False)
            return
        self.pairs.pop(key, None)
        self.pairs[key] = Tested(result, event.ts)
        while len(self.pairs) > PAIRS_KEPT:
            self.pairs.popitem(last=False)
        if not result.error:
            self.recent.append(result)

    def baseline(self) -> float | None:
        return fleet_baseline(self.recent)

    def allreduce_baseline(self) -> float | None:
        return fleet_allreduce_baseline(self.recent)

    def rtt_baseline(self) -> float | None:
        return fleet_rtt_baseline(self.round_trips)

    def judge(self, tested: Tested, expect: PairExpectation | None, profile: str | None) -> PairVerdict:
        return self.judge_result(tested.result, expect, profile)

    def judge_result(
        self, result: PairResult, expect: PairExpectation | None, profile: str | None
    ) -> PairVerdict:
        """``result`` against the profile and the fleet's baselines (directions, all-reduce, RTT)."""
        return judge_pair(
            result,
            expect,
            self.baseline(),
            profile=profile,
            allreduce_baseline_gbps=self.allreduce_baseline(),
            rtt_baseline_ms=self.rtt_baseline(),
        )

    def passed_since(
        self, node: str, since: float, expect: PairExpectation | None, profile: str | None
    ) -> tuple[bool, str]:
        """Whether ``node``'s newest pair test after ``since`` passed, and why (fails closed)."""
        newest = max(
            (t for (a, b), t in self.pairs.items() if node in (a, b) and t.ts >= since),
            key=lambda t: t.ts,
            default=None,
        )
        if newest is None:
            return False, f"no pair test of {node} since it was drained"
        verdict = self.judge(newest, expect, profile)
        peer = newest.result.b if newest.result.a == node else newest.result.a
        reasons = "; ".join(verdict.reasons)
        if verdict.status != "pass":
            return False, f"pair test with {peer} {verdict.status}: {reasons}"
        return True, f"pair test with {peer} passed: {reasons}"

    def trouble(self, node: str, peers: Collection[str] = ()) -> str | None:
        """Why ``node`` should not be trusted with a slot: its newest pair test (with one of ``peers``
        when any were tested with it, else with anyone) was slow or failed; ``None`` when it passed or
        was never tested. Judged against the fleet's baseline (the executor asking has no profile)."""
        mine = [(pair, t) for pair, t in self.pairs.items() if node in pair]
        with_peers = [(pair, t) for pair, t in mine if (set(pair) - {node}) & set(peers)]
        newest = max(with_peers or mine, key=lambda item: item[1].ts, default=None)
        if newest is None:
            return None
        (a, b), tested = newest
        verdict = self.judge(tested, None, None)
        if verdict.status in ("pass", "skipped"):
            return None
        if verdict.status == "slow" and verdict.slow_senders and node not in verdict.slow_senders:
            return None  # the other end was the slow one
        peer = b if a == node else a
        return f"pair test with {peer} {verdict.status}: {'; '.join(verdict.reasons[-1:])}"

    def matrix(self, expect: PairExpectation | None, profile: str | None, now: float) -> dict[str, Any]:
        """The dashboard's matrix: every node tested, and per pair direction its figures and verdict."""
        nodes = sorted({n for pair in self.pairs for n in pair})
        cells: list[dict[str, Any]] = []
        for tested in self.pairs.values():
            result = tested.result
            verdict = self.judge(tested, expect, profile)
            for sender, receiver, gbps in result.directions():
                cells.append(
                    {
                        "from": sender,
                        "to": receiver,
                        "gbps": gbps,
                        "rtt_ms": result.rtt_ms,
                        "age_s": round(max(0.0, now - tested.ts), 1),
                        "status": _direction_status(verdict, sender),
                        "error": result.error,
                        "reasons": list(verdict.reasons),
                    }
                )
        probes = [
            {
                "from": a,
                "to": b,
                "rtt_ms": tested.result.rtt_ms,
                "age_s": round(max(0.0, now - tested.ts), 1),
                "status": self.judge(tested, expect, profile).status,
            }
            for (a, b), tested in self.probes.items()
        ]
        baseline, rtt_baseline = self.baseline(), self.rtt_baseline()
        limit = rtt_limit(expect, rtt_baseline)
        return {
            "probes": probes,
            "profile": profile,
            "expected_gbps": expect.expected_gbps if expect is not None else None,
            "max_rtt_ms": expect.max_rtt_ms if expect is not None else None,
            "baseline_gbps": baseline,
            "rtt_baseline_ms": rtt_baseline,
            # what a round trip is judged against (the lower of max_rtt_ms and the baseline's limit)
            "rtt_limit_ms": limit[0] if limit is not None else None,
            "rtt_limit": limit[1] if limit is not None else "",
            "nodes": nodes,
            "cells": cells,
        }


def _direction_status(verdict: PairVerdict, sender: str) -> str:
    """A direction's own status: a pair slow only in the other direction passed in this one."""
    if verdict.status == "slow" and verdict.slow_senders:
        return "slow" if sender in verdict.slow_senders else "pass"
    return verdict.status


def fleet_expectation(hardware: HardwareConfig) -> tuple[PairExpectation | None, str | None, str]:
    """The fleet's pair expectation from ``hardware.profile`` (and the operator's catalog), the
    profile's name, and why there is none (no profile named, unknown, or a catalog that does not
    load): then pair tests are judged against the fleet's baseline only."""
    if not hardware.profile:
        return None, None, "hardware.profile not set: pair tests judged against the fleet baseline only"
    try:
        catalog = load_hardware_catalog(Path(hardware.catalog) if hardware.catalog else None)
    except HardwareCatalogError as exc:
        return None, hardware.profile, f"hardware catalog not loaded ({exc}): baseline only"
    expect = expectation(catalog.section("pair", hardware.profile))
    if expect is None:
        return None, hardware.profile, f"unknown hardware profile {hardware.profile}: baseline only"
    return expect, hardware.profile, ""
