"""The burn-in's pure judgement: throughput against profile, fleet and the node's own GPUs; verdicts."""

from __future__ import annotations

from ftd.platform.burn_in import BurnInReport, StepResult, judge_throughput


def test_one_slow_gpu_among_eight_fails_even_without_a_profile_figure() -> None:
    tflops = {str(i): 640.0 for i in range(8)} | {"5": 480.0}
    result = judge_throughput(tflops, expected=None, min_fraction=0.8, fleet=None, fleet_min_fraction=0.85)
    assert result.status == "fail" and result.reason.startswith(
        "GPU 5 480.0 TFLOPS < 85% of this node's median"
    )
    even = judge_throughput(
        {"0": 640.0, "1": 630.0}, expected=None, min_fraction=0.8, fleet_min_fraction=0.85
    )
    assert even.status == "pass" and "no profile or fleet figure" in even.reason


def test_no_figure_at_all_fails() -> None:
    assert judge_throughput({}, expected=600.0, min_fraction=0.8).status == "fail"


def test_verdicts_fail_closed() -> None:
    report = BurnInReport(node="n", started=0.0)
    assert report.verdict == "incomplete" and not report.ok  # no step ran
    report.steps = [StepResult("dcgm", "pass", "ok"), StepResult("pair", "skip", "no partner")]
    assert report.verdict == "incomplete" and report.reason == "not every step ran (pair: no partner)"
    report.steps.append(StepResult("matmul", "fail", "GPU 1 slow"))
    assert report.verdict == "failed" and report.reason == "matmul: GPU 1 slow"
    report.refused = "the node runs job(s) j"
    assert report.verdict == "refused" and report.to_dict()["ok"] is False
    passed = BurnInReport(node="n", started=0.0, steps=[StepResult("dcgm", "pass", "ok")])
    assert passed.ok and "dcgm" in passed.text()
