"""The Xid catalog: coverage of NVIDIA's codes, valid buckets, the key policies, and validation."""

from __future__ import annotations

import json

import pytest

from ftd.catalog import ACTIONS, SEVERITIES, CatalogError, load_xid_catalog, parse_xid_catalog
from ftd.cli import main

REQUIRED = [13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120, 121, 123, 140, 143,
            144, 145, 146, 147, 148, 149, 150, 154]  # fmt: skip


def test_every_code_1_to_170_is_present() -> None:
    catalog = load_xid_catalog()
    assert [code for code in range(1, 171) if code not in catalog] == []
    assert all(code in catalog for code in REQUIRED)


def test_every_entry_is_valid() -> None:
    catalog = load_xid_catalog()
    for code, info in catalog.entries.items():
        assert info.code == code
        assert info.action in ACTIONS, code
        assert info.severity in SEVERITIES, code
        assert info.name and info.description, code
        assert all(other in catalog for other in info.follows), code
        assert catalog.action_meaning(info.action), f"bucket {info.action} has no meaning text"


def test_version_and_source() -> None:
    catalog = load_xid_catalog()
    assert catalog.version
    assert "docs.nvidia.com" in catalog.source
    assert load_xid_catalog() is catalog  # cached


@pytest.mark.parametrize(
    ("code", "action", "fatal"),
    [
        (79, "RESTART_BM", True),
        (48, "WORKFLOW_XID_48", True),
        (13, "RESTART_APP", False),
        (31, "RESTART_APP", False),
        (43, "IGNORE", False),
        (45, "WORKFLOW_XID_45", False),
        (63, "IGNORE", False),
        (64, "RESET_GPU", True),
        (74, "WORKFLOW_NVLINK_ERR", True),
        (94, "RESTART_APP", False),
        (95, "RESET_GPU", True),
        (119, "RESET_GPU", True),
        (149, "WORKFLOW_NVLINK5_ERR", False),
        (154, "XID_154", False),
    ],
)
def test_key_policies(code: int, action: str, fatal: bool) -> None:
    info = load_xid_catalog().get(code)
    assert (info.action, info.fatal) == (action, fatal)


def test_follow_on_relations() -> None:
    catalog = load_xid_catalog()
    assert {48, 79, 94, 95, 144, 149, 150} <= set(catalog.get(45).follows)
    assert {79, 119} <= set(catalog.get(154).follows)
    assert 48 in catalog.get(63).follows


def test_43_and_13_never_ask_for_a_drain() -> None:
    catalog = load_xid_catalog()
    for code in (13, 43):
        assert catalog.get(code).action not in {"RESTART_BM", "RESET_GPU"}
        assert catalog.get(code).severity != "critical"


def test_unknown_code_default() -> None:
    catalog = load_xid_catalog()
    assert catalog.lookup(4242) is None
    info = catalog.get(4242)
    assert (info.known, info.action, info.fatal, info.severity) == (
        False,
        "CONTACT_SUPPORT",
        False,
        "warning",
    )


GOOD = """
version = "t1"
source = "test"
[xid.1]
name = "A"
description = "d"
action = "IGNORE"
fatal = false
severity = "info"
"""


def test_parse_minimal() -> None:
    catalog = parse_xid_catalog(GOOD)
    assert catalog.get(1).name == "A" and catalog.version == "t1"


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (("IGNORE", "REBOOT_EVERYTHING"), "xid.1: field 'action'"),
        (('severity = "info"', 'severity = "bad"'), "xid.1: field 'severity'"),
        (("fatal = false", "fatal = 1"), "xid.1: field 'fatal'"),
        (('name = "A"\n', ""), "xid.1: missing field 'name'"),
        (("[xid.1]", "[xid.abc]"), "xid.abc"),
        (("fatal = false", 'fatal = false\nfollows = ["x"]'), "xid.1: field 'follows'"),
        (("fatal = false", "fatal = false\ncolour = 1"), "xid.1: unknown field(s) colour"),
        (('version = "t1"\n', ""), "missing field 'version'"),
    ],
)
def test_validation_names_code_and_field(edit: tuple[str, str], needle: str) -> None:
    with pytest.raises(CatalogError) as info:
        parse_xid_catalog(GOOD.replace(*edit))
    assert needle in str(info.value)


def test_xid_explain_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["xid", "explain", "79"]) == 0
    out = capsys.readouterr().out
    assert "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" in out
    assert "RESTART_BM" in out
    assert load_xid_catalog().version in out


def test_xid_explain_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["xid", "explain", "45", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["code"] == 45 and doc["action"] == "WORKFLOW_XID_45" and 48 in doc["follows"]
    assert doc["catalog_version"] == load_xid_catalog().version


@pytest.mark.parametrize("code", ["4242", "abc"])
def test_xid_explain_unknown(code: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["xid", "explain", code]) == 2
    assert "not in the catalog" in capsys.readouterr().err


# --- what ftd does: one table for ``ftd xid explain`` and the Xid rule --------------------------------

_EXPECTED_BY_PLAN = {
    "restart": [("checkpoint_restart", "j1")],
    "reset": [("checkpoint_restart", "j1"), ("gpu_reset", "node-1")],
    "drain": [("checkpoint_restart", "j1"), ("drain_node", "node-1")],
    "notify": [("notify", "node-1")],
    "none": [],
}


def test_every_bucket_has_a_plan_and_says_whether_it_implicates_hardware() -> None:
    from ftd.catalog.remedy import PLANS

    assert set(PLANS) == set(ACTIONS)
    assert not PLANS["RESTART_APP"].implicates_hardware and PLANS["RESTART_BM"].implicates_hardware
    assert all(plan.does for plan in PLANS.values())


@pytest.mark.parametrize("code", sorted(load_xid_catalog().entries))
def test_the_xid_rule_does_what_xid_explain_says(code: int, capsys: pytest.CaptureFixture[str]) -> None:
    """For every catalog code: the plan ``ftd xid explain --json`` prints is what the rule does."""
    from ftd.rules import xid_catalog
    from ftd.testing import evaluate_rule, make_event, view_with

    assert main(["xid", "explain", str(code), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    event = make_event("node-1", "xid", severity=doc["severity"], data={"code": code, "pci": "0000:3b:00.0"})
    actions = evaluate_rule(xid_catalog, event, view_with(jobs={"j1": ["node-1"]}))
    assert [(str(a.kind), a.target) for a in actions] == _EXPECTED_BY_PLAN[doc["ftd_plan"]], doc["ftd_does"]
    if doc["ftd_plan"] == "restart":
        assert actions[0].params["exclude"] == [] and not doc["implicates_hardware"]


def test_xid_explain_says_what_ftd_does(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["xid", "explain", "13"]) == 0
    out = capsys.readouterr().out
    assert "ftd does:" in out and "never drains" in out and "not hardware" in out
    assert main(["xid", "explain", "48"]) == 0
    out = capsys.readouterr().out
    assert "gpu_reset" in out and "Xid 63/64" in out
