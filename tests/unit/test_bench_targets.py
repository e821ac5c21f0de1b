"""Benches that judge (issue #31): the targets in one place, the verdict, and ``ftd bench --check``.

Pure: a bench's figures and its targets in, a verdict and an exit code out; the CLI is driven with
the bench function replaced by one returning given figures (the benches themselves run on real
parts, by hand: docs/architecture.md §10).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.bench import fairness
from ftd.bench.targets import TARGETS, Check, Figure, Targets, judge
from ftd.cli import main
from ftd.commands.bench import BENCHES
from ftd.events import Severity
from tests.properties import examples

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"

ONE = {"b": Targets("x <= 5", (Check("x", "<=", 5.0),))}


def test_a_met_target_passes_and_a_missed_one_fails() -> None:
    assert judge("b", {"x": 5.0}, ONE).met and judge("b", {"x": 5.0}, ONE).exit_code == 0
    missed = judge("b", {"x": 5.01}, ONE)
    assert not missed.met and missed.exit_code == 1
    assert [o.as_dict() for o in missed.missed()] == [{"check": "x <= 5.0", "value": 5.01, "met": False}]


@pytest.mark.parametrize("result", [{}, {"x": None}, {"x": "fast"}, {"x": float("nan")}, {"y": 1}])
def test_a_figure_not_measured_fails_closed(result: dict[str, Any]) -> None:
    verdict = judge("b", result, ONE)
    assert verdict.outcomes[0].met is None and not verdict.met and verdict.exit_code == 1
    assert "NOT MEASURED" in verdict.lines()[0] and verdict.lines()[-1].endswith("target missed")


def test_a_bench_with_no_checks_is_never_met() -> None:
    assert judge("b", {"x": 1}, {"b": Targets("nothing", ())}).exit_code == 1


def test_every_item_of_a_star_must_meet_and_none_is_not_measured() -> None:
    targets = {"r": Targets("t", (Check("rounds.*.a.first_s", "<=", 10.0),))}
    rounds = [{"a": {"first_s": 2.0}}, {"a": {"first_s": 9.9}}]
    assert judge("r", {"rounds": rounds}, targets).met
    late = judge("r", {"rounds": [*rounds, {"a": {"first_s": 10.5}}]}, targets)
    assert not late.met and late.outcomes[0].values == (2.0, 9.9, 10.5)
    assert judge("r", {"rounds": []}, targets).outcomes[0].met is None
    # a round whose path never came back (no figure) fails the whole check, unjudged
    assert judge("r", {"rounds": [*rounds, {"a": {}}]}, targets).outcomes[0].met is None


def test_a_limit_read_from_the_result() -> None:
    targets = {"f": Targets("t", (Check("takeover_s", "<=", Figure("ttl_s", 1.0)),))}
    assert judge("f", {"takeover_s": 6.0, "ttl_s": 5.0}, targets).met
    assert not judge("f", {"takeover_s": 6.1, "ttl_s": 5.0}, targets).met
    unknown = judge("f", {"takeover_s": 1.0}, targets).outcomes[0]
    assert unknown.met is None and unknown.note == "limit ttl_s not measured"


def test_bools_and_text_compare_exactly() -> None:
    targets = {"s": Targets("t", (Check("exact", "==", True), Check("path", "==", "spare")))}
    assert judge("s", {"exact": True, "path": "spare"}, targets).met
    assert not judge("s", {"exact": 1, "path": "spare"}, targets).met  # 1 is not True
    assert not judge("s", {"exact": True, "path": "requeue"}, targets).met
    with pytest.raises(ValueError):
        Check("path", "<=", "spare")
    with pytest.raises(ValueError):
        Check("x", "~", 1)


@given(
    value=st.floats(allow_nan=False, allow_infinity=False, width=32),
    limit=st.floats(allow_nan=False, allow_infinity=False, width=32),
    op=st.sampled_from(["<=", "<", ">=", "=="]),
)
@settings(max_examples=examples(100))
def test_the_verdict_is_the_comparison(value: float, limit: float, op: str) -> None:
    expected = {"<=": value <= limit, "<": value < limit, ">=": value >= limit, "==": value == limit}[op]
    verdict = judge("p", {"v": value}, {"p": Targets("t", (Check("v", op, limit),))})
    assert verdict.met is expected and verdict.exit_code == (0 if expected else 1)


def _table_targets() -> dict[str, str]:
    text = ARCHITECTURE.read_text()
    section = text[text.index("## 10. Performance targets") : text.index("## 11.")]
    rows = re.findall(r"^\| `([a-z0-9]+)` \| .* \| (.*) \|$", section, re.MULTILINE)
    return dict(rows)


def test_architecture_table_says_what_the_targets_module_checks() -> None:
    table = _table_targets()
    assert set(table) == set(BENCHES) == set(TARGETS)
    for name, target in TARGETS.items():
        assert table[name] == target.text, name
        assert target.checks, f"{name}: a target with nothing to check"


def _fake_bench(monkeypatch: pytest.MonkeyPatch, figures: dict[str, Any]) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def bench(**kwargs: Any) -> dict[str, Any]:
        calls.append(kwargs)
        return dict(figures)

    monkeypatch.setattr(fairness, "bench_fairness", bench)
    return calls


FAIR = {
    "other_samples_during_flood": 280,
    "other_p99_ms": 12.5,
    "other_sent": 330,
    "other_decided": 330,
    "flood_critical_decided": 1,
    "flood_critical_ms": [4.2],
}


def test_fairness_options_reach_the_bench_and_check_passes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _fake_bench(monkeypatch, FAIR)
    argv = ["bench", "fairness", "--rate", "10000", "--severity", "mix", "--probes", "250"]
    assert main([*argv, "--seconds", "20", "--check", "--json"]) == 0
    assert calls == [{"rate": 10000.0, "severity": "mix", "probes": 250, "seconds": 20.0}]
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["other_p99_ms"] == 12.5 and last["verdict"]["met"] is True
    assert last["verdict"]["target"] == TARGETS["fairness"].text
    assert len(last["verdict"]["checks"]) == len(TARGETS["fairness"].checks)


@pytest.mark.parametrize(
    ("change", "missed"),
    [
        ({"other_p99_ms": 100.1}, "other_p99_ms <= 100.0"),
        ({"other_samples_during_flood": 30}, "other_samples_during_flood >= 200"),
        ({"other_decided": 329}, "other_decided == other_sent"),
        ({"flood_critical_decided": 0, "flood_critical_ms": []}, "flood_critical_decided == 1"),
    ],
)
def test_check_exits_1_on_a_missed_target_and_says_which(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    change: dict[str, Any],
    missed: str,
) -> None:
    _fake_bench(monkeypatch, {**FAIR, **change})
    assert main(["bench", "fairness", "--check"]) == 1
    out = capsys.readouterr().out
    assert f"MISSED: {missed}" in out and "verdict: target missed" in out
    # without --check the bench measures and reports, and exits 0 as before
    assert main(["bench", "fairness"]) == 0


def test_a_bench_that_ran_without_a_judged_figure_fails_the_check(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_bench(monkeypatch, {k: v for k, v in FAIR.items() if k != "other_p99_ms"})
    assert main(["bench", "fairness", "--check", "--json"]) == 1
    verdict = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["verdict"]
    assert [c["check"] for c in verdict["checks"] if c["met"] is None] == ["other_p99_ms <= 100.0"]


def test_an_option_of_another_bench_is_refused() -> None:
    with pytest.raises(SystemExit, match="--rate not taken by this bench"):
        main(["bench", "e2e", "--rate", "100"])


@pytest.mark.parametrize(
    "argv",
    [["--rate", "0"], ["--seconds", "-1"], ["--severity", "debug"], ["--probes", "0"], ["--rate", "x"]],
)
def test_bad_fairness_options_are_refused_by_the_parser(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "fairness", *argv])
    assert exited.value.code == 2


def test_the_flood_severities() -> None:
    assert {fairness.flood_severity("info", i) for i in range(6)} == {Severity.INFO}
    assert {fairness.flood_severity("error", i) for i in range(6)} == {Severity.ERROR}
    assert [fairness.flood_severity("mix", i) for i in range(4)] == [
        Severity.INFO,
        Severity.WARNING,
        Severity.ERROR,
        Severity.INFO,
    ]
    with pytest.raises(ValueError, match="severity"):
        fairness.bench_fairness(severity="debug")
    with pytest.raises(ValueError, match="positive"):
        fairness.bench_fairness(probes=0)


def test_recovery_paths_option_reaches_the_bench_and_unknown_paths_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ftd.bench import recovery

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(recovery, "bench_recovery", lambda **kw: calls.append(kw) or {})
    # nothing measured: the check fails closed
    assert main(["bench", "recovery", "--samples", "1", "--paths", "rank_killed,torchrun", "--check"]) == 1
    assert calls == [{"samples": 1, "paths": ["rank_killed", "torchrun"]}]
    monkeypatch.undo()
    with pytest.raises(ValueError, match="unknown recovery paths warp"):
        recovery.bench_recovery(paths=["warp"])


def test_the_ft_launcher_peer_is_skipped_not_run_when_its_package_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ftd.bench import recovery

    monkeypatch.setattr(recovery.importlib.util, "find_spec", lambda name: None)
    spec, fault = recovery.PATHS["ft_launcher"]
    got = recovery._path(None, Path("/nonexistent"), spec, fault)  # type: ignore[arg-type]  # never reached
    assert got == {
        "error": "not measured: nvidia_resiliency_ext (nvidia-resiliency-ext) cannot be imported here"
    }
