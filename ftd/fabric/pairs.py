"""Pair-test results and their judgement: is each direction of a pair as fast as it should be?

What: :class:`PairResult` is one active test between two agents (throughput measured in each
direction separately, a small-message round trip, the bytes and time it used, or the error that
stopped it). :func:`expectation` reads a hardware profile's ``pair`` section
(``ftd/catalog/hardware/pair.toml``) into a :class:`PairExpectation`; :func:`judge_pair` compares a
result with it and with the fleet's own baseline (:func:`fleet_baseline`, the median of recent
results) and answers a :class:`PairVerdict`: ``pass``, ``slow`` (naming the senders whose direction
fell short), ``failed`` (the test did not complete: never a pass) or ``skipped`` (nothing to judge
against, with the reason).

Why directional: traffic control, a bad cable end or a NIC stuck at a lower rate slows one node's
egress; measuring each direction apart lets one test say *which* side is slow, which is what lets
:mod:`ftd.fabric.bisect` pin a degraded node among 16 in 8 tests. Why two references: the profile's
spec catches a fleet that is uniformly slow, the baseline catches the one pair slower than its peers
on a fabric that never reaches spec (or a node with no profile, judged against the baseline only
and saying so).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "PairExpectation",
    "PairResult",
    "PairVerdict",
    "Status",
    "expectation",
    "fleet_allreduce_baseline",
    "fleet_baseline",
    "fleet_rtt_baseline",
    "judge_pair",
    "rtt_limit",
]

Status = Literal["pass", "slow", "failed", "skipped"]

#: Fewer results than this and the fleet has no baseline yet (one odd pair is not a fleet).
MIN_BASELINE_SAMPLES = 3
#: Both directions of a pair below the floor, one this many times faster than the other: the faster
#: is held back by the slower side's egress (its TCP acknowledgements ride it), and is not counted.
#: Measured: a node shaped to 20 Mbit/s egress sent at 0.019 Gbit/s and received at 1.75 of a 9.2
#: median (92x apart); two nodes degraded alike stay within a few times of each other.
COLLATERAL_RATIO = 10.0
#: A direction whose sender retransmitted more than this share of its segments is lossy (a profile's
#: ``max_retrans_pct`` replaces it). On a link with a round trip of microseconds TCP recovers from
#: loss so fast that the throughput barely moves (measured: 30% random drop on a veth pair still
#: moved 14-25 Gbit/s); the retransmissions show it. A clean veth here retransmitted none.
DEFAULT_MAX_RETRANS_PCT = 1.0
#: A round trip above this many times the fleet's median round trip is slow (a profile's
#: ``rtt_baseline_factor`` replaces it). Measured on the namespace rig: clean probes 0.04-0.11 ms;
#: a node whose egress queue a bulk flow keeps full (tbf at 10 Mbit/s) 11-14 ms, 100x and more.
DEFAULT_RTT_BASELINE_FACTOR = 10.0
#: ... and above this many milliseconds: a round trip is the agent's Python on both ends, and on a
#: busy host a starved CPU adds about a millisecond that is scheduling, not the fabric. A fabric
#: whose every pair is slower than its spec is the profile's ``max_rtt_ms``'s to catch.
RTT_BASELINE_FLOOR_MS = 1.0


@dataclass(frozen=True)
class PairResult:
    """One pair test: ``a`` ran it against ``b``'s server; Gbit/s per direction, RTT in ms."""

    a: str
    b: str
    a_to_b_gbps: float | None = None
    b_to_a_gbps: float | None = None
    rtt_ms: float | None = None
    bytes_moved: int = 0
    duration_s: float = 0.0
    error: str = ""
    allreduce_gbps: float | None = None
    allreduce_skipped: str = ""
    #: the share (%) of each direction's segments the sender's kernel sent again (TCP_INFO): loss
    a_to_b_retrans_pct: float | None = None
    b_to_a_retrans_pct: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "a_to_b_gbps": self.a_to_b_gbps,
            "b_to_a_gbps": self.b_to_a_gbps,
            "rtt_ms": self.rtt_ms,
            "bytes_moved": self.bytes_moved,
            "duration_s": self.duration_s,
            "error": self.error,
            "allreduce_gbps": self.allreduce_gbps,
            "allreduce_skipped": self.allreduce_skipped,
            "a_to_b_retrans_pct": self.a_to_b_retrans_pct,
            "b_to_a_retrans_pct": self.b_to_a_retrans_pct,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PairResult:
        """The inverse of :meth:`as_dict`; a malformed value becomes ``None`` (unknown), never a crash."""

        def num(key: str) -> float | None:
            value = data.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                return None
            return float(value)

        def text(key: str) -> str:
            value = data.get(key, "")
            return value if isinstance(value, str) else ""

        moved = data.get("bytes_moved", 0)
        return cls(
            a=text("a"),
            b=text("b"),
            a_to_b_gbps=num("a_to_b_gbps"),
            b_to_a_gbps=num("b_to_a_gbps"),
            rtt_ms=num("rtt_ms"),
            bytes_moved=moved if isinstance(moved, int) and not isinstance(moved, bool) else 0,
            duration_s=num("duration_s") or 0.0,
            error=text("error"),
            allreduce_gbps=num("allreduce_gbps"),
            allreduce_skipped=text("allreduce_skipped"),
            a_to_b_retrans_pct=num("a_to_b_retrans_pct"),
            b_to_a_retrans_pct=num("b_to_a_retrans_pct"),
        )

    @property
    def probe(self) -> bool:
        """A pingmesh probe: completed, round trips only, no bulk data (judged on its RTT alone)."""
        return (
            not self.error
            and self.bytes_moved == 0
            and self.a_to_b_gbps is None
            and self.b_to_a_gbps is None
            and self.rtt_ms is not None
        )

    def directions(self) -> tuple[tuple[str, str, float | None], tuple[str, str, float | None]]:
        """``(sender, receiver, gbps)`` for each direction."""
        return (self.a, self.b, self.a_to_b_gbps), (self.b, self.a, self.b_to_a_gbps)

    def retransmits(self) -> tuple[tuple[str, str, float | None], tuple[str, str, float | None]]:
        """``(sender, receiver, % of segments retransmitted)`` for each direction."""
        return (self.a, self.b, self.a_to_b_retrans_pct), (self.b, self.a, self.b_to_a_retrans_pct)


