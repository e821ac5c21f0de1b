"""Burn-in orchestration with real processes (issue #36 items 4 and 6).

The GPU steps' probe and ``dcgmi`` are real child processes: scripts this test writes that answer
in the real probe's JSON (a slow GPU, a hung probe, a DCGM failure), and the real probe itself, which
runs on a GPU where there is one and is skipped with its reason where there is none.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

from ftd.agent.preflight.burn_in import BurnInPlan, plan_for, run_burn_in, save_report
from ftd.catalog.hardware_profiles import load_hardware_catalog
from ftd.config.schema import AgentConfig, HardwareConfig
from ftd.platform.burn_in import StepResult


def _probe(tmp: Path, matmul: dict[str, float], *, sleep_s: float = 0.0) -> tuple[str, ...]:
    """A probe script answering like ftd.agent.preflight.gpu_probe; it leaves a mark when run."""
    script = tmp / "probe.py"
    script.write_text(
        "import json, sys, time, pathlib\n"
        f"pathlib.Path({str(tmp / 'ran')!r}).touch()\n"
        f"time.sleep({sleep_s})\n"
        "if sys.argv[1] == 'memtest':\n"
        "    print(json.dumps({'gpus': {'0': 70.1, '1': 70.1}, 'errors': {}}))\n"
        "else:\n"
        f"    names = {{'0': 'NVIDIA H100 80GB HBM3'}}\n"
        f"    print(json.dumps({{'gpus': {matmul!r}, 'errors': {{}}, 'names': names}}))\n"
    )
    return (sys.executable, str(script))


def _dcgmi(tmp: Path, code: int) -> str:
    script = tmp / "dcgmi"
    script.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        "assert sys.argv[1:4] == ['diag', '-r', '3'], sys.argv\n"
        f"print(json.dumps({{'exit': {code}}}))\n"
        f"print('Memory bandwidth: Fail' if {code} else '', file=sys.stderr)\n"
        f"sys.exit({code})\n"
    )
    script.chmod(0o755)
    return str(script)


async def _pair_ok() -> StepResult:
    return StepResult("pair", "pass", "all-reduce with node-2 at 380 Gb/s")


def _h100_plan(tmp: Path, matmul: dict[str, float], **kw: object) -> BurnInPlan:
    plan = plan_for(
        AgentConfig(), HardwareConfig(), "h100-sxm", probe=_probe(tmp, matmul), dcgmi=_dcgmi(tmp, 0)
    )
    return BurnInPlan(**{**plan.__dict__, **kw})


def test_a_slow_gpu_fails_the_burn_in_against_its_profile(tmp_path: Path) -> None:
    plan = _h100_plan(tmp_path, {"0": 640.0, "1": 110.0})
    assert plan.expected_tflops == load_hardware_catalog().section("burn_in", "h100-sxm")["matmul_tflops"]  # type: ignore[index]
    report = asyncio.run(run_burn_in("node-1", plan, training=list, pair_test=_pair_ok, profile="h100-sxm"))
    assert report.verdict == "failed"
    assert report.reason.startswith("matmul: GPU 1 110.0 TFLOPS < 80% of the profile's 600")
    assert [s.status for s in report.steps] == ["pass", "pass", "fail", "pass"]
    saved = save_report(report, tmp_path / "burn-in")
    assert json.loads(saved.read_text())["verdict"] == "failed"
    assert "matmul" in (tmp_path / "burn-in" / "latest.txt").read_text()


def test_a_gpu_slow_against_the_fleet_fails_and_a_healthy_node_passes(tmp_path: Path) -> None:
    fleet = _h100_plan(tmp_path, {"0": 610.0, "1": 615.0}, fleet_tflops=760.0)
    slow = asyncio.run(run_burn_in("n", fleet, training=list, pair_test=_pair_ok))
    assert slow.verdict == "failed" and "of the fleet's 760" in slow.reason
    good = asyncio.run(
        run_burn_in("n", _h100_plan(tmp_path, {"0": 650.0, "1": 655.0}), training=list, pair_test=_pair_ok)
    )
    assert good.verdict == "passed" and good.ok, good.reason


def test_a_skipped_step_leaves_it_incomplete_and_dcgm_failure_fails(tmp_path: Path) -> None:
    plan = _h100_plan(tmp_path, {"0": 650.0})
    no_pair = asyncio.run(run_burn_in("n", plan, training=list))
    assert no_pair.verdict == "incomplete" and "pair: no pair test wired" in no_pair.reason
    no_dcgm = asyncio.run(
        run_burn_in("n", BurnInPlan(**{**plan.__dict__, "dcgmi": None}), training=list, pair_test=_pair_ok)
    )
    assert no_dcgm.verdict == "incomplete" and "dcgmi is not on PATH" in no_dcgm.reason
    bad = BurnInPlan(**{**plan.__dict__, "dcgmi": _dcgmi(tmp_path, 1)})
    failed = asyncio.run(run_burn_in("n", bad, training=list, pair_test=_pair_ok))
    assert (
        failed.verdict == "failed"
        and failed.reason == "dcgm: dcgmi diag -r 3 exited 1: Memory bandwidth: Fail"
    )


def test_never_on_a_training_node(tmp_path: Path) -> None:
    plan = _h100_plan(tmp_path, {"0": 650.0})
    report = asyncio.run(run_burn_in("n", plan, training=lambda: ["job-9"], pair_test=_pair_ok))
    assert report.verdict == "refused" and report.steps == []
    assert "job-9" in report.reason
    assert not (tmp_path / "ran").exists()  # no step's process started
    # A job that starts during the burn-in stops it before the next step.
    answers = iter([[], [], ["job-10"]])
    stopped = asyncio.run(run_burn_in("n", plan, training=lambda: next(answers), pair_test=_pair_ok))
    assert stopped.verdict == "refused" and [s.name for s in stopped.steps] == ["dcgm", "memtest"]
    assert "before step matmul" in stopped.reason


def test_a_hung_probe_is_killed_at_its_deadline_and_fails(tmp_path: Path) -> None:
    plan = _h100_plan(
        tmp_path, {"0": 650.0}, memtest_timeout_s=1.0, skip=frozenset({"matmul", "dcgm", "pair"})
    )
    plan = BurnInPlan(**{**plan.__dict__, "probe": _probe(tmp_path, {"0": 650.0}, sleep_s=60)})
    started = time.monotonic()
    report = asyncio.run(run_burn_in("n", plan, training=list))
    assert time.monotonic() - started < 20
    assert report.verdict == "failed" and report.reason == "memtest: the GPU probe ran past 1 s (a hung GPU?)"


def test_the_real_probe_runs_on_a_gpu_or_says_why_not(tmp_path: Path) -> None:
    """The real gpu_probe: on a GPU node memtest and matmul run and pass; elsewhere both are skipped
    with the reason (torch missing or no CUDA GPU), and the burn-in is incomplete, never passed."""
    plan = plan_for(
        AgentConfig(),
        HardwareConfig(),
        None,
        skip=frozenset({"dcgm", "pair"}),
        matmul_seconds=2.0,
        memtest_fraction=0.5,
    )
    report = asyncio.run(run_burn_in("n", plan, training=list))
    by_name = {s.name: s for s in report.steps}
    try:
        import torch

        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    if gpu:
        assert by_name["memtest"].status == "pass", by_name["memtest"].reason
        assert by_name["matmul"].status == "pass", by_name["matmul"].reason
        assert min(by_name["matmul"].figures["tflops"].values()) > 1.0
    else:
        for step in ("memtest", "matmul"):
            assert by_name[step].status == "skip"
            assert by_name[step].reason in ("torch is not installed", "torch sees no CUDA GPU")
        assert report.verdict == "incomplete"


@pytest.mark.parametrize("verdict", ["passed", "failed", "incomplete", "refused"])
def test_the_cli_exit_codes_cover_every_verdict(verdict: str) -> None:
    from ftd.commands.preflight import BURN_IN_EXIT

    assert verdict in BURN_IN_EXIT


def test_the_cli_refuses_on_a_node_with_a_job_and_reports_otherwise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ftd.agent.jobs import JobStartMsg, SchedulerJobs
    from ftd.cli import main

    conf = tmp_path / "agent.toml"
    conf.write_text(f'[agent]\nnode = "node-5"\nstate_dir = "{tmp_path}"\n[agent.nvml]\nenabled = false\n')
    skip_all = [arg for step in ("dcgm", "memtest", "matmul", "pair") for arg in ("--skip", step)]
    assert main(["preflight", "--burn-in", "--config", str(conf), *skip_all]) == 3  # nothing ran: incomplete
    out = capsys.readouterr().out
    assert out.startswith("burn-in on node-5 (profile none): incomplete: not every step ran (dcgm: left out")
    assert (tmp_path / "burn-in" / "latest.json").exists()
    SchedulerJobs(tmp_path / "jobs.json").start(JobStartMsg(job="4711"))  # the Prolog's record of a job here
    assert main(["preflight", "--burn-in", "--json", "--config", str(conf), *skip_all]) == 4
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "refused" and "4711" in report["reason"] and report["steps"] == []
    assert (
        main(["preflight", "--burn-in", "--config", str(conf), "--skip", "nccl"]) == 2
    )  # not a burn-in step
