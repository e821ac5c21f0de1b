"""checkpoint_restart's resume phase with an in-process scheduler: an in-place restart is followed
until the job trains again (the real-Slurm test is tests/e2e/test_restart_followed_slurm.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.checkpoint_restart import WAITING, CheckpointRestart, not_resumed
from ftd.coordinator.actions.scheduler import JobInfo
from ftd.coordinator.model.state import ClusterState
from ftd.events import JobPresence, RankInfo
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState


class Scheduler:
    name = "fake"

    def __init__(self, states: list[JobInfo]) -> None:
        self.states = states

    async def job_info(self, job: str) -> JobInfo:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    async def requeue(self, job: str, exclude: Sequence[str] = ()) -> None:
        return None


def info(state: str, reason: str | None = None, nodes: tuple[str, ...] = ()) -> JobInfo:
    return JobInfo(job="7", state=state, nodes=nodes, excluded=(), restarts=1, reason=reason)


def executor(scheduler: Scheduler, state: ClusterState, deadline_s: float = 30.0) -> CheckpointRestart:
    async def publish(topic: str, payload: bytes) -> None:
        return None

    return CheckpointRestart(
        publish=publish,
        state=state,
        acks=AckBook(),
        scheduler=scheduler,  # type: ignore[arg-type]
        save_deadline_s=1,
        stop_deadline_s=1,
        resume_deadline_s=deadline_s,
        resume_poll_s=0.01,
    )


def requeued(exclude: list[str], *, at: float | None = None) -> ActionRecord:
    request = ActionRequest(kind=ActionKind.CHECKPOINT_RESTART, target="7", reason="xid 13")
    detail = {
        "ranks": [0],
        "runs": ["0"],
        "requeued": {"scheduler": "fake", "exclude": exclude},
        "in_place": not exclude,
        "requeued_at": time.time() if at is None else at,
        "waiting": WAITING,
    }
    return ActionRecord(id="act-1", request=request, state=ActionState.RUNNING, detail=detail)


def register(state: ClusterState, run: str, step: int | None) -> None:
    rank = RankInfo(rank=0, run=run, step=step)
    state.apply_presence("node-1", "7", JobPresence(node="node-1", job="7", ranks=[rank]))


def test_a_job_running_again_with_a_rank_of_the_new_run_has_resumed() -> None:
    state = ClusterState()
    register(state, "0", 40)  # the stopped run's rank is still listed: not the new run
    scheduler = Scheduler([info("PENDING", "Priority"), info("RUNNING", nodes=("node-1",))])
    restart = executor(scheduler, state)
    record = requeued([])

    async def go() -> dict[str, object]:
        task = asyncio.create_task(restart.run_phase(record, "resume"))
        await asyncio.sleep(0.1)
        assert not task.done()  # running, but only the old run's rank is there
        register(state, "1", 35)
        return await asyncio.wait_for(task, 5)

    out = asyncio.run(go())
    assert out["resumed_step"] == 35 and out["resumed_on"] == ["node-1"] and "state" not in out
    assert "waiting" not in record.detail


def test_a_job_that_ended_is_escalated_at_once_with_a_sentence() -> None:
    restart = executor(Scheduler([info("FAILED", "NonZeroExitCode", ("node-1",))]), ClusterState())
    record = requeued([])
    out = asyncio.run(asyncio.wait_for(restart.run_phase(record, "resume"), 5))
    assert out["state"] == "escalated"
    assert out["not_resumed"].startswith(
        "job 7 did not train again after ftd restarted it in place: it ended FAILED"
    )
    assert "(NonZeroExitCode) on node-1" in out["not_resumed"] and "no rank registered" in out["not_resumed"]


def test_the_deadline_counts_from_the_requeue_so_a_resumed_watch_never_extends_it() -> None:
    restart = executor(Scheduler([info("PENDING", "Resources")]), ClusterState(), deadline_s=60)
    record = requeued([], at=time.time() - 61)  # a coordinator restarted after the deadline
    out = asyncio.run(asyncio.wait_for(restart.run_phase(record, "resume"), 5))
    assert out["state"] == "escalated" and "it is still PENDING (Resources) 61 s after" in out["not_resumed"]


def test_a_job_moved_elsewhere_or_a_zero_deadline_is_not_followed() -> None:
    restart = executor(Scheduler([info("PENDING")]), ClusterState())
    assert asyncio.run(restart.run_phase(requeued(["node-1"]), "resume")) == {}
    off = executor(Scheduler([info("PENDING")]), ClusterState(), deadline_s=0)
    assert asyncio.run(off.run_phase(requeued([]), "resume")) == {}


def test_sentences() -> None:
    running = info("RUNNING", nodes=("node-1",))
    assert not_resumed("7", running, None, expect_ranks=True, waited_s=600).endswith(
        "it is RUNNING on node-1 but no rank registered 600 s after the requeue"
    )
    assert "could not say where it is 5 s after the requeue (scontrol: timeout)" in not_resumed(
        "7", None, "scontrol: timeout", expect_ranks=True, waited_s=5
    )
