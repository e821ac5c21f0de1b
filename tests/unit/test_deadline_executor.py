"""checkpoint_restart against an interruption's deadline (issue #37): the real time left bounds the
save and the stop, the decision picks the level or skips the save, and complete saves feed the model."""

from __future__ import annotations

import time

from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.checkpoint_restart import CheckpointRestart
from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.coordinator.model.save_times import SaveTimes
from ftd.coordinator.model.state import ClusterState
from ftd.events import Ack, Directive, JobPresence, RankInfo, decode
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState


class _Job:
    """One job of one rank on n1 whose rank acks every save at once and leaves on a stop."""

    def __init__(self, times: SaveTimes) -> None:
        self.state = ClusterState()
        info = RankInfo(rank=0, step=10)
        self.state.apply_presence("n1", "7", JobPresence(job="7", node="n1", ranks=[info]))
        self.directives: list[Directive] = []
        self.scheduler = FakeScheduler()
        self.scheduler.add_job("7", ["n1"])
        self.acks = AckBook()
        self.executor = CheckpointRestart(
            publish=self.publish,
            state=self.state,
            acks=self.acks,
            scheduler=self.scheduler,
            save_deadline_s=600,
            stop_deadline_s=600,
            resume_deadline_s=0,
            save_times=times,
            stop_margin_s=5.0,
        )

    async def publish(self, topic: str, payload: bytes) -> None:
        directive = decode(payload, Directive)
        self.directives.append(directive)
        if directive.action == "save":
            self.acks.record(Ack(directive_id=directive.id, job="7", rank=0, node="n1", step=11, path="/c"))
        if directive.action == "stop":
            self.state.apply_presence("n1", "7", None)

    async def run(self, **params: object) -> dict[str, object]:
        request = ActionRequest(
            kind=ActionKind.CHECKPOINT_RESTART, target="7", reason="interruption", params=dict(params)
        )
        return await self.executor(ActionRecord(id="act-1", request=request, state=ActionState.RUNNING))


async def test_enough_time_saves_the_usual_way_within_the_real_time_left_and_records_it() -> None:
    times = SaveTimes()
    job = _Job(times)
    deadline = time.time() + 200
    detail = await job.run(deadline=deadline)
    save, stop = job.directives
    assert (save.action, stop.action) == ("save", "stop")
    assert "level" not in save.params  # the job's own level: time enough for it
    assert save.deadline_s is not None and 190 <= save.deadline_s <= 195  # time left less the margin
    assert stop.deadline_s is not None and stop.deadline_s <= 200
    assert detail["deadline_decision"]["choice"] == "full"  # type: ignore[index]
    assert times.stats("7")["default"].count == 1
    assert job.scheduler.jobs["7"].restarts == 1  # requeued after the planned interruption


async def test_only_the_fast_level_fits() -> None:
    times = SaveTimes()
    for _ in range(5):
        times.record("7", "shared", 100.0)
        times.record("7", "local", 4.0)
    job = _Job(times)
    detail = await job.run(deadline=time.time() + 30, save_level="shared")
    save = job.directives[0]
    assert save.action == "save" and save.params["level"] == "local"
    assert detail["deadline_decision"]["choice"] == "fast"  # type: ignore[index]


async def test_no_save_fits_stops_at_once_and_says_why() -> None:
    job = _Job(SaveTimes())
    detail = await job.run(deadline=time.time() + 8)
    assert [d.action for d in job.directives] == ["stop"]
    assert "last verified checkpoint" in str(detail["save_skipped"])
    assert detail["resume_from_step"] is None  # this job reported no verified checkpoint
    assert detail["deadline_decision"]["choice"] == "none"  # type: ignore[index]


async def test_a_bogus_deadline_is_refused_and_the_usual_save_runs() -> None:
    job = _Job(SaveTimes())
    detail = await job.run(deadline=time.time() - 30)
    assert "in the past" in str(detail["deadline_refused"]) and "deadline_decision" not in detail
    save = job.directives[0]
    assert save.action == "save" and save.deadline_s == 600  # the configured deadline, as without one


async def test_the_job_view_shows_the_recorded_save_times() -> None:
    from ftd.coordinator.api.views import jobs_out

    job = _Job(SaveTimes())
    job.executor.save_times = job.state.save_times  # as wired: the model lives in the cluster state
    assert jobs_out(job.state, [])[0].save_times == {}
    await job.run(deadline=time.time() + 200, save_level="shared", stop=False)  # the job stays
    shown = jobs_out(job.state, [])
    assert [j.id for j in shown] == ["7"]
    assert set(shown[0].save_times) == {"shared"} and shown[0].save_times["shared"]["count"] == 1


async def test_no_save_names_the_step_the_job_will_resume_from() -> None:
    from ftd.events import Kind, Severity, make_event

    job = _Job(SaveTimes())
    data = {
        "job": "7",
        "rank": 0,
        "shard_rank": 0,
        "step": 40,
        "level": "shared",
        "ok": True,
        "world_size": 1,
    }
    job.state.apply_event(
        make_event("n1", Kind.CHECKPOINT, severity=Severity.INFO, source="agent", data=data)
    )
    detail = await job.run(deadline=time.time() + 6)
    assert detail["resume_from_step"] == 40 and "(step 40)" in str(detail["save_skipped"])
