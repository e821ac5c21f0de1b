"""``Scheduler.reboot`` on a real Slurm (the GPU reset's escalation): ``scontrol reboot ASAP
nextstate=... reason=... NODE`` is a command slurmctld parses and answers; the test cluster has no
``RebootProgram``, so it refuses, and that refusal must reach the caller as a SchedulerError (the
escalation then drains the node), leaving the node as it was."""

from __future__ import annotations

import asyncio

import pytest

from ftd.coordinator.actions.scheduler import SchedulerError
from ftd.coordinator.actions.slurm import SlurmScheduler
from tests.realparts import SlurmCluster

pytestmark = [pytest.mark.real]


def test_a_refused_reboot_is_a_scheduler_error_and_changes_nothing(slurm: SlurmCluster) -> None:
    scheduler = SlurmScheduler(slurm_conf=str(slurm.conf_path))
    with pytest.raises(SchedulerError) as refused:
        asyncio.run(scheduler.reboot("node-2", 'ftd: gpu reset of "x" not done', "RESUME"))
    text = str(refused.value)
    assert "reboot" in text and "ASAP" in text and "nextstate=RESUME" in text, text
    assert "reason=ftd: gpu reset of 'x' not done" in text  # sanitized, one argv element
    assert "RebootProgram" in text or "reboot" in refused.value.stderr.lower(), text
    state = slurm.node("node-2").get("State", "")
    assert "DRAIN" not in state and "REBOOT" not in state, state


def test_an_unknown_nextstate_is_refused_before_scontrol_runs() -> None:
    scheduler = SlurmScheduler(scontrol="/nonexistent/scontrol")
    with pytest.raises(SchedulerError, match="invalid nextstate 'IDLE'"):
        asyncio.run(scheduler.reboot("node-2", "r", "IDLE"))