@dataclass(frozen=True)
class PairExpectation:
    """What a profile expects of one direction of a pair test (``pair.toml``)."""

    expected_gbps: float | None
    fraction: float = 0.8
    baseline_fraction: float = 0.5
    max_rtt_ms: float | None = None
    expected_allreduce_gbps: float | None = None
    max_retrans_pct: float | None = None
    rtt_baseline_factor: float = DEFAULT_RTT_BASELINE_FACTOR


@dataclass(frozen=True)
class PairVerdict:
    status: Status
    slow_senders: tuple[str, ...] = ()
    reasons: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "slow_senders": list(self.slow_senders), "reasons": list(self.reasons)}


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _fraction(value: Any, default: float) -> float:
    number = _positive(value)
    return number if number is not None and number <= 1.0 else default


def expectation(section: Mapping[str, Any] | None) -> PairExpectation | None:
    """A profile's ``pair`` section as an expectation; ``None`` for an unknown profile (no section).

    A missing or malformed ``expected_gbps`` leaves only the baseline to judge against; a fraction
    outside (0, 1] falls back to its default rather than judging against nonsense.
    """
    if section is None:
        return None
    return PairExpectation(
        expected_gbps=_positive(section.get("expected_gbps")),
        fraction=_fraction(section.get("fraction"), 0.8),
        baseline_fraction=_fraction(section.get("baseline_fraction"), 0.5),
        max_rtt_ms=_positive(section.get("max_rtt_ms")),
        expected_allreduce_gbps=_positive(section.get("expected_allreduce_gbps")),
        max_retrans_pct=_positive(section.get("max_retrans_pct")),
        rtt_baseline_factor=_factor(section.get("rtt_baseline_factor")),
    )


def _factor(value: Any) -> float:
    number = _positive(value)
    return number if number is not None and number > 1.0 else DEFAULT_RTT_BASELINE_FACTOR


def fleet_baseline(results: Iterable[PairResult]) -> float | None:
    """The median directional throughput of completed results; ``None`` with too few to be a fleet."""
    values = [
        gbps
        for result in results
        if not result.error
        for _, _, gbps in result.directions()
        if gbps is not None and math.isfinite(gbps) and gbps > 0
    ]
    if len(values) < MIN_BASELINE_SAMPLES:
        return None
    return statistics.median(values)


