"""Fabric judgement (issue #35), pure: counters as rates, thresholds as data, link parsers and judges,
the ethtool parser, the catalog's fabric section, the fabric rule and the hang verdict's congestion note,
and the condition a fatal fabric event opens in the agent's book."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.agent.conditions import ConditionBook
from ftd.agent.watchers.fabric.ethtool import parse_stats
from ftd.catalog.hardware_profiles import load_hardware_catalog
from ftd.events import Kind
from ftd.fabric.links import (
    PcieLink,
    PortRate,
    judge_pcie,
    judge_port,
    parse_ib_rate,
    parse_pcie_speed,
    parse_width,
)
from ftd.fabric.rates import HOUR_S, CounterHistory, Rate, saturated
from ftd.fabric.thresholds import CounterRule, judge, rules_from_section
from ftd.plugin import ActionKind
from ftd.rules import fabric, hang
from ftd.testing import evaluate_rule, make_event, view_with
from tests.properties import examples

# --- rates ------------------------------------------------------------------------------------------


def test_rates_over_the_window_and_between_polls() -> None:
    h = CounterHistory()
    assert h.add(0.0, 10) == Rate(10, 0, 0.0, 0.0, 0, 0.0, 0.0)
    r = h.add(30.0, 40)
    assert (r.delta, r.per_s, r.window_increase, r.per_hour) == (30, 1.0, 30, 30.0)  # not 3,600/h
    r = h.add(HOUR_S + 60.0, 40)  # an hour later, nothing new: the window forgets the burst
    assert (r.window_increase, r.per_hour) == (0, 0.0)


def test_a_long_span_is_averaged_per_hour() -> None:
    h = CounterHistory()
    h.add(0.0, 0)
    r = h.add(2 * HOUR_S, 500)  # the agent was down two hours
    assert (r.span_s, r.per_hour) == (2 * HOUR_S, 250.0)


def test_reset_and_clock_step_restart_the_history() -> None:
    h = CounterHistory()
    h.add(0.0, 100)
    r = h.add(30.0, 7)
    assert r.reset and r.delta == 0 and r.per_hour == 0.0
    assert h.add(60.0, 10).delta == 3
    assert h.add(10.0, 50).delta == 0  # the clock went back: a new baseline


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(min_value=0.001, max_value=4000.0), st.integers(min_value=-50, max_value=10**6)),
        max_size=60,
    )
)
def test_rates_are_never_negative_and_never_exceed_what_was_counted(steps: list[tuple[float, int]]) -> None:
    h = CounterHistory()
    ts, value, since_reset = 0.0, 0, 0
    h.add(ts, value)
    for dt, step in steps:
        ts += dt
        before, value = value, max(0, value + step)
        r = h.add(ts, value)
        assert r.reset == (value < before)  # a counter that went down, and only that, is a reset
        since_reset = 0 if r.reset else since_reset + r.delta
        assert r.delta >= 0 and r.per_s >= 0 and r.window_increase >= 0 and r.per_hour >= 0
        assert r.window_increase <= since_reset
        assert r.per_hour <= r.window_increase + 1e-9
    # and what it saves reads back the same
    again = CounterHistory.from_json(h.to_json())
    assert again.samples == h.samples


def _reference_per_hour(samples: list[tuple[float, int]], window: float) -> float:
    """per_hour from every sample since the last reset, kept: the newest one before the window's start
    is the anchor; the span is the window when the anchor's value held into it."""
    now, value = samples[-1]
    cut = now - window
    before = [i for i, (ts, _) in enumerate(samples) if ts < cut]
    i = before[-1] if before else 0
    anchor_ts, anchor_value = samples[i]
    span = now - anchor_ts
    if i + 1 < len(samples) and samples[i + 1][1] == anchor_value:
        span = min(span, window)
    increase = value - anchor_value
    return float(increase) if span <= window else increase * HOUR_S / span


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(min_value=1.0, max_value=1500.0), st.sampled_from([0, 0, 0, 1, 7, 130])),
        min_size=1,
        max_size=60,
    )
)
def test_a_quiet_counters_history_is_short_and_judges_as_if_every_sample_were_kept(
    steps: list[tuple[float, int]],
) -> None:
    h = CounterHistory()
    ts, value = 0.0, 0
    everything = [(ts, value)]
    h.add(ts, value)
    for dt, step in steps:
        ts, value = ts + dt, value + step
        everything.append((ts, value))
        r = h.add(ts, value)
        assert r.per_hour == pytest.approx(_reference_per_hour(everything, HOUR_S))
    distinct = len({v for _, v in everything})
    assert len(h.samples) <= 2 * distinct + 1  # runs of one value are two samples, whatever the polls


