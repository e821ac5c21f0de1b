"""The shipped example ``rules/python/thermal_throttle.py`` adds to the built-in ``thermal`` rule and
never repeats it (issue #32 item 9): no notify on an onset, and no save for an episode the agent
itself reported as sustained (the built-in rule saved and notified); an episode that lasts in and out
of throttling is still saved. Loaded from the file, fed with :mod:`ftd.testing`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from ftd.testing import evaluate_rule, make_event, view_with

RULE = Path(__file__).resolve().parents[2] / "rules" / "python" / "thermal_throttle.py"
GPU = {"uuid": "GPU-7d2e9f41-0b3c-4a6d-95e8-1f4c7a20b6d3", "index": 3, "pci": "0000:5d:00.0"}


def load() -> ModuleType:  # a fresh module each time: the rule keeps its episodes
    spec = importlib.util.spec_from_file_location("thermal_throttle", RULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["thermal_throttle"] = module  # dataclasses look their module up while it loads
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["thermal_throttle"]
    return module


def throttling(ts: float, *, sustained: bool = False) -> object:
    data = {**GPU, "active": True, "throttle_reasons": ["sw_thermal_slowdown"], "sustained": sustained}
    return make_event("gpu-c12", "thermal", severity="error" if sustained else "warning", data=data, ts=ts)


def straggler(ts: float) -> object:
    return make_event("gpu-c12", "rank_straggler", severity="warning", data={"job": "j1", "rank": 3}, ts=ts)


def test_an_onset_is_left_to_the_built_in_rule_and_a_long_episode_is_saved() -> None:
    view = view_with(jobs={"j1": ["gpu-c12"]})
    actions = evaluate_rule(load(), [throttling(0), straggler(700)], view)
    assert [(a.kind, a.target) for a in actions] == [("checkpoint", "j1")]


def test_an_episode_the_agent_called_sustained_is_not_saved_twice() -> None:
    view = view_with(jobs={"j1": ["gpu-c12"]})
    actions = evaluate_rule(load(), [throttling(0), throttling(300, sustained=True), straggler(700)], view)
    assert actions == []
