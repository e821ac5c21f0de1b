"""The goodput simulator's in-allocation path (issue #24): a job under ``ftd run`` with hot spares.

An ftd restart costs the in-allocation model's time (:mod:`ftd.sim.goodput.inalloc`, the ``ftd bench
recovery`` figures) exactly when the restart is in place or a hot spare is left; with none left the
scheduler requeues the job as before. Hot spares deplete one per node-excluding restart and come back
with a requeue's new allocation, and, when the scenario says so, when a node the job left returns
(``spares_return``) or at ``spare_replenish_s``. Exact counts on fixed traces; the same seed gives
the same report; the ``ftd-spares`` scenario keeps ``meta``'s no-ftd figure and changes only ftd's.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftd.cli import main
from ftd.sim.goodput.faults import Fault, load_mix
from ftd.sim.goodput.inalloc import BENCH_COSTS, RestartCosts, in_allocation_s
from ftd.sim.goodput.model import Params, from_scenario, simulate
from ftd.sim.goodput.runner import trace_for
from tests.properties import examples
from tests.unit.test_goodput import SMALL, SMALL_PARAMS, accounted, as_trace, faults_st, run

# the job under ftd run with two hot spares, and no other free node in the cluster
SPARES = SMALL_PARAMS.replace(in_allocation=True, alloc_spares=2, spare_nodes=2)
REQUEUE_S = SMALL_PARAMS.restart_s + SMALL_PARAMS.load_s  # 150 s
REPAIR_S = 2 * 3600.0 + SMALL_PARAMS.preflight_s  # the gpu category's repair, then preflight


def cost(params: Params) -> float:
    """The in-allocation restart of ``params``' job with the bench's costs."""
    return in_allocation_s(params.load_s, warm=params.warm_spares)


def gpu_faults(*at: tuple[float, int]) -> list[Fault]:
    """GPU-fallen-off-the-bus crashes (Xid 79: ftd restarts the job excluding the node)."""
    return [Fault(i, t, "gpu", 0, slot, 100 + i) for i, (t, slot) in enumerate(at)]


def test_the_cost_model_is_the_sum_of_its_terms() -> None:
    warm = BENCH_COSTS.stop_s + BENCH_COSTS.start_warm_s + BENCH_COSTS.rendezvous_first_step_s + 30.0
    assert cost(SPARES) == pytest.approx(warm)
    assert cost(SPARES) == pytest.approx(31.71)  # the bench medians + the 30 s load
    cold = SPARES.replace(warm_spares=False)
    assert cost(cold) - in_allocation_s(SPARES.load_s, warm=SPARES.warm_spares) == pytest.approx(2.96 - 0.37)


def test_spares_are_used_while_left_then_the_scheduler_requeues() -> None:
    result = run("ftd", SMALL, SPARES, gpu_faults((1000.0, 0), (2000.0, 1), (3000.0, 2)))
    assert result.interruptions == 3
    assert result.restarts_in_allocation == 2
    assert result.restarts_in_place == 0
    assert result.spares_used == 2
    assert result.restarts_requeued == 1
    # two in the allocation, one requeue; the requeue waits for the first node back from repair
    assert result.lost["restart"] == pytest.approx(2 * cost(SPARES) + REQUEUE_S)
    assert result.lost["spare_wait"] == pytest.approx(1000.0 + REPAIR_S - 3000.0)
    assert result.spares_replenished == 0  # no free node for the requeue, none returns to a running job
    # when returned nodes rejoin: the two still in repair become the allocation's spares again
    returning = run(
        "ftd", SMALL, SPARES.replace(spares_return=True), gpu_faults((1000.0, 0), (2000.0, 1), (3000.0, 2))
    )
    assert returning.spares_replenished == 2
    assert (returning.restarts_in_allocation, returning.restarts_requeued) == (2, 1)


def test_a_repaired_node_becomes_a_spare_again_when_spares_return() -> None:
    one = SPARES.replace(alloc_spares=1, spare_nodes=1, spares_return=True)
    later = 1000.0 + REPAIR_S + 100.0  # after the first failed node is back
    result = run("ftd", SMALL, one, gpu_faults((1000.0, 0), (later, 1)))
    assert (result.restarts_in_allocation, result.restarts_requeued, result.spares_used) == (2, 0, 2)
    assert result.lost["restart"] == pytest.approx(2 * cost(one))
    assert result.lost["spare_wait"] == 0.0
    # before it is back, the second fault finds no spare
    early = run("ftd", SMALL, one, gpu_faults((1000.0, 0), (2000.0, 1)))
    assert (early.restarts_in_allocation, early.restarts_requeued) == (1, 1)
    # without spares_return (what a Slurm allocation does), the repaired node stays out of the job
    fixed = run("ftd", SMALL, one.replace(spares_return=False), gpu_faults((1000.0, 0), (later, 1)))
    assert (fixed.restarts_in_allocation, fixed.restarts_requeued, fixed.spares_replenished) == (1, 1, 0)


def test_the_replenish_rate_refills_from_free_nodes() -> None:
    one = SPARES.replace(alloc_spares=1, spare_nodes=4)
    trace = gpu_faults((1000.0, 0), (2000.0, 1), (3000.0, 2))
    refilled = run("ftd", SMALL, one.replace(spare_replenish_s=500.0), trace)
    assert (refilled.restarts_in_allocation, refilled.restarts_requeued) == (3, 0)
    assert refilled.spares_replenished == 3  # one 500 s after each spare used (the last before the end)
    # without a rate: the second restart finds none and is requeued; the requeued job's new allocation
    # holds N+K again (a free node), so the third is in the allocation
    never = run("ftd", SMALL, one, trace)
    assert (never.restarts_in_allocation, never.restarts_requeued) == (2, 1)
    assert never.lost["restart"] == pytest.approx(2 * cost(one) + REQUEUE_S)


def test_an_in_place_restart_needs_no_spare() -> None:
    fault = [Fault(0, 5000.0, "app", 0, 3, 7)]  # Xid 13, the job saves: restart in place
    none_left = SMALL_PARAMS.replace(in_allocation=True, alloc_spares=0)
    result = run("ftd", SMALL, none_left, fault)
    assert (result.restarts_in_allocation, result.restarts_in_place, result.spares_used) == (1, 1, 0)
    assert result.lost["restart"] == pytest.approx(cost(none_left))
    plain = run("ftd", SMALL, SMALL_PARAMS, fault)  # not under ftd run: requeued as before
    assert plain.restarts_in_allocation == 0
    assert plain.lost["restart"] == pytest.approx(REQUEUE_S)
    assert result.ettr > plain.ettr


def test_without_ftd_the_spares_change_nothing() -> None:
    trace = gpu_faults((1000.0, 0), (2000.0, 1), (30000.0, 2))
    assert (
        run("no_ftd", SMALL, SPARES, trace).to_json()
        == run("no_ftd", SMALL, SPARES.replace(in_allocation=False, alloc_spares=0), trace).to_json()
    )
    assert run("no_ftd", SMALL, SPARES, trace).restarts_in_allocation == 0


def test_other_costs_are_used() -> None:
    slow = RestartCosts(stop_s=1.0, start_warm_s=2.0, start_cold_s=5.0, rendezvous_first_step_s=60.0)
    trace = [Fault(0, 5000.0, "app", 0, 3, 7)]
    params = SMALL_PARAMS.replace(in_allocation=True)
    result = asyncio.run(simulate(SMALL, params, trace, None, slow))  # no ftd: costs unused
    assert result.lost["restart"] == pytest.approx(REQUEUE_S)
    assert in_allocation_s(params.load_s, warm=True, costs=slow) == pytest.approx(1.0 + 2.0 + 60.0 + 30.0)


def test_llama3_ftd_spares_is_deterministic_and_beats_meta() -> None:
    mix = load_mix("llama3")
    spares = from_scenario(mix.scenarios["ftd-spares"], days=10.0)
    meta = from_scenario(mix.scenarios["meta"], days=10.0)
    assert spares.replace(in_allocation=False, alloc_spares=0) == meta  # the same set-up otherwise
    trace = trace_for(mix, spares, seed=1)
    first, again = run("ftd", mix, spares, trace), run("ftd", mix, spares, trace)
    assert first.to_json() == again.to_json()
    assert first.restarts_in_allocation > 0
    assert first.restarts_in_allocation + first.restarts_requeued <= first.interruptions
    assert first.ettr > run("ftd", mix, meta, trace).ettr
    assert run("no_ftd", mix, spares, trace).ettr == run("no_ftd", mix, meta, trace).ettr


def test_cli_reports_the_in_allocation_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sim", "goodput", "--days", "5", "--seeds", "1", "--no-sweep", "--scenario", "ftd-spares"]
    assert main([*args, "--json", "--state", str(tmp_path / "s.json")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["params"]["in_allocation"] is True
    assert report["params"]["alloc_spares"] == 16
    assert report["restart_costs"]["in_allocation_s"] == pytest.approx(0.55 + 0.37 + 0.79 + 60.0)
    assert report["restart_costs"]["requeue_s"] == 300.0
    ftd = report["policies"]["ftd"]
    assert ftd["restarts_in_allocation"] > 0
    assert report["policies"]["no_ftd"]["restarts_in_allocation"] == 0
    assert main([*args, "--no-in-allocation", "--json", "--state", str(tmp_path / "s.json")]) == 0
    assert json.loads(capsys.readouterr().out)["policies"]["ftd"]["restarts_in_allocation"] == 0
    assert main([*args, "--alloc-spares", "-1", "--state", str(tmp_path / "s.json")]) == 2
    assert "--alloc-spares must be >= 0" in capsys.readouterr().err


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raw=faults_st,
    spares=st.integers(min_value=0, max_value=3),
    rate=st.sampled_from([0.0, 900.0]),
    back=st.booleans(),
)
def test_time_adds_up_with_hot_spares(raw: list[Any], spares: int, rate: float, back: bool) -> None:
    params = SPARES.replace(alloc_spares=spares, spare_replenish_s=rate, spare_nodes=3, spares_return=back)
    result = run("ftd", SMALL, params, as_trace(raw))
    assert 0.0 <= result.ettr <= 1.0
    assert accounted(result) == pytest.approx(params.horizon_s, rel=1e-9)
    assert result.restarts_in_allocation + result.restarts_requeued <= result.interruptions
    assert result.restarts_in_place <= result.restarts_in_allocation
    assert result.spares_used <= result.restarts_in_allocation
    assert result.spares_used <= spares + result.spares_replenished  # never more spares than there were
