"""Consistent checkpoints (issue #10 item 5): the coordinator picks the step, ranks agree on it
without collectives, differing acked steps are escalated (never succeeded) and the restart resumes
from the newest step every rank has."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftd.agent.local_api import LocalApi
from ftd.client import Client
from ftd.config import check_relations, validate_data
from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.checkpoint_restart import (
    MAX_LEAD_STEPS,
    CheckpointRestart,
    resume_step,
    save_at_step,
    save_level,
    steps_in,
)
from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.coordinator.model.state import ClusterState
from ftd.events import Ack, Directive, JobPresence, NodeStatus, RankInfo, StepTiming, decode
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState
from ftd.plugin.view import JobRecord
from tests.unit.helpers import until

JOB = "77"
_NO_RANKS = JobRecord("none")


def test_a_save_before_a_stop_asks_for_the_fast_level_unless_told_otherwise() -> None:
    assert save_level({}, stop=True) == "local"
    assert save_level({}, stop=False) is None  # a save-only action: the tier's own schedule stands
    assert save_level({"save_level": "shared"}, stop=True) == "shared"
    assert save_level({"save_level": "partner"}, stop=False) == "partner"
    assert save_level({"save_level": "tape"}, stop=True) == "local"  # not a level: ignored
    assert save_level({"save_level": 3}, stop=False) is None


def test_save_at_step_is_margin_steps_past_the_furthest_rank() -> None:
    ranks = [RankInfo(rank=0, step=990), RankInfo(rank=1, step=1000), RankInfo(rank=2)]
    assert save_at_step(ranks, 5) == 1005
    assert save_at_step(ranks, 0) == 1000
    assert save_at_step(ranks, -1) is None  # configured off: save at once
    assert save_at_step([RankInfo(rank=0)], 5) is None  # no step reported yet: save at once
    assert save_at_step(ranks, 5, lead_s=1.5) == 1005  # no timing reported: the margin alone


def paced(rank: int, step: int, step_s: float, steps: int = 100) -> RankInfo:
    return RankInfo(rank=rank, step=step, timing=StepTiming(steps=steps, step_s=step_s * steps))


def test_fast_steps_put_the_save_step_lead_s_of_training_ahead() -> None:
    # CI's operator day: 0.1 s steps, a margin of 5 (0.5 s), and the ranks passed the step before the
    # directive came. 1.5 s at the fastest rank's 0.1 s per step is 15 steps.
    ranks = [paced(0, 370, 0.1), paced(1, 369, 0.12)]
    assert save_at_step(ranks, 5, lead_s=1.5) == 385
    assert save_at_step(ranks, 5, lead_s=0.0) == 375  # lead off: the margin as before
    assert save_at_step([paced(0, 370, 2.0), paced(1, 370, 2.0)], 5, lead_s=1.5) == 375  # slow steps
    assert save_at_step([paced(0, 370, 0.1)], 5, lead_s=1.5) == 375  # one rank: nobody to agree with
    assert save_at_step(ranks, -1, lead_s=1.5) is None  # save at once stays at once
    # counters that cannot be: no steps timed, no time, or an absurd pace
    assert steps_in([RankInfo(rank=0, timing=StepTiming(steps=0, step_s=0.0))], 1.5) == 0
    assert steps_in([RankInfo(rank=0, timing=StepTiming(steps=5, step_s=0.0))], 1.5) == 0
    assert steps_in([paced(0, 1, 1e-12)], 1.5) == MAX_LEAD_STEPS


@given(
    st.lists(
        st.tuples(st.integers(0, 10**6), st.floats(1e-4, 100.0), st.integers(1, 10**5)),
        min_size=1,
        max_size=8,
    ),
    st.integers(0, 50),
    st.floats(0.0, 30.0),
)
def test_the_save_step_covers_the_lead_at_the_fastest_pace(
    ranks: list[tuple[int, float, int]], margin: int, lead_s: float
) -> None:
    infos = [paced(i, step, pace, steps) for i, (step, pace, steps) in enumerate(ranks)]
    target = save_at_step(infos, margin, lead_s)
    assert target is not None
    ahead = target - max(step for step, _, _ in ranks)
    fastest = min(info.timing.step_s / info.timing.steps for info in infos if info.timing)
    assert ahead >= margin
    if len(infos) > 1:
        assert ahead == MAX_LEAD_STEPS or ahead * fastest >= lead_s * (1 - 1e-9)
    else:
        assert ahead == margin
    assert ahead <= max(margin, MAX_LEAD_STEPS)


@given(st.dictionaries(st.integers(0, 64), st.integers(0, 10**6), min_size=1))
def test_resume_step_is_the_newest_step_every_rank_has(acked: dict[int, int]) -> None:
    step = resume_step(dict(acked))
    assert step == min(acked.values())
    assert all(s >= step for s in acked.values())


def test_resume_step_is_unknown_when_a_rank_acked_no_step() -> None:
    assert resume_step({0: 996, 1: None}) is None
    assert resume_step({}) is None


class Job:
    """A job of two ranks on two nodes, answering the save with the given steps and then leaving."""

    def __init__(self, steps: dict[int, int], beats: dict[int, int]) -> None:
        self.state = ClusterState()
        for rank in (0, 1):
            node = f"node-{rank + 1}"
            info = RankInfo(rank=rank, step=beats[rank])
            self.state.apply_presence(node, JOB, JobPresence(job=JOB, node=node, ranks=[info]))
        self.acks = AckBook()
        self.steps = steps
        self.directives: list[Directive] = []
        self.scheduler = FakeScheduler()
        self.scheduler.add_job(JOB, ["node-1", "node-2"])

    async def publish(self, topic: str, payload: bytes) -> None:
        directive = decode(payload, Directive)
        if directive in self.directives:
            return  # the same directive to the second node
        self.directives.append(directive)
        if directive.action == "save":
            for rank, step in self.steps.items():
                node = f"node-{rank + 1}"
                self.acks.record(Ack(directive_id=directive.id, job=JOB, rank=rank, node=node, step=step))
        elif directive.action == "stop":
            for rank in (0, 1):
                self.state.apply_presence(f"node-{rank + 1}", JOB, None)

    def executor(self) -> CheckpointRestart:
        return CheckpointRestart(
            publish=self.publish,
            state=self.state,
            acks=self.acks,
            scheduler=self.scheduler,
            save_deadline_s=2,
            stop_deadline_s=2,
            save_step_margin=5,
        )


def record(kind: str = ActionKind.CHECKPOINT_RESTART, **params: object) -> ActionRecord:
    request = ActionRequest(kind=kind, target=JOB, reason="xid 48", params={"exclude": ["node-2"], **params})
    return ActionRecord(id="act-1", request=request, state=ActionState.RUNNING)


async def test_ranks_that_acked_different_steps_escalate_and_resume_from_the_oldest() -> None:
    job = Job(steps={0: 996, 1: 1003}, beats={0: 990, 1: 991})
    detail = await job.executor()(record())
    assert detail["state"] == "escalated"  # never "succeeded"
    assert detail["save_steps_differ"] == {"0": 996, "1": 1003}
    assert detail["save_step"] == [996, 1003]
    assert detail["resume_step"] == 996
    assert detail["requeued"] == {"scheduler": "fake", "exclude": ["node-2"]}
    assert detail["stopped_at"] <= detail["requeued_at"]
    save = job.directives[0]
    # 991 + margin 5, at the fast level (the job stops after the save, issue #34)
    assert save.action == "save" and save.params == {"save_at_step": 996, "level": "local"}
    stop = job.directives[1]
    assert stop.action == "stop" and stop.params == {"resume_step": 996}  # the trainer is told
    assert job.scheduler.jobs[JOB].restarts == 1


async def test_ranks_that_acked_the_same_step_succeed_and_resume_from_it() -> None:
    job = Job(steps={0: 996, 1: 996}, beats={0: 990, 1: 991})
    detail = await job.executor()(record())
    assert "state" not in detail and "save_steps_differ" not in detail
    assert detail["save_step"] == 996 and detail["resume_step"] == 996
    assert job.directives[1].params == {"resume_step": 996}


async def test_a_crash_loop_backoff_delays_the_requeue_as_the_rule_asked() -> None:
    job = Job(steps={0: 7, 1: 7}, beats={0: 1, 1: 1})
    detail = await job.executor()(record(delay_s=0.05))
    assert detail["requeued"]["delayed_s"] == 0.05 and job.scheduler.jobs[JOB].restarts == 1


async def test_a_save_only_checkpoint_with_differing_steps_is_escalated_too() -> None:
    job = Job(steps={0: 5, 1: 6}, beats={0: 1, 1: 1})
    detail = await job.executor()(record(ActionKind.CHECKPOINT))
    assert detail["state"] == "escalated" and detail["save_steps_differ"] == {"0": 5, "1": 6}
    assert [d.action for d in job.directives] == ["save"]  # no stop, no requeue
    assert job.scheduler.jobs[JOB].restarts == 0


# --- the client: save at the first step >= save_at_step -------------------------------------------


@pytest.fixture
def clients() -> Iterator[list[Client]]:
    made: list[Client] = []
    yield made
    for client in made:
        client.close()


def save_directive(save_at: int | None) -> Directive:
    params = {} if save_at is None else {"save_at_step": save_at}
    return Directive(id=f"save-{save_at}", ts=time.time(), action="save", job="j1", params=params)


async def test_ranks_at_different_steps_save_the_same_step_without_talking(
    api: LocalApi, clients: list[Client]
) -> None:
    ahead = Client(job="j1", rank=0, socket_path=api.socket_path)
    behind = Client(job="j1", rank=1, socket_path=api.socket_path)
    clients.extend([ahead, behind])
    await until(lambda: ahead.connected and behind.connected)
    ahead.heartbeat(8)
    behind.heartbeat(3)
    await api.deliver(save_directive(10))
    await until(lambda: ahead.save_directive_pending and behind.save_directive_pending)
    saved: dict[int, int] = {}
    for rank_client, start in ((ahead, 8), (behind, 3)):
        for step in range(start, 20):
            rank_client.heartbeat(step)
            if rank_client.should_save():
                saved[rank_client.rank] = step
                rank_client.ack_saved(step, f"/ckpt/{step}")
                break
    assert saved == {0: 10, 1: 10}
    assert not ahead.should_save() and not behind.should_save()


async def test_a_rank_past_the_step_or_a_local_trigger_saves_at_once(
    api: LocalApi, clients: list[Client]
) -> None:
    client = Client(job="j1", rank=0, socket_path=api.socket_path)
    clients.append(client)
    await until(lambda: client.connected)
    client.heartbeat(12)
    await api.deliver(save_directive(10))
    await until(lambda: client.save_directive_pending)
    assert client.should_save()  # already past 10: at once
    client.ack_saved(12)
    client.heartbeat(13)
    await api.deliver(save_directive(50))
    await until(lambda: client.save_directive_pending)
    assert not client.should_save()
    client.request_save("signal")  # SIGUSR1 does not wait for step 50
    assert client.should_save()
    client.ack_saved(13)
    await api.deliver(save_directive(None))  # no step asked: at once
    await until(lambda: client.save_directive_pending)
    assert client.should_save()


async def test_the_stop_tells_the_client_which_step_to_resume_from(
    api: LocalApi, clients: list[Client]
) -> None:
    client = Client(job="j1", rank=0, socket_path=api.socket_path)
    clients.append(client)
    await until(lambda: client.connected)
    assert client.resume_step is None
    stop = Directive(id="stop-1", ts=time.time(), action="stop", job="j1", params={"resume_step": 996})
    await api.deliver(stop)
    await until(client.should_stop)
    assert client.resume_step == 996


async def test_the_resume_step_reaches_the_jobs_next_process_through_the_resume_file(
    api: LocalApi, clients: list[Client], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    resume_file = tmp_path / "job-77.resume"
    monkeypatch.setenv("FTD_RESUME_FILE", str(resume_file))
    first = Client(job="j1", rank=0, socket_path=api.socket_path)
    clients.append(first)
    await until(lambda: first.connected)
    assert first.resume_step is None and not resume_file.exists()
    stop = Directive(id="stop-2", ts=time.time(), action="stop", job="j1", params={"resume_step": 996})
    await api.deliver(stop)
    await until(first.should_stop)
    assert resume_file.read_text() == "996\n"
    first.close()
    restarted = Client(job="j1", rank=0, socket_path=api.socket_path, connect=False)  # the requeued job
    assert restarted.resume_step == 996
    resume_file.write_text("garbage")
    assert Client(job="j1", connect=False).resume_step is None  # unreadable: none, never an error


# --- live: the real coordinator and agent, two ranks on the real client, no collectives ------------


# --- a rank that died cannot ack: the save wait ends after a short grace (issue #31 item 8) ---------


class JobWithADeadRank(Job):
    """Rank 1's process is killed as the save goes out: its agent drops it from the job's presence and
    it never acks; rank 0 waits in a collective for it and never reaches the save step either."""

    async def publish(self, topic: str, payload: bytes) -> None:
        directive = decode(payload, Directive)
        if directive in self.directives:
            return
        self.directives.append(directive)
        if directive.action == "save":
            self.state.apply_presence("node-2", JOB, None)  # rank 1's connection closed: it is gone
        elif directive.action == "stop":
            self.state.apply_presence("node-1", JOB, None)


async def test_a_rank_gone_mid_save_ends_the_wait_after_the_grace_not_the_deadline() -> None:
    # ``ftd bench recovery`` (rank_killed): the coordinator waited the whole save deadline for a dead
    # rank's ack -- 31-33 s against torchrun's 9-15 s. With an hour's deadline this test would hang.
    job = JobWithADeadRank(steps={}, beats={0: 10, 1: 10})
    executor = job.executor()
    executor.save_deadline_s = 3600.0
    executor.save_rank_lost_grace_s = 0.2
    async with asyncio.timeout(30):
        detail = await executor(record())
    assert detail["save_ranks_gone"] == [1]
    assert detail["save_missing"] == [0, 1]
    assert detail["state"] == "escalated"  # no checkpoint of one step: never a success
    assert [d.action for d in job.directives] == ["save", "stop"]
    assert detail["stopped"] is True and job.scheduler.jobs[JOB].restarts == 1


async def test_within_the_grace_a_surviving_ranks_late_ack_still_counts() -> None:
    job = JobWithADeadRank(steps={}, beats={0: 10, 1: 10})
    executor = job.executor()
    executor.save_deadline_s = 3600.0
    executor.save_rank_lost_grace_s = 5.0

    async def late_ack() -> None:
        await until(lambda: bool(job.directives))
        await asyncio.sleep(0.1)
        job.acks.record(Ack(directive_id=job.directives[0].id, job=JOB, rank=0, node="node-1", step=15))

    acker = asyncio.create_task(late_ack())
    async with asyncio.timeout(30):
        detail = await executor(record())
    await acker
    assert detail["saved"] == {"0": {"step": 15, "path": None}}
    assert detail["save_missing"] == [1] and detail["save_ranks_gone"] == [1]


class JobWhoseRanksAllDied(Job):
    """Every rank left its agent as the save went out (the survivors' collective failed with the
    killed rank and their processes ended too): nobody is left to ack."""

    async def publish(self, topic: str, payload: bytes) -> None:
        directive = decode(payload, Directive)
        if directive in self.directives:
            return
        self.directives.append(directive)
        if directive.action == "save":
            self.state.apply_presence("node-1", JOB, None)
            self.state.apply_presence("node-2", JOB, None)


async def test_when_every_silent_rank_is_gone_the_save_wait_ends_without_the_grace() -> None:
    job = JobWhoseRanksAllDied(steps={}, beats={0: 10, 1: 10})
    executor = job.executor()
    executor.save_deadline_s = 3600.0
    executor.save_rank_lost_grace_s = 3600.0  # only ranks still present get the grace
    async with asyncio.timeout(30):
        detail = await executor(record())
    assert detail["save_ranks_gone"] == [0, 1] and detail["save_missing"] == [0, 1]
    assert detail["state"] == "escalated" and job.scheduler.jobs[JOB].restarts == 1


class JobWhoseNodeDied(Job):
    """node-2 is killed with its agent as the save goes out (the checkpoint bench's kill case): its
    Last Will marks it offline, but its rank's presence stays retained on the bus."""

    async def publish(self, topic: str, payload: bytes) -> None:
        directive = decode(payload, Directive)
        if directive in self.directives:
            return
        self.directives.append(directive)
        if directive.action == "save":
            self.state.apply_status(NodeStatus(node="node-2", state="offline", ts=time.time()))
        elif directive.action == "stop":
            self.state.apply_presence("node-1", JOB, None)


async def test_a_rank_whose_node_went_offline_is_gone_for_the_save_and_the_stop() -> None:
    job = JobWhoseNodeDied(steps={}, beats={0: 10, 1: 10})
    job.state.apply_status(NodeStatus(node="node-1", state="online", ts=1.0))
    job.state.apply_status(NodeStatus(node="node-2", state="online", ts=1.0))
    executor = job.executor()
    executor.save_deadline_s = executor.stop_deadline_s = 3600.0  # with the old wait: an hour each
    executor.save_rank_lost_grace_s = 0.2
    executor.last_will_grace_s = 0.0  # the Last Will's grace (10 s by default) already over
    async with asyncio.timeout(30):
        detail = await executor(record())
    assert detail["save_ranks_gone"] == [1] and detail["save_missing"] == [0, 1]
    assert detail["stopped"] is True and job.scheduler.jobs[JOB].restarts == 1
    assert JOB in job.state.jobs and 1 in job.state.jobs[JOB].ranks  # its presence is still there


def test_a_lead_at_or_past_the_save_deadline_is_refused_with_its_path() -> None:
    problems = check_relations({"coordinator": {"save_step_lead_s": 200.0}})
    assert [p.path for p in problems] == ["coordinator.save_step_lead_s"]
    assert "save_deadline_s (120.0, the default)" in problems[0].message
    problems = check_relations({"coordinator": {"save_deadline_s": 1.0}})  # only the deadline set
    assert [p.path for p in problems] == ["coordinator.save_deadline_s"]
    assert check_relations({"coordinator": {"save_step_lead_s": 2.0, "save_deadline_s": 30.0}}) == []
    # an option already wrong on its own gets its own problem, not the rule's as well
    assert [p.message for p in validate_data({"coordinator": {"save_deadline_s": -5}})] == [
        "must be > 0, got -5"
    ]
