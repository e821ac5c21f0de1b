"""The checkpoint-and-restart executor's waits in real time (moved from tests/unit, issue #31 item 11:
the inner loop has no wall-clock waits): two real ranks on a real local socket saving the step the
coordinator picked, a hung job's restart that must not wait its stop deadline, and a rank whose agent
restarts within the grace. The executor's fakes and records are the unit module's."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from ftd.client import Client
from ftd.events import Directive, Kind, NodeStatus, decode, make_event
from ftd.plugin.actions import ActionState
from tests.unit.helpers import until
from tests.unit.test_consistent_checkpoints import _NO_RANKS, JOB, Job, JobWhoseNodeDied, record


def two_ranks(
    socket_path: str, starts: dict[int, int], saved: dict[int, int], job: str
) -> list[threading.Thread]:
    """Two training loops of one job, ``starts`` steps apart (one rank 7 steps ahead of the other)."""

    def run(rank: int) -> None:
        client = Client(job=job, rank=rank, socket_path=socket_path, heartbeat_interval=0.02)
        try:
            step = starts[rank]
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                step += 1
                client.heartbeat(step)
                time.sleep(0.01)
                if client.should_save():
                    saved[rank] = step
                    client.ack_saved(step, f"/ckpt/{rank}/{step}")
                if client.should_stop():
                    break
        finally:
            client.close()

    threads = [threading.Thread(target=run, args=(rank,), daemon=True) for rank in starts]
    for thread in threads:
        thread.start()
    return threads


# (2, True): a margin of 2 steps is 20 ms of these 10 ms steps, far less than the presence report's
# lag and the directive's trip (CI's operator day: 5 steps of 0.1 s, ranks past the step, saves at 376
# and 377): the step is set that much further ahead, save_step_lead_s of the job's measured pace.
@pytest.mark.parametrize(("margin", "agree"), [(-1, False), (300, True), (2, True)])
async def test_live_ranks_save_one_step_when_the_coordinator_picks_it(
    tmp_path: Path, margin: int, agree: bool
) -> None:
    from tests.integration.test_plan_sequencing import JOB, NODE, PCI, cluster

    async with cluster(tmp_path, save_step_margin=margin, save_deadline_s=10.0) as env:
        saved: dict[int, int] = {}
        threads = two_ranks(env.socket_path, {0: 990, 1: 997}, saved, JOB)
        await until(lambda: len(env.coordinator.state.jobs.get(JOB, _NO_RANKS).ranks) == 2, 10)
        await until(lambda: (env.coordinator.state.jobs[JOB].last_step or 0) >= 1005, 10)
        await env.coordinator.engine.handle_event(make_event(NODE, Kind.XID, data={"code": 48, "pci": PCI}))
        assert await env.coordinator.engine.wait_idle(30)
        for thread in threads:
            thread.join(5)
        restart = next(
            r for r in await env.coordinator.ledger.actions() if r.request.kind == "checkpoint_restart"
        )
        if agree:  # the fix: one step on every rank, a success, resumed from that step
            assert saved[0] == saved[1] == restart.detail["save_at_step"], (saved, restart.detail)
            assert restart.state == ActionState.SUCCEEDED, restart.detail
            assert restart.detail["resume_step"] == saved[0]
        else:  # saving at once (the old behaviour): different steps, never called a success
            assert saved[0] != saved[1], saved
            assert restart.state == ActionState.ESCALATED, restart.detail
            assert restart.detail["save_steps_differ"] == {"0": saved[0], "1": saved[1]}
            assert restart.detail["resume_step"] == min(saved.values())


class HungJob(Job):
    """Both ranks hang (a SIGSTOPped rank and its peer stuck in the collective): a stop never makes
    them leave."""

    async def publish(self, topic: str, payload: bytes) -> None:
        directive = decode(payload, Directive)
        if directive not in self.directives:
            self.directives.append(directive)


async def test_a_hung_job_restarted_on_a_verdict_does_not_wait_the_stop_deadline_for_its_ranks() -> None:
    # ftd bench culprit: 30 s of a hung job's 37 s recovery were this wait for ranks that cannot stop.
    job = HungJob(steps={}, beats={0: 10, 1: 10})
    executor = job.executor()
    executor.stop_deadline_s = 3600.0
    async with asyncio.timeout(30):
        detail = await executor(record(save=False, no_save_reason="hung", hang_verdict="culprit"))
    assert detail["stopped"] is False and "restart ends them" in detail["stop_not_awaited"]
    assert detail.get("state") != "escalated" and job.scheduler.jobs[JOB].restarts == 1
    # a hang the rule chose to stop, not restart: the stop is waited for (and escalated if it fails)
    job = HungJob(steps={}, beats={0: 10, 1: 10})
    executor = job.executor()
    detail = await executor(record(save=False, no_save_reason="hung", hang_verdict="unknown", requeue=False))
    assert detail["stopped"] is False and detail["state"] == "escalated" and "stop_not_awaited" not in detail


class JobWhoseAgentRestarts(JobWhoseNodeDied):
    """node-2's agent stops cleanly (a restart) as the save goes out: it is coming back."""

    async def publish(self, topic: str, payload: bytes) -> None:
        directive = decode(payload, Directive)
        if directive in self.directives:
            return
        self.directives.append(directive)
        if directive.action == "save":
            self.state.apply_status(NodeStatus(node="node-2", state="stopped", ts=time.time()))


async def test_a_rank_whose_agent_restarts_or_left_within_the_grace_is_still_waited_for() -> None:
    for job in (
        JobWhoseAgentRestarts(steps={}, beats={0: 10, 1: 10}),
        JobWhoseNodeDied(steps={}, beats={0: 10, 1: 10}),
    ):
        executor = job.executor()
        executor.save_deadline_s = 1.0
        executor.save_rank_lost_grace_s = 0.2
        executor.last_will_grace_s = 3600.0  # a Last Will this recent may be a network blip
        async with asyncio.timeout(30):
            detail = await executor(record())
        assert "save_ranks_gone" not in detail, detail  # the whole save deadline was given
        assert detail["save_missing"] == [0, 1]
