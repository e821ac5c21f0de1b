"""Declarative TOML rules: matching, counting in windows, validation naming rule and field."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from ftd.coordinator.decide.declarative import DeclarativeError, load_rules_file, parse_rules
from ftd.coordinator.decide.plugins import PluginError, make_plugin_manager
from ftd.testing import evaluate_rule, make_event, view_with

RULES = """
[[rule]]
name = "dbe-twice"
match = { kind = "xid", "data.code" = 48, severity = ">=error" }
count = 2
window_s = 3600
action = "drain_node"
params = { ticket = true }
reason = "{count} DBEs in {window_s}s on {node} ({pci})"

[[rule]]
name = "nccl-per-job"
match = { kind = "log_pattern", "data.pattern" = "~^nccl" }
count = 3
window_s = 60
per = "job"
action = "checkpoint_restart"
exclude_node = true
"""


def rules(text: str = RULES):  # type: ignore[no-untyped-def]
    return parse_rules(tomllib.loads(text))


def test_count_within_window_fires_once_then_starts_afresh() -> None:
    dbe, _ = rules()
    view = view_with()

    def xid(ts: float, code: int = 48, severity: str = "error", node: str = "node-1"):  # type: ignore[no-untyped-def]
        return make_event(node, "xid", severity=severity, data={"code": code, "pci": "0000:3b:00.0"}, ts=ts)

    assert evaluate_rule(dbe, [xid(0), xid(4000)], view) == []  # two, but an hour apart
    assert evaluate_rule(dbe, [xid(5000, code=13), xid(5001, severity="warning")], view) == []  # no match
    assert evaluate_rule(dbe, [xid(5002, node="node-2")], view) == []  # counted per node
    [drain] = evaluate_rule(dbe, [xid(5003)], view)  # 4000 and 5003: within the hour
    assert (drain.kind, drain.target, drain.rule) == ("drain_node", "node-1", "toml:dbe-twice")
    assert drain.reason == "2 DBEs in 3600s on node-1 (0000:3b:00.0)"
    assert drain.params["ticket"] is True and drain.params["pci"] == "0000:3b:00.0"
    assert evaluate_rule(dbe, [xid(5004)], view) == []  # the window started afresh


def test_per_job_counting_and_job_targets() -> None:
    _, nccl = rules()
    view = view_with(jobs={"j1": ["node-1", "node-2"]})
    events = [
        make_event(node, "log_pattern", data={"pattern": "nccl_timeout"}, ts=t)
        for node, t in (("node-1", 1), ("node-2", 2), ("node-1", 3))
    ]
    [restart] = evaluate_rule(nccl, events, view)
    assert (restart.kind, restart.target, restart.params["exclude"]) == (
        "checkpoint_restart",
        "j1",
        ["node-1"],
    )


def test_storm_counts_add_up() -> None:
    dbe, _ = rules()
    storm = make_event("node-1", "xid", severity="error", data={"code": 48}, count=5)
    assert len(evaluate_rule(dbe, storm, view_with())) == 1


def test_validation_names_the_rule_and_the_field() -> None:
    bad = """
[[rule]]
name = "oops"
match = { kind = "xidd", severity = ">=fatal", "data.code" = ">=x", colour = "red" }
count = 3
action = "reboot"
per = "rack"
[[rule]]
match = { kind = "xid" }
action = "notify"
extra = 1
"""
    with pytest.raises(DeclarativeError) as info:
        rules(bad)
    text = str(info.value)
    for needle in (
        "rule[0] 'oops': match.kind: unknown event kind 'xidd'",
        "rule[0] 'oops': match.severity: unknown severity 'fatal'",
        "rule[0] 'oops': match.data.code: >= needs a number",
        "rule[0] 'oops': match.colour: unknown field",
        "rule[0] 'oops': window_s: required when count > 1",
        "rule[0] 'oops': action: must be one of",
        "rule[0] 'oops': per: must be one of node, gpu, job",
        "rule[1]: name: required",
        "rule[1]: extra: unknown field",
    ):
        assert needle in text, needle


def test_rules_file_loads_as_plugins_and_bad_file_fails_startup(tmp_path: Path) -> None:
    good = tmp_path / "rules.toml"
    good.write_text(RULES)
    assert [r.plugin_name for r in load_rules_file(good)] == ["toml:dbe-twice", "toml:nccl-per-job"]
    pm = make_plugin_manager(entry_points=False, rules_file=good, disabled=["nccl-per-job"])
    assert pm.has_plugin("toml:dbe-twice") and not pm.has_plugin("toml:nccl-per-job")
    broken = tmp_path / "broken.toml"
    broken.write_text('[[rule]]\nname = "x"\nmatch = { kind = "xid" }\naction = "drain"\n')
    with pytest.raises(PluginError, match=r"broken.toml: rule\[0\] 'x': action"):
        make_plugin_manager(entry_points=False, rules_file=broken)
