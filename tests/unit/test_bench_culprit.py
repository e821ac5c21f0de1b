"""``ftd bench culprit``'s pure parts (the bench itself runs on real parts in
tests/e2e/test_bench_culprit.py): what counts as right per case, the per-case counts the targets judge,
its options, the target check on a result, and the trainer's fault file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ftd.bench import culprit
from ftd.bench.culprit import _right, summarize
from ftd.bench.recovery_trainer import injected_fault
from ftd.bench.targets import judge
from ftd.cli import main


def _out(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"verdict": None, "exclusions": 0, "excluded_nodes": [], "swaps": 0}
    return {**base, **kw}


CULPRIT = {"verdict": "culprit", "confident": True, "culprit_nodes": ["node-2"], "culprit_ranks": [1]}


def test_one_culprit_is_right_only_when_named_confidently_and_alone_excluded() -> None:
    assert _right("stopped", _out(verdict=CULPRIT, exclusions=1, excluded_nodes=["node-2"]), "node-2")
    assert not _right("stopped", _out(verdict=CULPRIT, exclusions=1, excluded_nodes=["node-2"]), "node-3")
    assert not _right(
        "stuck", _out(verdict={**CULPRIT, "confident": False}, excluded_nodes=["node-2"]), "node-2"
    )
    both = _out(verdict=CULPRIT, exclusions=2, excluded_nodes=["node-2", "node-3"])
    assert not _right("stuck", both, "node-2")
    assert not _right("stopped", _out(verdict=CULPRIT), "node-2")  # named, but nothing excluded
    assert not _right("stopped", _out(), "node-2")  # no verdict at all


def test_job_wide_and_clean_are_right_only_without_exclusions() -> None:
    wide = {"verdict": "job_wide", "confident": True, "culprit_nodes": []}
    assert _right("job_wide", _out(verdict=wide), "node-1")
    assert not _right("job_wide", _out(verdict=wide, exclusions=1, excluded_nodes=["node-1"]), "node-1")
    assert not _right("job_wide", _out(verdict=CULPRIT), "node-1")
    assert not _right("job_wide", _out(), "node-1")  # no verdict came: not right
    assert _right("clean", _out(), "node-1")
    assert not _right("clean", _out(swaps=1), "node-1")
    assert not _right("slowed_all", _out(rank_slow={"node": "node-1"}), "node-1")
    assert _right("slowed_all", _out(rank_slow={"node": None}), "node-1")


def test_a_slowed_rank_is_right_when_rank_slow_names_its_node() -> None:
    assert _right("slowed", _out(rank_slow={"node": "node-3"}), "node-3")
    assert _right("slowed", _out(rank_slow={"node": "node-3"}, excluded_nodes=["node-3"]), "node-3")
    assert not _right("slowed", _out(rank_slow={"node": "node-1"}), "node-3")
    assert not _right("slowed", _out(), "node-3")
    assert _right("throttled", _out(rank_slow={"node": "node-3"}), "node-3")
    assert not _right("throttled", _out(rank_slow={"node": None}), "node-3")  # the job, not its node


def test_summary_counts_and_worst_figures() -> None:
    runs = [
        {"right": True, "detect_s": 5.1, "verdict_s": 1.4, "exclusions": 1, "swaps": 1, "steps_lost": 8},
        {"right": False, "detect_s": None, "verdict_s": None, "exclusions": 0, "swaps": 0, "error": "x"},
    ]
    got = summarize(runs)
    assert got == {
        "runs": 2,
        "right": 1,
        "wrong": 1,
        "detect_s_max": 5.1,
        "verdict_s_max": 1.4,
        "exclusions_max": 1,
        "swaps_max": 1,
        "steps_lost_max": 8,
        "alarms_max": None,
        "errors": 1,
    }
    assert summarize([])["verdict_s_max"] is None


def test_options_reach_the_bench_and_unknown_cases_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(culprit, "bench_culprit", lambda **kw: calls.append(kw) or {})
    assert (
        main(["bench", "culprit", "--runs", "2", "--cases", "stopped,clean", "--seed", "7", "--check"]) == 1
    )
    assert calls == [{"runs": 2, "cases": ["stopped", "clean"], "seed": 7}]
    monkeypatch.undo()
    with pytest.raises(ValueError, match="unknown culprit cases warp"):
        culprit.bench_culprit(cases=["warp"])
    with pytest.raises(SystemExit):
        main(["bench", "culprit", "--paths", "requeue"])  # another bench's option


def _case(runs: int, right: int, **figures: Any) -> dict[str, Any]:
    return {"runs": runs, "right": right, "wrong": runs - right, **figures}


def test_the_targets_judge_a_result() -> None:
    hang = {"verdict_s_max": 3.0, "exclusions_max": 1, "swaps_max": 1, "detect_s_max": 5.2}
    none = {"exclusions_max": 0, "swaps_max": 0}
    result = {
        "cases": {
            "stopped": _case(10, 10, **hang),
            "stuck": _case(10, 10, **hang),
            "job_wide": _case(10, 10, **none),
            "clean": _case(10, 10, **none),
            "slowed": _case(20, 19, detect_s_max=41.0, **none),
            "throttled": _case(20, 20, detect_s_max=30.0, **none),
            "slowed_all": _case(10, 10, **none),
            "clean_long": _case(1, 1, alarms_max=0, **none),
        },
        "e2e_during_collection": {"p99_ratio": 1.04},
    }
    assert judge("culprit", result).met
    result["cases"]["clean_long"] = _case(1, 0, alarms_max=1, **none)  # one rank_slow in ten clean minutes
    assert [str(o.check) for o in judge("culprit", result).missed()] == [
        "cases.clean_long.wrong == 0",
        "cases.clean_long.alarms_max == 0",
    ]
    result["cases"]["clean_long"] = _case(1, 1, alarms_max=0, **none)
    result["cases"]["stuck"] = _case(10, 9, **hang)
    assert [str(o.check) for o in judge("culprit", result).missed()] == ["cases.stuck.wrong == 0"]
    result["cases"]["stuck"] = _case(10, 10, **hang)
    result["cases"]["throttled"] = _case(20, 18, detect_s_max=30.0, **none)
    assert [str(o.check) for o in judge("culprit", result).missed()] == ["cases.throttled.right >= 19"]
    del result["cases"]["throttled"]
    assert not judge("culprit", result).met  # a case not run fails closed
    result["cases"]["throttled"] = _case(20, 20, detect_s_max=30.0, **none)
    del result["e2e_during_collection"]
    assert not judge("culprit", result).met  # not measured fails closed


def test_the_trainer_reads_its_fault_file_once(tmp_path: Path) -> None:
    import os

    lines: list[tuple[str, dict[str, Any]]] = []

    def record(what: str, **fields: Any) -> None:
        lines.append((what, fields))

    seen: dict[str, Any] = {}
    assert injected_fault(str(tmp_path), record, seen) == 0.0  # type: ignore[arg-type]
    (tmp_path / f"{os.getpid()}.json").write_text("{not json")
    assert injected_fault(str(tmp_path), record, seen) == 0.0  # type: ignore[arg-type]
    (tmp_path / f"{os.getpid()}.json").write_text(json.dumps({"fault": "slow", "sleep_s": 0.25}))
    assert injected_fault(str(tmp_path), record, seen) == 0.25  # type: ignore[arg-type]
    assert injected_fault(str(tmp_path), record, seen) == 0.25  # type: ignore[arg-type]
    assert lines == [("fault", {"fault": "slow", "sleep_s": 0.25})]


def test_the_e2e_during_collection_splits_the_cores_as_two_hosts_would(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from ftd.bench import e2e

    monkeypatch.setattr(e2e.os, "sched_getaffinity", lambda _pid: {0, 1})
    assert e2e._cores(True) == ({0}, {1})
    assert e2e._cores(False) is None
    monkeypatch.setattr(e2e.os, "sched_getaffinity", lambda _pid: {3, 5, 6, 7})
    assert e2e._cores(True) == ({3, 5}, {6, 7})
    monkeypatch.setattr(e2e.os, "sched_getaffinity", lambda _pid: {0})
    assert e2e._cores(True) is None  # one core: nothing to split, nothing pinned
