"""``ftd bench preemption`` runs end to end on a real Slurm and judges its own figures (marker
``bench``: a run is about 40 s; ``make bench-tests`` runs it, CI's ``make test`` leaves it out --
tests/e2e/test_preemption_readme_loop.py checks the same path in CI)."""

from __future__ import annotations

import pytest

from ftd.bench.preemption import bench_preemption
from ftd.bench.targets import judge
from tests.realparts import require_binary

pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.bench]


def test_one_preemption_lands_its_save_and_resumes_from_it() -> None:
    require_binary("slurmctld", package="slurmctld")
    result = bench_preemption(runs=1)
    [run] = result["preempt"]["results"]
    assert run["ok"], run
    assert run["steps_lost"] == 0 and run["resumed_from"] == run["saved_step"] and run["verified"]
    assert 0 < run["save_acked_s"] < run["deadline"] - run["preempted_at"]
    verdict = judge("preemption", result)
    failed = [o.check.figure for o in verdict.missed()]
    assert failed == ["preempt.runs"], failed  # one run is not the twenty the target asks for
