"""``ftd bench checkpoint``: its options reach it, a case it does not know is refused, a run of the
blocked case on a tiny state measures every figure (real torch, real files), and --check fails
closed when the judged sizes were not measured."""

from __future__ import annotations

import json

import pytest

from ftd.cli import main

pytest.importorskip("torch")


def test_a_tiny_blocked_run_measures_and_the_check_fails_closed(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "checkpoint", "--cases", "blocked", "--sizes", "1,2", "--samples", "1", "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["sizes_mb"] == [1, 2] and set(result) >= {"blocked", "verdict"} and "partner" not in result
    for size in ("1MB", "2MB"):
        figures = result["blocked"][size]
        assert figures["errors"] == []
        for key in ("sync_save_s", "blocked_s", "blocked_first_s", "ratio", "local_s", "flush_s"):
            assert isinstance(figures[key], float) and figures[key] >= 0, key
        overlap = figures["overlap"]  # the overlapped snapshot in a loop of real SGD steps
        assert overlap["errors"] == []
        for key in ("blocked_s", "save_s", "step_wait_s", "copy_s", "step_s", "step_s_during_write", "ratio"):
            assert isinstance(overlap[key], int | float) and overlap[key] >= 0, key
    # the judged sizes (100 MB, 1 GB) were not measured: --check fails, it never passes by default
    assert main([*argv, "--check"]) == 1
    verdict = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["verdict"]
    assert {c["met"] for c in verdict["checks"]} == {None}


def test_unknown_cases_and_bad_sizes_are_refused() -> None:
    from ftd.bench.checkpoint import bench_checkpoint

    with pytest.raises(SystemExit, match="unknown case"):
        bench_checkpoint(cases=["warp"])
    with pytest.raises(SystemExit) as exited:
        main(["bench", "checkpoint", "--sizes", "0"])
    assert exited.value.code == 2
    with pytest.raises(SystemExit, match="--cases not taken by this bench"):
        main(["bench", "e2e", "--cases", "blocked"])
