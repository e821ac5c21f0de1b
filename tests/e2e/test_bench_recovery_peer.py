"""``ftd bench recovery``'s two paths where the rank really stops (issue #31), on real parts.

Real Slurm with four ``slurmd`` nodes, real Mosquitto, an agent per node and the coordinator
(:mod:`ftd.bench.recovery_stack`), a real DDP job (torch gloo on CPU) checkpointing every
:data:`~ftd.bench.recovery.SAVE_EVERY` steps, and the bench's own :func:`measure_path`:

- ``rank_killed``: node-2's training process SIGKILLed and Xid 79 written there: no save can gather
  every rank, so the spare takes node-2's slot and generation 1 resumes from the newest periodic
  checkpoint, losing no saved step;
- ``torchrun``: the same job under ``torchrun --max-restarts 3`` and the same rank killed: every rank
  restarts from the newest checkpoint, and ftd (agents and coordinator running) takes no action.

Exact counts and steps, no timing: the bench reports the seconds (docs/architecture.md §10).
"""

from __future__ import annotations

import pytest

from ftd.bench.recovery import FAULT_NODE, PATHS, SAVE_EVERY, measure_path
from ftd.bench.recovery_stack import RecoveryStack
from tests.e2e import test_recovery_slurm as recovery_tests

# The peers' launchers on the recovery bench (minutes): make bench-tests; ftd's own recovery on the same
# stack is tests/e2e/test_recovery_slurm.py, in make test.
pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.bench]

pytest.importorskip("torch")

# The recovery tests' stack, defined once there; the four-node Slurm cluster is tests/e2e/conftest.py's.
stack = recovery_tests.stack


def test_a_killed_rank_is_replaced_by_the_spare_from_the_newest_checkpoint(stack: RecoveryStack) -> None:
    spec, fault = PATHS["rank_killed"]
    got = measure_path(stack, spec, fault=fault)
    assert got["new"] == [0, 1] and got["ranks"] == 3, got
    assert got["coordinator"]["path"] == "spare" and got["coordinator"]["out"] == [FAULT_NODE], got
    assert got["nodes"] == {"0": "node-1", "1": "node-4", "2": "node-3"}, got
    # no save gathered every rank after the kill: the newest periodic checkpoint is the one resumed
    assert got["save_step"] is None, got
    assert got["newest_checkpoint"] > 0 and got["newest_checkpoint"] % SAVE_EVERY == 0, got
    assert got["resumed_from"] == got["newest_checkpoint"] and got["steps_lost"] == 0, got
    assert got["steps_redone"] >= 0 and got["first_step"] == got["resumed_from"] + 1, got
    assert got["old_generation_ranks"] == 0 and got["old_steps_after_new_start"] == 0, got


def test_the_torchrun_peer_restarts_every_rank_from_the_newest_checkpoint(stack: RecoveryStack) -> None:
    spec, fault = PATHS["torchrun"]
    got = measure_path(stack, spec, fault=fault)
    assert "error" not in got, got
    assert got["old"] == [0, 0] and got["new"] is not None and got["new"][1] >= 1, got
    assert got["ranks"] == 3 and set(got["nodes"].values()) == {"node-1", "node-2", "node-3"}, got
    assert got["newest_checkpoint"] > 0 and got["newest_checkpoint"] % SAVE_EVERY == 0, got
    assert got["resumed_from"] == got["newest_checkpoint"] and got["steps_lost"] == 0, got
    # ftd ran beside it and did nothing: no Xid, no client, no action on the job
    assert got["action_state"] is None and stack.action("checkpoint_restart", got["job"]) is None
