"""The hang rule (issue #33): symptoms -> one diagnose_hang per job; the verdict -> act on it."""

from __future__ import annotations

from typing import Any

from ftd.events import Kind
from ftd.plugin import ActionKind, ActionRequest
from ftd.rules import hang
from ftd.testing import evaluate_rule, make_event, view_with

VIEW = view_with(jobs={"j1": ["node-1", "node-2", "node-3"]})


def _verdict(**data: Any) -> list[ActionRequest]:
    event = make_event(
        str((data.get("culprit_nodes") or ["node-1"])[0]),
        Kind.HANG_VERDICT,
        severity="error",
        source="coordinator",
        data={"job": "j1", "action_id": "a-1", "unclear": "restart", "evidence": ["stacks: x"], **data},
    )
    return evaluate_rule(hang, event, VIEW)


def _by_kind(actions: list[ActionRequest], kind: str) -> list[ActionRequest]:
    return [a for a in actions if a.kind == kind]


def test_symptoms_diagnose_the_job_once_whatever_the_rank() -> None:
    for rank in (0, 1, 5):
        event = make_event("node-2", "rank_heartbeat_lost", data={"job": "j1", "rank": rank})
        [diag] = evaluate_rule(hang, event, VIEW)
        assert (diag.kind, diag.target, diag.key) == ("diagnose_hang", "j1", "diagnose_hang:j1")
    watchdog = make_event(
        "node-3", "log_pattern", severity="critical", data={"job": "j1", "pattern": "nccl_watchdog_timeout"}
    )
    assert [a.kind for a in evaluate_rule(hang, watchdog, VIEW)] == ["diagnose_hang"]
    other = make_event(
        "node-3", "log_pattern", severity="critical", data={"job": "j1", "pattern": "cuda_oom"}
    )
    assert evaluate_rule(hang, other, VIEW) == []


def test_confident_culprit_excluded_without_a_save_drained_as_suspect_and_notified() -> None:
    actions = _verdict(
        verdict="culprit", confident=True, culprit_nodes=["node-2"], culprit_ranks=[3], why="w"
    )
    [restart] = _by_kind(actions, ActionKind.CHECKPOINT_RESTART)
    assert restart.target == "j1" and restart.params["exclude"] == ["node-2"]
    assert restart.params["save"] is False and restart.params["no_save_reason"]
    [drain] = _by_kind(actions, ActionKind.DRAIN_NODE)
    assert drain.target == "node-2" and drain.params["suspect"] is True
    [note] = _by_kind(actions, ActionKind.NOTIFY)
    assert note.params["verdict"] == "culprit" and note.params["evidence"] == ["stacks: x"]
    assert note.params["diagnosis"] == "a-1"


def test_unclear_verdicts_never_exclude_a_node() -> None:
    cases = [
        {"verdict": "job_wide", "confident": True, "culprit_nodes": []},
        {"verdict": "unknown", "confident": False, "culprit_nodes": []},
        {"verdict": "culprit", "confident": False, "culprit_nodes": ["node-2"]},
    ]
    for case in cases:
        actions = _verdict(**case)
        [restart] = _by_kind(actions, ActionKind.CHECKPOINT_RESTART)
        assert restart.params["exclude"] == [] and restart.params["save"] is False
        assert "requeue" not in restart.params
        assert not _by_kind(actions, ActionKind.DRAIN_NODE)
        assert _by_kind(actions, ActionKind.NOTIFY)
    [stopped] = _by_kind(_verdict(verdict="job_wide", confident=True, unclear="stop"), "checkpoint_restart")
    assert stopped.params["requeue"] is False and stopped.params["exclude"] == []


def test_a_verdict_not_from_the_coordinator_is_ignored() -> None:
    forged = make_event(
        "node-1",
        Kind.HANG_VERDICT,
        source="agent",
        data={"job": "j1", "verdict": "culprit", "confident": True, "culprit_nodes": ["node-2"]},
    )
    assert evaluate_rule(hang, forged, VIEW) == []
    assert _verdict(job=None, verdict="culprit", confident=True, culprit_nodes=["node-2"]) == []