@settings(max_examples=examples(200), deadline=None)
@given(
    st.recursive(
        st.none() | st.integers() | st.floats() | st.text(max_size=5), lambda c: st.lists(c, max_size=4)
    )
)
def test_a_saved_history_of_any_shape_reads_without_raising(data: object) -> None:
    h = CounterHistory.from_json(data)
    assert all(v >= 0 for _, v in h.samples)


# --- thresholds -------------------------------------------------------------------------------------


def test_rules_from_the_packaged_catalog_and_an_operator_override(tmp_path: Path) -> None:
    rules, problems = rules_from_section(load_hardware_catalog().section("fabric", "h200-sxm") or {})
    assert problems == []
    assert rules["ib:symbol_error"] == CounterRule("ib", "symbol_error", "fatal", per_hour=120.0)
    assert rules["ib:link_downed"].any_increase and rules["phy:rx_pause_ctrl_phy"].klass == "congestion"
    override = tmp_path / "site.toml"
    override.write_text('[fabric.h200-sxm."ib:symbol_error"]\nclass = "warning"\nper_hour = 10\n')
    section = load_hardware_catalog(override).section("fabric", "h200-sxm") or {}
    rules, _ = rules_from_section(section)
    assert rules["ib:symbol_error"] == CounterRule("ib", "symbol_error", "warning", per_hour=10.0)
    assert load_hardware_catalog().section("fabric", "no-such-profile") is None  # skipped, not passed


@pytest.mark.parametrize(
    ("key", "body", "problem"),
    [
        ("ib:x", {"class": "deadly", "any_increase": True}, "class must be one of"),
        ("ib:x", {"class": "fatal"}, "needs any_increase, per_hour or per_s"),
        ("ib:x", {"class": "fatal", "per_hour": -1}, "per_hour must be a number >= 0"),
        ("ib:x", {"class": "fatal", "per_hour": True}, "per_hour must be a number >= 0"),
        ("ib:x", {"class": "fatal", "per_hour": 1, "perhour": 2}, "unknown keys perhour"),
        ("disk:x", {"class": "fatal", "per_hour": 1}, "not SOURCE:COUNTER"),
        ("ib:x", "fatal", "expected a table"),
    ],
)
def test_a_bad_rule_is_a_problem_not_a_rule(key: str, body: object, problem: str) -> None:
    rules, problems = rules_from_section({key: body, "ib_rate_gbps": 400})
    assert rules == {} and len(problems) == 1 and problem in problems[0]


def _rate(
    delta: int = 0, per_hour: float = 0.0, per_s: float = 0.0, window: int = 0, reset: bool = False
) -> Rate:
    return Rate(100, delta, 30.0, per_s, window, 60.0, per_hour, reset)


def test_judge_each_limit() -> None:
    any_rule = CounterRule("ib", "link_downed", "fatal", any_increase=True)
    assert judge(any_rule, _rate(delta=1, window=1)).why == "any increase"
    assert not judge(any_rule, _rate()).crossed
    assert not judge(any_rule, _rate(delta=5, window=5, reset=True)).crossed
    hourly = CounterRule("ib", "symbol_error", "fatal", per_hour=120)
    assert not judge(hourly, _rate(per_hour=120.0)).crossed  # "over" the limit, not at it
    assert judge(hourly, _rate(per_hour=121.0)).why == "per_hour"
    fast = CounterRule("phy", "rx_pause_ctrl_phy", "congestion", per_s=10000)
    assert judge(fast, _rate(per_s=10001.0)).why == "per_s"
    assert fast.describe() == "over 10000/s" and any_rule.describe() == "any increase"