def fleet_rtt_baseline(results: Iterable[PairResult]) -> float | None:
    """The median small-message round trip (ms) of completed results, pingmesh probes and pair
    tests alike (both time a few 8-byte pings before any bulk data); ``None`` with too few."""
    values = [
        rtt
        for r in results
        if not r.error and (rtt := r.rtt_ms) is not None and math.isfinite(rtt) and rtt > 0
    ]
    return statistics.median(values) if len(values) >= MIN_BASELINE_SAMPLES else None


def rtt_limit(expect: PairExpectation | None, baseline_ms: float | None) -> tuple[float, str] | None:
    """The round trip above which a pair is slow, and why: the lower of the profile's ``max_rtt_ms``
    and ``rtt_baseline_factor`` x the fleet's RTT baseline (at least :data:`RTT_BASELINE_FLOOR_MS`);
    ``None`` with neither (the RTT is shown, not judged)."""
    limits: list[tuple[float, str]] = []
    if expect is not None and expect.max_rtt_ms is not None:
        limits.append((expect.max_rtt_ms, f"max_rtt_ms {expect.max_rtt_ms:g}"))
    if baseline_ms is not None and math.isfinite(baseline_ms) and baseline_ms > 0:
        factor = expect.rtt_baseline_factor if expect is not None else DEFAULT_RTT_BASELINE_FACTOR
        limit = max(factor * baseline_ms, RTT_BASELINE_FLOOR_MS)
        limits.append(
            (
                limit,
                f"{factor:g} x fleet RTT baseline {baseline_ms:.3g} ms, at least {RTT_BASELINE_FLOOR_MS:g}",
            )
        )
    return min(limits) if limits else None


def fleet_allreduce_baseline(results: Iterable[PairResult]) -> float | None:
    """The median all-reduce bus bandwidth of completed results that ran the step; ``None`` with
    too few to be a fleet."""
    values = [
        gbps
        for r in results
        if not r.error and (gbps := r.allreduce_gbps) is not None and math.isfinite(gbps) and gbps > 0
    ]
    return statistics.median(values) if len(values) >= MIN_BASELINE_SAMPLES else None


def _allreduce_floor(
    expect: PairExpectation | None, baseline: float | None, fraction: float
) -> tuple[float, str] | None:
    floors: list[tuple[float, str]] = []
    if expect is not None and expect.expected_allreduce_gbps is not None:
        floors.append(
            (
                expect.expected_allreduce_gbps * expect.fraction,
                f"{expect.fraction:g} x spec {expect.expected_allreduce_gbps:g} Gbit/s",
            )
        )
    if baseline is not None and baseline > 0:
        why = f"{fraction:g} x fleet all-reduce baseline {baseline:.3g} Gbit/s"
        floors.append((baseline * fraction, why))
    return max(floors) if floors else None


