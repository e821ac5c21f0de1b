"""Return to service on the real Slurm (issue #12): a node reset by an opted-in rule comes back only after
its preflight passes.

Real Slurm, Mosquitto, ``ftd agent`` (node-1) and ``ftd coordinator`` processes; the coordinator opts
the Xid rule in (``coordinator.return_to_service.rules = ["xid_catalog"]``). The agent's
``nvidia-smi`` is a stand-in on its PATH (one GPU at 0000:3b:00.0, no process on it, ``-r``
succeeds): there is no GPU on this machine. The preflight's decisive check is the site's own command
(``agent.preflight.commands``: a file that says whether the node is healthy); the NVML, torch, DCGM
and NCCL checks skip with their reasons.

An Xid 46 (RESET_GPU) on node-1: the coordinator drains node-1 (``return-to-service``), the agent
resets the GPU, then runs its preflight on the coordinator's ``preflight`` directive:

- passing: node-1 is resumed, and the ledger has drain -> preflight -> resume in that order;
- failing: node-1 stays drained, now for RMA, with the preflight's reason and the history (the
  reset) in Slurm's reason.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.stack import make_stack, wait_until
from tests.realparts import Mosquitto, SlurmCluster

pytestmark = [pytest.mark.real, pytest.mark.slow]

XID46 = (
    "[ 7021.437112] NVRM: Xid (PCI:0000:3b:00): 46, pid=4242, name=python, "
    "Ch 00000008, engmask 00000101, intr 00000000"
)
FAKE_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu=*) echo "0, 00000000:3B:00.0, GPU-fake-0000" ;;
  *--query-compute-apps=*) ;;
  *-r*) echo "GPU 00000000:3B:00.0 was successfully reset." ;;
esac
exit 0
"""


def actions(ledger: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(ledger) as db:
        rows = db.execute("SELECT id, state, request, detail FROM actions ORDER BY created, id").fetchall()
    return [
        {"id": i, "state": state, "request": json.loads(request), "detail": json.loads(detail)}
        for i, state, request, detail in rows
    ]


def run_reset(
    slurm: SlurmCluster,
    mosquitto: Mosquitto,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    healthy: bool,
    burn_in: bool = False,
) -> list[dict[str, Any]]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text(FAKE_SMI)
    (bindir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{__import__('os').environ['PATH']}")  # the agent inherits it
    marker = tmp_path / "node-is-healthy"
    if healthy:
        marker.write_text("yes\n")
    agent_extra = f"""
[agent.nvml]
enabled = false

[agent.preflight]
commands = ["test -e {marker} || {{ echo 'site check: node marked unhealthy'; exit 1; }}"]
"""
    coordinator_extra = """
[coordinator.return_to_service]
rules = ["xid_catalog"]
preflight_deadline_s = 30
""" + ("require_burn_in = true\nburn_in_deadline_s = 60\n" if burn_in else "")
    with make_stack(
        slurm, mosquitto, tmp_path, agent_extra=agent_extra, coordinator_extra=coordinator_extra
    ) as stack:
        stack.append_kernel_line(XID46)

        def finished() -> bool:
            kinds = [(a["request"]["kind"], a["state"]) for a in actions(stack.ledger)]
            # Failing (or a required burn-in not passed): the drain for RMA, then its bundle (issue #36).
            last = ("resume_node", "succeeded") if healthy and not burn_in else ("rma_bundle", "succeeded")
            return ("preflight", "succeeded" if healthy else "escalated") in kinds and kinds[-1] == last

        wait_until(finished, 90, "drain, reset, preflight and the verdict")
        stack.agent.wait_log("preflight_answered")
        return actions(stack.ledger)


def test_a_reset_node_comes_back_after_its_preflight_passes(
    slurm: SlurmCluster, mosquitto: Mosquitto, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = run_reset(slurm, mosquitto, tmp_path, monkeypatch, healthy=True)
    steps = [(a["request"]["kind"], a["request"]["target"], a["state"]) for a in done]
    node_steps = [s for s in steps if s[1] == "node-1"]
    assert node_steps == [
        ("gpu_reset", "node-1", "succeeded"),
        ("drain_node", "node-1", "succeeded"),
        ("preflight", "node-1", "succeeded"),
        ("resume_node", "node-1", "succeeded"),
    ], steps
    preflight = next(a for a in done if a["request"]["kind"] == "preflight")
    assert preflight["detail"]["passed"] is True
    assert preflight["request"]["params"]["after"] == "GPU reset"
    state = slurm.node("node-1")["State"]
    assert "DRAIN" not in state, state


def test_a_reset_node_that_fails_preflight_is_drained_for_rma_with_its_history(
    slurm: SlurmCluster, mosquitto: Mosquitto, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = run_reset(slurm, mosquitto, tmp_path, monkeypatch, healthy=False)
    node_steps = [(a["request"]["kind"], a["state"]) for a in done if a["request"]["target"] == "node-1"]
    assert node_steps == [
        ("gpu_reset", "succeeded"),
        ("drain_node", "succeeded"),
        ("preflight", "escalated"),
        ("drain_node", "succeeded"),
        ("rma_bundle", "succeeded"),  # issue #36: the node drained for repair gets its bundle
    ], node_steps
    rma_drain = [a for a in done if a["request"]["kind"] == "drain_node"][-1]
    bundle = next(a for a in done if a["request"]["kind"] == "rma_bundle")
    assert bundle["detail"]["drain_action"] == rma_drain["id"]
    assert bundle["detail"]["bundle"].endswith(".tar.gz") and Path(bundle["detail"]["bundle"]).exists()
    info = slurm.node("node-1")
    assert "DRAIN" in info["State"]
    reason = info["Reason"]
    assert reason.startswith(
        "ftd: RMA: preflight failed after GPU reset: commands: command 1 exit 1: site check: node marked "
        "unhealthy; history: xid 46 gpu 0000:3b:00.0"
    ), reason
    assert "GPU reset done" in reason, reason


def test_where_burn_in_is_required_a_node_that_did_not_pass_it_stays_out(
    slurm: SlurmCluster, mosquitto: Mosquitto, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #36: the preflight passes, then the agent runs its burn-in; on this machine DCGM, a CUDA
    GPU and a pair test are absent, so it is incomplete -- not passed -- and the node is drained for
    RMA (and gets its bundle) instead of being resumed."""
    done = run_reset(slurm, mosquitto, tmp_path, monkeypatch, healthy=True, burn_in=True)
    node_steps = [(a["request"]["kind"], a["state"]) for a in done if a["request"]["target"] == "node-1"]
    assert node_steps == [
        ("gpu_reset", "succeeded"),
        ("drain_node", "succeeded"),
        ("preflight", "succeeded"),
        ("burn_in", "escalated"),
        ("drain_node", "succeeded"),
        ("rma_bundle", "succeeded"),
    ], node_steps
    burn_in = next(a for a in done if a["request"]["kind"] == "burn_in")
    assert burn_in["detail"]["verdict"] == "incomplete"
    assert "dcgmi is not on PATH" in burn_in["detail"]["burn_in"]
    info = slurm.node("node-1")
    assert "DRAIN" in info["State"]
    assert info["Reason"].startswith("ftd: RMA: burn-in failed after GPU reset: not every step ran"), info