# --- links ------------------------------------------------------------------------------------------


def test_link_parsers_on_the_kernels_words() -> None:
    assert parse_pcie_speed("16.0 GT/s PCIe") == 16.0 and parse_pcie_speed("2.5 GT/s") == 2.5
    assert parse_pcie_speed("Unknown") is None and parse_pcie_speed(None) is None
    assert (parse_width("16"), parse_width("x8"), parse_width("0"), parse_width("wide")) == (16, 8, 0, None)
    assert parse_ib_rate("400 Gb/sec (4X NDR)") == PortRate(400.0, "4X", "NDR")
    assert parse_ib_rate("100 Gb/sec (2X HDR)") == PortRate(100.0, "2X", "HDR")
    assert parse_ib_rate("25 Gb/sec") == PortRate(25.0, None, None)
    assert parse_ib_rate("junk") is None


def test_pcie_judge_says_what_and_how_much() -> None:
    v = judge_pcie(PcieLink(16.0, 32.0, 8, 16))
    assert (v.degraded, v.what, v.lanes_lost, v.gens_lost, v.bandwidth_pct) == (
        True,
        "width+speed",
        8,
        1,
        25.0,
    )
    assert judge_pcie(PcieLink(32.0, 32.0, 16, 16)).degraded is False
    down = judge_pcie(PcieLink(2.5, 32.0, 0, 16))
    assert (down.what, down.bandwidth_pct) == ("down", 0.0)
    unknown = judge_pcie(PcieLink(None, 32.0, 16, 16))
    assert unknown.unknown == "unreadable: current speed" and not unknown.degraded


@settings(max_examples=examples(300), deadline=None)
@given(
    st.sampled_from([None, 2.5, 5.0, 8.0, 16.0, 32.0, 64.0, 3.0]),
    st.sampled_from([None, 2.5, 5.0, 8.0, 16.0, 32.0, 64.0]),
    st.none() | st.integers(min_value=0, max_value=32),
    st.none() | st.integers(min_value=0, max_value=32),
)
def test_pcie_judge_never_raises_and_stays_in_bounds(
    cur: float | None, top: float | None, width: int | None, max_width: int | None
) -> None:
    v = judge_pcie(PcieLink(cur, top, width, max_width))
    assert 0.0 <= v.bandwidth_pct <= 100.0 and v.lanes_lost >= 0 and v.gens_lost >= 0
    assert not (v.degraded and v.unknown)


@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=80))
def test_text_parsers_never_raise(text: str) -> None:
    parse_pcie_speed(text)
    parse_width(text)
    parse_ib_rate(text)
    judge_port(parse_ib_rate(text), 400.0, "4X")


def test_port_judge_against_the_profile() -> None:
    assert judge_port(PortRate(400.0, "4X", "NDR"), 400.0, "4X").degraded is False
    assert judge_port(PortRate(400.0, "2X", "XDR"), 400.0, "4X").degraded is True  # narrow
    assert judge_port(PortRate(200.0, "4X", "HDR"), 400.0, "4X").pct == 50.0
    assert (
        judge_port(PortRate(200.0, "4X", "HDR"), None, None).unknown
        == "the hardware profile names no port rate"
    )


# --- ethtool -S -------------------------------------------------------------------------------------


def test_ethtool_stats_parser() -> None:
    text = (
        "NIC statistics:\n     rx_packets: 12\n     rx_pause_ctrl_phy: 7\n     ch0_arm: 1\n     junk line\n"
    )
    assert parse_stats(text) == {"rx_packets": 12, "rx_pause_ctrl_phy": 7, "ch0_arm": 1}


@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=200))
def test_ethtool_parser_never_raises_and_keeps_only_integers(text: str) -> None:
    assert all(isinstance(v, int) and v >= 0 for v in parse_stats(text).values())


