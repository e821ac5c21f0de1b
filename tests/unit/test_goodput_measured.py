"""The ``measured`` goodput scenario (issue #34): every cost from a measurement, none drifted.

The data file's ``[scenario.measured]`` must hold exactly what :mod:`ftd.sim.goodput.measured` derives
from the GPU measurement (``ftd/sim/data/checkpoint_costs.json``), the recovery bench and the Young/Daly
optimum; the measurement file's medians must be the medians of its own samples; a state larger than
anything measured is refused, not extrapolated. On the Llama 3 mix the scenario reaches the 98% ETTR
target with ftd, and what is left is detection, not checkpoints or restarts.
"""

from __future__ import annotations

import statistics

import pytest

from ftd.sim.goodput.faults import load_mix
from ftd.sim.goodput.measured import (
    MeasureError,
    load_measurements,
    measured_values,
    per_gpu_state_bytes,
    save_costs,
)
from ftd.sim.goodput.model import from_scenario
from ftd.sim.goodput.runner import trace_for, young_daly_s
from tests.unit.test_goodput import run


def test_the_scenario_holds_the_measured_costs() -> None:
    mix = load_mix("llama3")
    scenario = mix.scenarios["measured"]
    derived = measured_values(mix)
    for name, value in derived.items():
        if isinstance(value, bool | int):
            assert scenario[name] == value, name
        else:
            assert scenario[name] == pytest.approx(value, rel=2e-3), name
    # the interval is the optimum for the measured save and the mix's MTBF (3.09 h)
    assert scenario["checkpoint_interval_s"] == pytest.approx(
        young_daly_s(mix.job_mtbf_s(16384), scenario["save_s"]), rel=2e-3
    )
    # what is not a cost is the site's, as in ftd-spares
    spares = mix.scenarios["ftd-spares"]
    for name in ("watchdog_s", "crash_detect_s", "same_node_p", "silent_detect_s", "preflight_s"):
        assert scenario[name] == spares[name], name


def test_the_measurement_file_is_consistent() -> None:
    data = load_measurements()
    assert data["gpu"] and data["measured"] and data["script"]
    for size in data["sizes"].values():
        for name, samples in size["samples"].items():
            assert size["median"][name] == pytest.approx(statistics.median(samples)), name
        # the async save's blocked part is far below a synchronous save of the same state
        assert size["median"]["snapshot_pinned_s"] < size["median"]["sync_save_s"] / 10


def test_the_state_size_picks_the_smallest_measured_size_that_holds_it() -> None:
    # 405e9 x 14 bytes / 16,384 GPUs = 346 MB: the 346 MiB measurement holds it
    assert per_gpu_state_bytes() == pytest.approx(405e9 * 14 / 16384)
    costs = save_costs(per_gpu_state_bytes())
    assert costs.state_bytes == 346 << 20
    assert save_costs(1).state_bytes == 100 << 20
    assert save_costs(346 << 20).state_bytes == 346 << 20
    assert save_costs((346 << 20) + 1).state_bytes == 1 << 30
    with pytest.raises(MeasureError, match="largest measured"):
        save_costs((1 << 30) + 1)
    with pytest.raises(MeasureError):
        save_costs(1, {"sizes": {}, "gpu": "x", "torch": "x", "measured": "x"})


def test_measured_costs_reach_the_target_and_detection_is_what_is_left() -> None:
    mix = load_mix("llama3")
    params = from_scenario(mix.scenarios["measured"])
    trace = trace_for(mix, params, 1)
    ftd = run("ftd", mix, params, trace)
    no_ftd = run("no_ftd", mix, params, trace)
    assert ftd.ettr >= 0.98
    assert ftd.ettr > no_ftd.ettr
    assert max(ftd.lost, key=lambda cause: ftd.lost[cause]) == "detection"
    # a plain synchronous save, even at its own optimum interval, costs more
    sync = save_costs(per_gpu_state_bytes()).sync_save_s
    slow = params.replace(save_s=sync, checkpoint_interval_s=young_daly_s(mix.job_mtbf_s(16384), sync))
    assert run("ftd", mix, slow, trace).ettr < ftd.ettr