def judge_pair(
    result: PairResult,
    expect: PairExpectation | None,
    baseline_gbps: float | None,
    *,
    profile: str | None = None,
    allreduce_baseline_gbps: float | None = None,
    rtt_baseline_ms: float | None = None,
) -> PairVerdict:
    """Each direction against the larger of ``fraction`` x spec and ``baseline_fraction`` x baseline.

    Both directions slow and one :data:`COLLATERAL_RATIO` times faster: only the slower names its
    sender (the faster is held back by the slower side's acknowledgements).

    ``expect`` is ``None`` for an unknown profile: the baseline alone judges, and the verdict says
    so; with neither a spec nor a baseline the check is ``skipped`` with its reason. A test that
    did not complete, or a direction that was not measured, is ``failed``: never a pass. A pingmesh
    probe (:attr:`PairResult.probe`) is judged on its RTT alone. The round trip, a probe's or a
    test's, is judged against :func:`rtt_limit` (the profile's ``max_rtt_ms`` and the fleet's RTT
    baseline ``rtt_baseline_ms``); a slow round trip names neither side (it crosses both).
    """
    if result.error:
        return PairVerdict("failed", reasons=(f"test did not complete: {result.error}",))
    round_trip = rtt_limit(expect, rtt_baseline_ms)
    if result.probe:
        if round_trip is not None and result.rtt_ms is not None and result.rtt_ms > round_trip[0]:
            why = f"probe: rtt {result.rtt_ms:.3g} ms > {round_trip[0]:.3g} ms ({round_trip[1]})"
            return PairVerdict("slow", reasons=(why,))
        if round_trip is None:
            return PairVerdict(
                "pass",
                reasons=(f"probe: rtt {result.rtt_ms:.3g} ms (not judged: no max_rtt_ms, no RTT baseline)",),
            )
        return PairVerdict(
            "pass",
            reasons=(f"probe: rtt {result.rtt_ms:.3g} ms <= {round_trip[0]:.3g} ms ({round_trip[1]})",),
        )
    reasons: list[str] = []
    floors: list[tuple[float, str]] = []
    if expect is None:
        reasons.append(
            f"no hardware profile ({profile or 'unknown'}): judged against the fleet baseline only"
        )
    elif expect.expected_gbps is None:
        reasons.append(
            f"profile {profile or '?'} names no expected_gbps: judged against the fleet baseline only"
        )
    else:
        floors.append(
            (
                expect.expected_gbps * expect.fraction,
                f"{expect.fraction:g} x spec {expect.expected_gbps:g} Gbit/s",
            )
        )
    fraction = expect.baseline_fraction if expect is not None else 0.5
    if baseline_gbps is not None and baseline_gbps > 0:
        floors.append((baseline_gbps * fraction, f"{fraction:g} x fleet baseline {baseline_gbps:.3g} Gbit/s"))
    if not floors:
        unjudged = "nothing to judge against: no expected bandwidth and no fleet baseline yet"
        if round_trip is not None and result.rtt_ms is not None and result.rtt_ms > round_trip[0]:
            # the bandwidth is unjudged, but the round trip alone says the pair is slow
            why_rtt = f"rtt {result.rtt_ms:.3g} ms > {round_trip[0]:.3g} ms ({round_trip[1]})"
            return PairVerdict("slow", reasons=(*reasons, why_rtt, unjudged))
        return PairVerdict("skipped", reasons=(*reasons, unjudged))
    floor, why = max(floors)
    measured: list[tuple[str, str, float]] = []
    for sender, receiver, gbps in result.directions():
        if gbps is None:
            return PairVerdict("failed", reasons=(*reasons, f"{sender} -> {receiver} not measured"))
        if gbps < floor:
            measured.append((sender, receiver, gbps))
            reasons.append(f"{sender} -> {receiver}: {gbps:.3g} Gbit/s < {floor:.3g} ({why})")
    if len(measured) == 2:
        (s1, r1, g1), (s2, r2, g2) = sorted(measured, key=lambda m: m[2])
        if g2 >= COLLATERAL_RATIO * g1:
            measured = [(s1, r1, g1)]
            reasons.append(
                f"{s2} -> {r2} is {g2 / max(g1, 1e-12):.0f}x faster than {s1} -> {r1}: taken as held back "
                f"by {s1}'s slow egress (its acknowledgements), not counted against {s2}"
            )
    slow = [sender for sender, _, _ in measured]
    lossy = DEFAULT_MAX_RETRANS_PCT
    if expect is not None and expect.max_retrans_pct is not None:
        lossy = expect.max_retrans_pct
    for sender, receiver, pct in result.retransmits():
        if pct is not None and pct > lossy:
            reasons.append(f"{sender} -> {receiver}: {pct:.3g}% of segments sent again > {lossy:g}% (loss)")
            if sender not in slow:
                slow.append(sender)
    rtt_slow = round_trip is not None and result.rtt_ms is not None and result.rtt_ms > round_trip[0]
    if rtt_slow and round_trip is not None:
        reasons.append(f"rtt {result.rtt_ms:.3g} ms > {round_trip[0]:.3g} ms ({round_trip[1]})")
    allreduce_slow = False
    if result.allreduce_gbps is not None:
        found = _allreduce_floor(expect, allreduce_baseline_gbps, fraction)
        if found is None:
            reasons.append(
                f"all-reduce {result.allreduce_gbps:.3g} Gbit/s not judged: no expected_allreduce_gbps "
                "and no fleet all-reduce baseline yet"
            )
        elif result.allreduce_gbps < found[0]:
            allreduce_slow = True  # the pair's collective: it names no one side
            reasons.append(f"all-reduce {result.allreduce_gbps:.3g} Gbit/s < {found[0]:.3g} ({found[1]})")
    if slow or rtt_slow or allreduce_slow:
        return PairVerdict("slow", tuple(slow), tuple(reasons))
    if round_trip is not None and result.rtt_ms is not None:  # judged: say against what
        reasons.append(f"rtt {result.rtt_ms:.3g} ms <= {round_trip[0]:.3g} ms ({round_trip[1]})")
    return PairVerdict("pass", (), (*reasons, f"both directions >= {floor:.3g} Gbit/s ({why})"))