# --- the rule, the hang note, the agent's condition -------------------------------------------------

_FATAL = {
    "check": "counter", "subject": "ib:mlx5_0/1:symbol_error", "status": "crossed", "source": "ib",
    "counter": "symbol_error", "class": "fatal", "device": "mlx5_0", "port": 1, "per_hour": 130.0,
    "per_s": 1.0, "threshold": "over 120/h", "profile": "h100-sxm",
}  # fmt: skip


def test_a_fatal_counter_excludes_and_drains_the_node() -> None:
    view = view_with(jobs={"j1": ["n1", "n2"]})
    event = make_event("n1", Kind.FABRIC, severity="critical", source="fabric", data=_FATAL)
    actions = evaluate_rule(fabric, event, view)
    assert [(a.kind, a.target) for a in actions] == [
        (ActionKind.CHECKPOINT_RESTART, "j1"),
        (ActionKind.DRAIN_NODE, "n1"),
    ]
    assert "symbol_error on mlx5_0 port 1 at 130.0/h" in actions[1].reason
    cleared = make_event(
        "n1", Kind.FABRIC, severity="info", source="fabric", data={**_FATAL, "status": "cleared"}
    )
    assert evaluate_rule(fabric, cleared, view) == []


def test_congestion_is_a_notify_and_a_hang_verdict_says_so() -> None:
    data = {
        **_FATAL,
        "class": "congestion",
        "counter": "rx_pause_ctrl_phy",
        "netdev": "enp90s0",
        "source": "phy",
    }
    storm = make_event("n2", Kind.FABRIC, severity="warning", source="fabric", data=data)
    view = view_with(jobs={"j1": ["n1", "n2"]}, history=[storm])
    (note,) = evaluate_rule(fabric, storm, view)
    assert note.kind == ActionKind.NOTIFY and "fabric congestion on n2" in note.reason
    verdict = make_event(
        "n1", Kind.HANG_VERDICT, severity="error", source="coordinator", ts=storm.ts + 60,
        data={"job": "j1", "verdict": "job_wide", "confident": True, "why": "every rank in allreduce"},
    )  # fmt: skip
    notify = [a for a in evaluate_rule(hang, verdict, view) if a.kind == ActionKind.NOTIFY]
    assert notify[0].params["fabric_congestion"] == ["n2: rx_pause_ctrl_phy on enp90s0"]
    assert "fabric congestion meanwhile" in notify[0].reason
    quiet = view_with(jobs={"j1": ["n1", "n2"]})
    notify = [a for a in evaluate_rule(hang, verdict, quiet) if a.kind == ActionKind.NOTIFY]
    assert "fabric_congestion" not in notify[0].params


def test_a_fatal_fabric_event_is_a_condition_of_its_own_subject_until_cleared(tmp_path: Path) -> None:
    book = ConditionBook(tmp_path / "c.json", boot="b")
    other = {**_FATAL, "subject": "ib:mlx5_1/1:symbol_error", "device": "mlx5_1"}
    book.observe(make_event("n1", Kind.FABRIC, severity="critical", source="fabric", data=_FATAL))
    book.observe(make_event("n1", Kind.FABRIC, severity="critical", source="fabric", data=other))
    assert [c.key for c in book.active()] == [
        "fabric:ib:mlx5_0/1:symbol_error",
        "fabric:ib:mlx5_1/1:symbol_error",
    ]
    book.observe(
        make_event("n1", Kind.FABRIC, severity="info", source="fabric", data={**_FATAL, "status": "cleared"})
    )
    assert [c.key for c in book.active()] == ["fabric:ib:mlx5_1/1:symbol_error"]


def test_saturation_of_the_narrow_ib_counters() -> None:
    assert saturated("ib", "symbol_error", 65535) and not saturated("ib", "symbol_error", 65534)
    assert saturated("ib", "local_link_integrity_errors", 15) and saturated("ib", "link_downed", 255)
    assert not saturated("ib", "port_xmit_wait", 2**32 - 1)  # not a narrow error counter
    assert not saturated("hw", "symbol_error", 65535)


