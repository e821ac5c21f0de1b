"""Testing a rule with ftd.testing: build a view, feed events, look at the requests."""

from __future__ import annotations

from ftd_plugin_template import rule  # importable without installing: see conftest.py

from ftd.testing import evaluate_rule, make_event, view_with


def test_third_flap_within_ten_minutes_drains_and_moves_the_job() -> None:
    rule.reset()
    view = view_with(jobs={"1001": ["node-1", "node-2"]})
    flaps = [make_event("node-1", "ib_link", data={"state": "down"}, ts=t) for t in (0, 200, 400)]
    actions = evaluate_rule(rule, flaps, view)
    assert [(a.kind, a.target) for a in actions] == [("checkpoint_restart", "1001"), ("drain_node", "node-1")]
    assert actions[0].params["exclude"] == ["node-1"]


def test_slow_flaps_do_nothing() -> None:
    rule.reset()
    flaps = [make_event("node-1", "ib_link", data={"state": "down"}, ts=t) for t in (0, 700, 1400)]
    assert evaluate_rule(rule, flaps, view_with()) == []