def test_the_all_reduce_step_is_judged_for_the_pair_not_a_side() -> None:
    from ftd.fabric.pairs import PairExpectation, PairResult, fleet_allreduce_baseline, judge_pair

    def result(gbps: float | None, error: str = "") -> PairResult:
        return PairResult(
            a="n1", b="n2", a_to_b_gbps=9.0, b_to_a_gbps=9.0, rtt_ms=0.1, allreduce_gbps=gbps, error=error
        )

    assert fleet_allreduce_baseline([result(4.0), result(6.0)]) is None, "two results are not a fleet"
    assert (
        fleet_allreduce_baseline([result(4.0), result(6.0), result(8.0), result(1.0, "x"), result(None)])
        == 6.0
    )
    spec = PairExpectation(expected_gbps=10.0)
    unjudged = judge_pair(result(0.5), spec, None)
    assert unjudged.status == "pass" and "all-reduce 0.5 Gbit/s not judged" in " ".join(unjudged.reasons)
    slow = judge_pair(result(0.5), spec, None, allreduce_baseline_gbps=6.0)
    assert slow.status == "slow" and slow.slow_senders == ()
    assert "all-reduce 0.5 Gbit/s < 3 (0.5 x fleet all-reduce baseline 6 Gbit/s)" in slow.reasons[-1]
    assert judge_pair(result(4.0), spec, None, allreduce_baseline_gbps=6.0).status == "pass"
    with_key = PairExpectation(expected_gbps=10.0, expected_allreduce_gbps=20.0)
    assert judge_pair(result(4.0), with_key, None, allreduce_baseline_gbps=6.0).status == "slow"  # 16 > 3


def test_a_lossy_direction_names_its_sender_even_at_full_speed() -> None:
    from ftd.fabric.pairs import DEFAULT_MAX_RETRANS_PCT, PairExpectation, PairResult, judge_pair

    def result(up: float | None, down: float | None) -> PairResult:
        return PairResult(
            a="n1",
            b="n2",
            a_to_b_gbps=9.0,
            b_to_a_gbps=9.0,
            rtt_ms=0.1,
            a_to_b_retrans_pct=up,
            b_to_a_retrans_pct=down,
        )

    spec = PairExpectation(expected_gbps=10.0)
    assert judge_pair(result(0.0, 0.0), spec, None).status == "pass"
    assert judge_pair(result(None, None), spec, None).status == "pass", "unknown (no TCP_INFO): not judged"
    lossy = judge_pair(result(DEFAULT_MAX_RETRANS_PCT * 5, 0.2), spec, None)
    assert lossy.status == "slow" and lossy.slow_senders == ("n1",) and "(loss)" in lossy.reasons[-1]
    assert judge_pair(result(0.0, 3.0), spec, None).slow_senders == ("n2",)
    strict = PairExpectation(expected_gbps=10.0, max_retrans_pct=0.1)
    assert judge_pair(result(0.2, 0.0), strict, None).slow_senders == ("n1",)
    roundtrip = PairResult.from_dict(result(2.5, 0.0).as_dict())
    assert (roundtrip.a_to_b_retrans_pct, roundtrip.b_to_a_retrans_pct) == (2.5, 0.0)


def test_a_share_of_retransmissions_needs_enough_segments_to_mean_loss() -> None:
    from ftd.agent.pair_tests.wire import MIN_SEGMENTS, retrans_pct

    assert retrans_pct((0, 0), (1, 32)) is None, "one tail-loss probe among 32 segments is not 3% loss"
    assert retrans_pct((5, 100), (5, 100 + MIN_SEGMENTS)) == 0.0
    assert retrans_pct((5, 100), (105, 100 + MIN_SEGMENTS)) == 10.0
    assert retrans_pct(None, (1, 5000)) is None and retrans_pct((9, 0), (3, 5000)) == 0.0  # a reset
