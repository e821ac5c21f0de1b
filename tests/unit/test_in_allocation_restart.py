"""checkpoint_restart inside the allocation (issue #24): a job run by rank supervisors (``ftd run``) with
three training slots and hot spares. The agents' side is played by :class:`Cluster`: each supervisor
answers a ``restart`` directive the way the contract says (a slot node starts the generation's ranks
and reports it running, an out node stops, a spare stays idle), or fails, is lost, stays silent, or
its node gets drained meanwhile, per node. The real-Slurm run is the bench (``ftd bench recovery``)."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from ftd.client.protocol import generation_run
from ftd.config import Config
from ftd.config.schema import CoordinatorConfig
from ftd.coordinator.actions import ExecutorContext, build_executors
from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.checkpoint_restart import CheckpointRestart
from ftd.coordinator.actions.directive import node_sender
from ftd.coordinator.actions.drain import DrainNode
from ftd.coordinator.actions.scheduler import FakeScheduler, JobInfo
from ftd.coordinator.decide.engine import Engine
from ftd.coordinator.decide.plugins import make_plugin_manager
from ftd.coordinator.decide.policy import PolicyGate
from ftd.coordinator.ledger.sqlite import Ledger, SqliteStore
from ftd.coordinator.ledger.store import LedgerUnavailable
from ftd.coordinator.model.state import ClusterState
from ftd.events import (
    Ack,
    Directive,
    JobPresence,
    Kind,
    NodeStatus,
    RankInfo,
    Severity,
    SupervisorInfo,
    decode,
    make_event,
)
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState
from ftd.rules import xid_catalog
from ftd.supervisor import cli as run_cmd
from ftd.supervisor.assignment import Options, Restart, parse_restart, rank_env
from ftd.testing import evaluate_rule
from tests.unit.helpers import supervisor_info

JOB = "51200"
RUN = "slurm-restart-0"  # every supervisor's own run (the job's first run under Slurm)
SLOTS = ("n0", "n1", "n2")


def sup(
    role: str = "active",
    slot: int | None = None,
    gen: int = 0,
    state: str = "running",
    preflight: str | None = "ok",
    reason: str = "",
    addr: str = "",
    run: str = RUN,
) -> SupervisorInfo:
    return supervisor_info(
        role,
        slot,
        gen,
        state,
        nodes=len(SLOTS),
        run=run,
        nproc=1,
        addr=addr,
        preflight=preflight,
        reason=reason,
    )


class Scheduler:
    name = "fake"

    def __init__(self) -> None:
        self.requeues: list[list[str]] = []

    async def job_info(self, job: str) -> JobInfo:
        return JobInfo(job=job, state="RUNNING", nodes=SLOTS, excluded=(), restarts=0, required=())

    async def requeue(self, job: str, exclude: Sequence[str] = ()) -> None:
        self.requeues.append(list(exclude))


class Cluster:
    """The coordinator's picture of job 51200 and the agents' answers to its restart directives."""

    def __init__(self, spares: dict[str, str | None] | None = None) -> None:
        spares = {"s1": "ok"} if spares is None else spares
        self.state = ClusterState()
        for node in (*SLOTS, *spares):
            self.state.apply_status(NodeStatus(node=node, state="online", ts=1.0))
        for index, node in enumerate(SLOTS):
            self.set(node, sup(slot=index, addr=f"{node}.ib"))
        for node, preflight in spares.items():
            self.set(node, sup(role="spare", state="idle", preflight=preflight, addr=f"{node}.ib"))
        self.sent: list[tuple[str, Directive]] = []
        self.behaviour: dict[str, str] = {}  # node -> ok (default) | fail | lost | silent | drained | crash
        self.answering = True

    def set(self, node: str, info: SupervisorInfo, ranks: Sequence[RankInfo] = ()) -> None:
        presence = JobPresence(node=node, job=JOB, ranks=list(ranks), supervisor=info)
        self.state.apply_presence(node, JOB, presence)

    async def publish(self, topic: str, payload: bytes) -> None:
        directive = decode(payload, Directive)
        node = topic.split("/")[3]  # ftd/v1/nodes/{node}/directives/jobs
        self.sent.append((node, directive))
        if directive.action == "restart" and self.answering:
            self.answer(node, directive)

    def answer(self, node: str, directive: Directive) -> None:
        params = directive.params
        generation, slots = params["generation"], params["slots"]
        current = self.state.jobs[JOB].supervisors[node]
        if generation <= current.generation:
            return  # a generation it already acted on: ignored (the contract's idempotence)
        how = self.behaviour.get(node, "ok")
        if how == "silent":
            return
        if how == "drained":  # a second fault: the node is drained while the restart waits
            self.state.mark_drained(node, "xid 79")
            return
        if how == "crash" and node in slots:  # its new ranks start, then exit 1 (an application fault)
            self.set(node, sup(slot=slots.index(node), gen=generation, state="exited"))
            return
        if how == "lost":
            self.set(node, msgspec.structs.replace(current, state="lost"))
            return
        if node in slots:
            slot = slots.index(node)
            if how == "fail":
                reason = "preflight failed: 7 of 8 GPUs"
                self.set(
                    node, sup(slot=slot, gen=generation, state="failed", preflight="failed", reason=reason)
                )
                return
            step = (params.get("resume_step") or 0) + 1
            rank = RankInfo(rank=slot, run=generation_run(RUN, generation), step=step)
            self.set(node, sup(slot=slot, gen=generation, addr=current.addr), [rank])
        elif node in params["out"]:
            self.set(node, sup(role="out", gen=current.generation, state="stopped", addr=current.addr))

    def agents_answer(self, restart: CheckpointRestart) -> None:
        """The agents and ranks answer ``restart``'s save (every rank acks the asked step) and stop
        (the ranks leave; the supervisor stays, stopped), besides the restart directives."""
        acks = AckBook()
        restart._acks = acks
        plain = self.publish

        async def agents(topic: str, payload: bytes) -> None:
            await plain(topic, payload)
            directive = decode(payload, Directive)
            node = topic.split("/")[3]
            if directive.action == "save":
                at = directive.params["save_at_step"]
                for rank in self.state.jobs[JOB].ranks_by_node.get(node, []):
                    acks.record(Ack(directive_id=directive.id, job=JOB, rank=rank.rank, node=node, step=at))
            elif directive.action == "stop":
                info = self.state.jobs[JOB].supervisors[node]
                self.set(node, msgspec.structs.replace(info, state="stopped"))

        self.publish = agents  # type: ignore[method-assign]
        restart._publish = agents
        restart.in_allocation._publish = agents

    def restarts(self) -> list[tuple[str, str]]:
        """(node, directive id) of every restart directive sent, in order."""
        return [(node, d.id) for node, d in self.sent if d.action == "restart"]


def executor(cluster: Cluster, scheduler: Scheduler | None = None, **kw: Any) -> CheckpointRestart:
    restart = CheckpointRestart(
        publish=cluster.publish,
        state=cluster.state,
        acks=AckBook(),
        scheduler=scheduler or Scheduler(),  # type: ignore[arg-type]
        save_deadline_s=1,
        stop_deadline_s=1,
        resume_deadline_s=kw.pop("resume_deadline_s", 10.0),
        restart_deadline_s=kw.pop("restart_deadline_s", 10.0),
        resume_poll_s=0.01,
        **kw,
    )
    restart.in_allocation.poll_s = 0.01
    return restart


def request(**params: Any) -> ActionRecord:
    req = ActionRequest(kind=ActionKind.CHECKPOINT_RESTART, target=JOB, reason="xid 79 on n1", params=params)
    record = ActionRecord(id="act-7", request=req, state=ActionState.RUNNING)
    record.detail["resume_step"] = 100  # what the save phase agreed on (the ranks are gone already)
    return record


async def run(restart: CheckpointRestart, record: ActionRecord) -> dict[str, Any]:
    state = (await asyncio.wait_for(restart(record), 30)).get("state")  # every phase, as outside a plan
    return {**record.detail, **({"state": state} if state else {})}


async def test_a_spare_takes_the_excluded_nodes_slot_in_a_new_generation() -> None:
    cluster = Cluster()
    scheduler = Scheduler()
    detail = await run(executor(cluster, scheduler), request(exclude=["n1"]))
    assert detail["path"] == "spare" and detail["generation"] == 1
    assert detail["slots"] == ["n0", "s1", "n2"] and detail["out"] == ["n1"] and detail["spares_left"] == 0
    assert detail["swapped"] == {"n1": "s1"} and detail["requeued"] is None and scheduler.requeues == []
    # one restart directive, the same id, to every node with a supervisor of the job (once each)
    assert cluster.restarts() == [(n, "act-7-restart-g1") for n in ("n0", "n1", "n2", "s1")]
    params = cluster.sent[0][1].params
    assert params == {
        "generation": 1,
        "slots": ["n0", "s1", "n2"],
        "master_addr": "n0.ib",
        "resume_step": 100,
        "out": ["n1"],
        "path": "spare",
        "runs": {n: RUN for n in ("n0", "n1", "n2", "s1")},  # a supervisor of a later run ignores it
    }
    assert detail["running_generation"] == 1 and detail["resumed_step"] == 101
    assert detail["resumed_at"] >= detail["restarted_at"] and "waiting" not in detail
    assert "state" not in detail  # succeeded
    job = cluster.state.jobs[JOB]
    assert job.nodes == ["n0", "n2", "s1"] and job.spares == [] and job.slots == ["n0", "s1", "n2"]
    assert cluster.state.jobs_on_node("n1") == [] and job.generation == 1


async def test_the_save_and_stop_reach_the_training_nodes_only_then_the_spare_takes_over() -> None:
    """The whole action with generation 0's ranks registered: the save (at one step) and the stop go
    to the three training nodes, never to the spare; the restart carries the step they saved."""
    cluster = Cluster()
    for index, node in enumerate(SLOTS):
        rank = RankInfo(rank=index, run=generation_run(RUN, 0), step=93 + index)  # the furthest: 95
        cluster.set(node, sup(slot=index, addr=f"{node}.ib"), [rank])
    restart = executor(cluster)
    cluster.agents_answer(restart)
    record = request(exclude=["n1"])
    del record.detail["resume_step"]  # this time the save phase finds it
    detail = await run(restart, record)
    assert "state" not in detail, detail
    saves = sorted(n for n, d in cluster.sent if d.action == "save")
    stops = sorted(n for n, d in cluster.sent if d.action == "stop")
    assert saves == stops == list(SLOTS)  # never the spare
    assert detail["save_at_step"] == 100 and detail["resume_step"] == 100
    restarts = [d for _, d in cluster.sent if d.action == "restart"]
    assert {d.params["resume_step"] for d in restarts} == {100}
    assert detail["slots"] == ["n0", "s1", "n2"] and detail["resumed_step"] == 101


def rank_run_under_slurm(restart_count: int) -> tuple[str, str]:
    """(the supervisor's run, its generation-0 ranks' FTD_RUN) as ``ftd run`` works them out from the
    environment srun gives it in run ``restart_count`` of the job (SLURM_RESTART_COUNT)."""
    env = {"SLURM_NNODES": "4", "SLURM_JOB_ID": JOB, "SLURM_RESTART_COUNT": str(restart_count)}
    parser = argparse.ArgumentParser()
    run_cmd.add_arguments(parser)
    opts = run_cmd.options(parser.parse_args(["--spares", "1", "--", "python", "t.py"]), env)
    env0 = rank_env(opts, generation=0, slot=0, local_rank=0, master_addr="h", resume_step=None)
    return opts.run, env0["FTD_RUN"]


async def test_a_requeued_supervised_job_is_seen_training_again_under_its_new_run() -> None:
    """A job under ftd run requeued through the scheduler starts generation 0 again: its ranks' run
    must differ from the run ftd stopped, or the requeue's resume watch (ranks of another run) never
    sees the job train and escalates it. Reproduced: both runs were ``gen-0``."""
    old_base, old_run = rank_run_under_slurm(0)
    new_base, new_run = rank_run_under_slurm(1)
    assert old_run != new_run
    cluster = Cluster()
    for index, node in enumerate(SLOTS):
        rank = RankInfo(rank=index, run=old_run, step=100)
        cluster.set(node, sup(slot=index, addr=f"{node}.ib", run=old_base), [rank])

    class Requeuing(Scheduler):
        async def requeue(self, job: str, exclude: Sequence[str] = ()) -> None:
            await super().requeue(job, exclude)
            for index, node in enumerate(SLOTS):  # requeued in place: the same nodes, a new run
                rank = RankInfo(rank=index, run=new_run, step=101)
                cluster.set(node, sup(slot=index, run=new_base), [rank])

    restart = executor(cluster, Requeuing(), resume_deadline_s=2.0)
    cluster.agents_answer(restart)
    # A job-wide fault: requeued in place (nothing excluded), so the resume phase follows it.
    record = request(exclude=[], restart="requeue", restart_reason="the fabric is down")
    del record.detail["resume_step"]
    detail = await run(restart, record)
    assert detail["path"] == "requeue" and detail["runs"] == [old_run] and detail["in_place"] is True
    assert "state" not in detail, repr(detail)  # succeeded, not escalated
    assert detail["resumed_step"] == 101 and detail["resumed_on"] == list(SLOTS)


class Clientless:
    """The scheduler's signal convention for a job without the client: it must never be used for a
    job with rank supervisors (it would end the whole allocation)."""

    def __init__(self) -> None:
        self.calls = 0

    async def save_and_stop(self, job: str, *, stop: bool) -> dict[str, Any]:
        self.calls += 1
        return {"clientless": {"signalled": True}}


async def test_a_supervised_job_whose_ranks_ended_is_restarted_without_the_signal_fallback() -> None:
    cluster = Cluster()
    restart = executor(cluster)
    fallback = Clientless()
    restart.clientless = fallback  # type: ignore[assignment]
    detail = await run(restart, request(exclude=[]))
    assert fallback.calls == 0 and "clientless" not in detail
    assert detail["note"] == "no rank of this job is running: its rank supervisors restart it"
    assert detail["path"] == "in_place" and detail["running_generation"] == 1


async def test_an_application_fault_restarts_in_place_and_keeps_the_spare() -> None:
    cluster = Cluster()
    detail = await run(executor(cluster), request(exclude=[]))
    assert (detail["path"], detail["generation"], detail["slots"]) == ("in_place", 1, list(SLOTS))
    assert detail["out"] == [] and detail["spares_left"] == 1 and detail["swapped"] == {}
    assert cluster.state.jobs[JOB].spares == ["s1"]  # the spare heard the directive and stayed a spare
    assert detail["resumed_step"] == 101 and "state" not in detail


async def test_no_eligible_spare_requeues_through_the_scheduler_without_the_bad_node() -> None:
    cluster = Cluster(spares={"s1": "failed"})  # the only spare failed its preflight: never chosen
    scheduler = Scheduler()
    detail = await run(executor(cluster, scheduler), request(exclude=["n1"]))
    assert detail["path"] == "requeue" and scheduler.requeues == [["n1"]]
    assert detail["restart_why"].startswith("1 slot node(s) must be replaced (n1) but the allocation has 0")
    assert detail["requeued"] == {"scheduler": "fake", "exclude": ["n1"]} and cluster.restarts() == []


async def test_two_bad_slots_and_one_spare_requeue_excluding_both() -> None:
    cluster = Cluster()
    cluster.state.mark_drained("n2", "xid 79")  # a second node already bad when the path is chosen
    scheduler = Scheduler()
    detail = await run(executor(cluster, scheduler), request(exclude=["n1"]))
    assert detail["path"] == "requeue" and scheduler.requeues == [["n1", "n2"]]
    assert "2 slot node(s) must be replaced (n1, n2)" in detail["restart_why"]


async def test_a_job_wide_fault_asks_for_the_scheduler_even_with_spares() -> None:
    cluster = Cluster()
    scheduler = Scheduler()
    record = request(exclude=["n1"], restart="requeue", restart_reason="the whole fabric is down")
    detail = await run(executor(cluster, scheduler), record)
    assert detail["path"] == "requeue" and scheduler.requeues == [["n1"]] and cluster.restarts() == []
    assert detail["restart_why"] == "a scheduler requeue was asked: the whole fabric is down"


async def test_a_spare_that_failed_preflight_is_never_chosen() -> None:
    cluster = Cluster(spares={"s1": "failed", "s2": None, "s3": "ok"})  # s2: never preflighted
    detail = await run(executor(cluster), request(exclude=["n1"]))
    assert detail["slots"] == ["n0", "s3", "n2"] and detail["spares_left"] == 0


async def test_a_ledger_that_is_down_does_not_hold_the_restart_up() -> None:
    cluster = Cluster()
    restart = executor(cluster)
    tries: list[str] = []

    async def down(record: ActionRecord) -> None:
        tries.append(record.id)
        raise LedgerUnavailable("postgres: connection refused")

    restart.in_allocation.persist = down
    detail = await run(restart, request(exclude=["n1"]))
    assert tries == ["act-7"] and detail["running_generation"] == 1 and "state" not in detail


async def test_ranks_that_start_then_exit_are_no_reason_to_use_a_spare() -> None:
    cluster = Cluster()
    cluster.behaviour["n2"] = "crash"
    detail = await run(executor(cluster, resume_deadline_s=0.5), request(exclude=[]))
    assert detail["path"] == "in_place" and detail["running_generation"] == 1
    assert "restart_failures" not in detail and cluster.state.jobs[JOB].spares == ["s1"]
    # the other two slots' ranks report steps: the job trains again (n2's crash is a new incident)
    assert detail["resumed_step"] == 101


async def test_a_spare_never_preflighted_is_used_only_when_the_config_allows_it() -> None:
    scheduler = Scheduler()
    detail = await run(executor(Cluster(spares={"s1": None}), scheduler), request(exclude=["n1"]))
    assert detail["path"] == "requeue" and scheduler.requeues == [["n1"]]
    config = Config(coordinator=CoordinatorConfig(restart_unchecked_spares=True))
    cluster = Cluster(spares={"s1": None})
    context = ExecutorContext(
        config=config,
        state=cluster.state,
        acks=AckBook(),
        publish=cluster.publish,
        send_to_node=node_sender(cluster.publish),
        scheduler=None,
    )
    built = build_executors(context)[ActionKind.CHECKPOINT_RESTART]
    assert isinstance(built, CheckpointRestart) and built.in_allocation.allow_unchecked
    built.in_allocation.poll_s = 0.01
    detail = await run(built, request(exclude=["n1"]))
    assert detail["path"] == "spare" and detail["slots"] == ["n0", "s1", "n2"]


async def test_a_spare_failing_at_activation_gives_its_slot_to_the_next_spare_next_generation() -> None:
    cluster = Cluster(spares={"s1": "ok", "s2": "ok"})
    cluster.behaviour["s1"] = "fail"
    detail = await run(executor(cluster), request(exclude=["n1"]))
    assert detail["generation"] == 2 and detail["running_generation"] == 2
    assert detail["slots"] == ["n0", "s2", "n2"] and detail["out"] == ["n1", "s1"]
    assert detail["restart_failures"] == [
        {"generation": 1, "failed": {"s1": "its supervisor is failed: preflight failed: 7 of 8 GPUs"}}
    ]
    ids = sorted({d for _, d in cluster.restarts()})
    assert ids == ["act-7-restart-g1", "act-7-restart-g2"]
    assert detail["resumed_step"] == 101 and "state" not in detail


async def test_a_second_fault_during_the_restart_takes_another_spare() -> None:
    cluster = Cluster(spares={"s1": "ok", "s2": "ok"})
    cluster.behaviour["n2"] = "drained"  # Xid 79 on n2 while generation 1 starts: drained, silent
    detail = await run(executor(cluster), request(exclude=["n1"]))
    assert detail["generation"] == 2 and detail["slots"] == ["n0", "s1", "s2"]
    assert detail["restart_failures"] == [{"generation": 1, "failed": {"n2": "drained by ftd (xid 79)"}}]
    assert detail["spares_left"] == 0 and sorted(detail["out"]) == ["n1", "n2"]


async def test_a_slot_supervisor_lost_during_the_restart_moves_its_slot_and_the_master() -> None:
    cluster = Cluster()
    cluster.behaviour["n0"] = "lost"
    detail = await run(executor(cluster), request(exclude=[]))
    assert detail["path"] == "spare" and detail["generation"] == 2
    assert detail["slots"] == ["s1", "n1", "n2"]
    g2 = next(d for _, d in cluster.sent if d.id == "act-7-restart-g2")
    assert g2.params["master_addr"] == "s1.ib" and g2.params["out"] == ["n0"]


async def test_a_slot_that_stays_silent_past_the_deadline_is_replaced_and_without_spares_requeued() -> None:
    cluster = Cluster()
    cluster.behaviour["n2"] = "silent"
    scheduler = Scheduler()
    cluster.behaviour["s1"] = "silent"  # the spare that takes n2's slot stays silent too
    detail = await run(executor(cluster, scheduler, restart_deadline_s=0.5), request(exclude=[]))
    assert [f["generation"] for f in detail["restart_failures"]] == [1, 2]
    assert detail["restart_failures"][0]["failed"] == {
        "n2": "did not report generation 1 running within 0.5 s"
    }
    assert detail["path"] == "requeue" and scheduler.requeues == [["n2", "s1"]]
    assert detail["state"] == "escalated"  # the in-allocation restart did not work


async def test_a_supervisor_lost_before_the_restart_is_not_restarted_in_place() -> None:
    cluster = Cluster()
    cluster.set("n2", sup(slot=2, state="lost"))
    detail = await run(executor(cluster), request(avoid=["n2"]))  # what the supervisor rule asks
    assert detail["path"] == "spare" and detail["slots"] == ["n0", "n1", "s1"]


async def engine_over(cluster: Cluster, path: Path, restart: CheckpointRestart) -> Engine:
    """A coordinator's engine over the ledger at ``path`` (persisting mid-phase, as wiring does)."""
    pm = make_plugin_manager(entry_points=False, disabled=["xid_catalog"])
    engine = Engine(
        state=cluster.state,
        ledger=SqliteStore(Ledger(path)),
        gate=PolicyGate(),
        plugins=pm,
        executors={ActionKind.CHECKPOINT_RESTART: restart},
    )
    restart.in_allocation.persist = engine.ledger.save_action
    await engine.load()
    return engine


async def test_a_coordinator_killed_mid_restart_resumes_the_same_generation_once(tmp_path: Path) -> None:
    """The engine and the ledger of a real coordinator: killed while generation 1 starts (the
    supervisors have not answered), a new coordinator over the same ledger re-sends the same
    directive id for the same generation, and the action finishes once."""
    cluster = Cluster()
    cluster.answering = False
    path = tmp_path / "ledger.sqlite"

    first = await engine_over(cluster, path, executor(cluster))
    record = await first.submit(request(exclude=["n1"]).request)
    for _ in range(500):
        if cluster.restarts():
            break
        await asyncio.sleep(0.01)
    assert {d for _, d in cluster.restarts()} == {f"{record.id}-restart-g1"}
    await first.close()  # SIGKILL: the task dies mid-phase, the ledger keeps what was persisted
    await first.ledger.close()

    cluster.answering = True
    before = len(cluster.restarts())
    second = await engine_over(cluster, path, executor(cluster))
    [resumed] = await second.resume_unfinished()
    assert resumed.id == record.id
    assert await second.wait_idle(30)
    again = cluster.restarts()[before:]
    assert {d for _, d in again} == {f"{record.id}-restart-g1"}  # the same directive, no generation 2
    done = await second.ledger.action(record.id)
    assert done is not None and done.state == ActionState.SUCCEEDED, done.detail
    assert done.detail["phases_done"] == ["stop", "requeue", "restart", "resume"]
    assert done.detail["running_generation"] == 1 and done.detail["resumed"] == 1
    assert await second.ledger.unfinished() == []
    await second.close()
    await second.ledger.close()


async def test_a_retry_generation_survives_a_coordinator_kill(tmp_path: Path) -> None:
    """Generation 1 failed on its spare (s1) and generation 2 went out (to s2) when the coordinator
    died: the new coordinator resumes generation 2 (persisted before it was sent), never 1 or 3."""
    cluster = Cluster(spares={"s1": "ok", "s2": "ok"})
    cluster.behaviour.update(s1="fail", s2="silent")
    path = tmp_path / "ledger.sqlite"
    first = await engine_over(cluster, path, executor(cluster))
    record = await first.submit(request(exclude=["n1"]).request)
    g2 = f"{record.id}-restart-g2"
    for _ in range(1000):
        if g2 in {d for _, d in cluster.restarts()}:
            break
        await asyncio.sleep(0.01)
    await first.close()
    await first.ledger.close()

    del cluster.behaviour["s2"]  # s2 answers the next time it hears generation 2
    before = len(cluster.restarts())
    second = await engine_over(cluster, path, executor(cluster))
    await second.resume_unfinished()
    assert await second.wait_idle(30)
    assert {d for _, d in cluster.restarts()[before:]} == {g2}
    done = await second.ledger.action(record.id)
    assert done is not None and done.state == ActionState.SUCCEEDED, done.detail
    assert done.detail["slots"] == ["n0", "s2", "n2"] and done.detail["running_generation"] == 2
    assert [f["generation"] for f in done.detail["restart_failures"]] == [1]
    await second.close()
    await second.ledger.close()


async def test_xid_79_drains_the_node_then_the_spare_takes_its_slot(tmp_path: Path) -> None:
    """The built-in rules, the gate and the plan of a real engine: Xid 79 on n1 asks for the save and
    stop, the drain (as today) and the restart; the restart directive goes out only once n1 is
    drained, the spare takes n1's slot and the scheduler requeues nothing."""
    cluster = Cluster()
    scheduler = FakeScheduler()
    for node in (*SLOTS, "s1"):
        scheduler.add_node(node)
    scheduler.add_job(JOB, [*SLOTS, "s1"])
    restart = executor(cluster, scheduler)  # type: ignore[arg-type]
    drained_when_sent: list[bool] = []
    plain = cluster.publish

    async def publish(topic: str, payload: bytes) -> None:
        if decode(payload, Directive).action == "restart":
            drained_when_sent.append(cluster.state.nodes["n1"].drained_by_ftd)
        await plain(topic, payload)

    restart._publish = publish
    restart.in_allocation._publish = publish
    engine = Engine(
        state=cluster.state,
        ledger=SqliteStore(Ledger(tmp_path / "ledger.sqlite")),
        gate=PolicyGate(),
        plugins=make_plugin_manager(entry_points=False),
        executors={
            ActionKind.CHECKPOINT_RESTART: restart,
            ActionKind.DRAIN_NODE: DrainNode(scheduler, cluster.state),
        },
    )
    restart.in_allocation.persist = engine.ledger.save_action
    xid = make_event("n1", Kind.XID, severity=Severity.CRITICAL, data={"code": 79})
    records = await engine.handle_event(xid)
    assert sorted(r.request.kind for r in records) == ["checkpoint_restart", "drain_node"]
    assert await engine.wait_idle(30)
    [job] = [await engine.ledger.action(r.id) for r in records if r.request.kind == "checkpoint_restart"]
    assert job is not None and job.state == ActionState.SUCCEEDED, job.detail
    assert job.detail["path"] == "spare" and job.detail["slots"] == ["n0", "s1", "n2"]
    assert drained_when_sent and all(drained_when_sent)  # the plan's order: drain, then restart
    assert [op for op, _ in scheduler.calls] == ["drain"]  # no requeue through the scheduler
    await engine.close()
    await engine.ledger.close()


def test_a_fault_on_a_spare_does_not_restart_the_job() -> None:
    cluster = Cluster()
    xid = make_event("s1", "xid", severity="critical", data={"code": 79})
    assert cluster.state.jobs_on_node("s1") == [] and "s1" not in cluster.state.job_nodes(JOB)
    assert not [a for a in evaluate_rule(xid_catalog, xid, cluster.state) if a.kind == "checkpoint_restart"]
    on_slot = make_event("n1", "xid", severity="critical", data={"code": 79})
    [restart] = [
        a for a in evaluate_rule(xid_catalog, on_slot, cluster.state) if a.kind == "checkpoint_restart"
    ]
    assert restart.target == JOB and restart.params["exclude"] == ["n1"]


def test_the_job_record_reports_slots_spares_and_generation() -> None:
    cluster = Cluster(spares={"s1": "ok", "s2": "failed"})
    job = cluster.state.jobs[JOB]
    assert job.slots == list(SLOTS) and job.spares == ["s1", "s2"] and job.generation == 0
    assert job.nodes == list(SLOTS)
    stray = RankInfo(rank=9, run=generation_run(RUN, 0))
    cluster.set("s1", sup(role="spare", state="idle"), [stray])  # a stray rank
    assert "s1" in cluster.state.jobs[JOB].nodes  # ranks there: the job is on it
    # n1's supervisor was lost (it stays 'active' at generation 0: it cannot say more) and its slot
    # went to s2 in generation 1: n1 is no longer a node the job trains on
    cluster.set("n1", sup(slot=1, state="lost"))
    cluster.set("s2", sup(slot=1, gen=1))
    job = cluster.state.jobs[JOB]
    assert job.slots == ["n0", "s2", "n2"] and "n1" not in job.nodes and "s2" in job.nodes
    assert cluster.state.jobs_on_node("n1") == [] and cluster.state.jobs_on_node("s2") == [JOB]
    for node in (*SLOTS, "s1", "s2"):
        cluster.state.apply_presence(node, JOB, None)
    assert JOB not in cluster.state.jobs


# --- a generation that finished before any of its ranks reported a step (issue #31) -----------------


async def resume_after_exits(
    exit_codes: Sequence[int], restarted_at: float, deadline_s: float
) -> dict[str, Any]:
    """The resume watch of generation 1, whose slot supervisors report their ranks exited with
    ``exit_codes`` and none of whose ranks reported a step."""
    cluster = Cluster()
    for index, (node, code) in enumerate(zip(SLOTS, exit_codes, strict=True)):
        cluster.set(node, supervisor_info("active", index, 1, "exited", nodes=len(SLOTS), exit_code=code))
    restart = CheckpointRestart(
        publish=cluster.publish,
        state=cluster.state,
        acks=AckBook(),
        scheduler=None,
        save_deadline_s=1,
        stop_deadline_s=1,
    )
    restart.in_allocation.poll_s = 0.01
    request = ActionRequest(kind=ActionKind.CHECKPOINT_RESTART, target=JOB, reason="xid 79")
    detail = {"path": "spare", "running_generation": 1, "slots": list(SLOTS), "restarted_at": restarted_at}
    record = ActionRecord(id="act-9", request=request, state=ActionState.RUNNING, detail=detail)
    async with asyncio.timeout(10):
        return await restart.in_allocation.resume(record, deadline_s)


async def test_a_generation_that_finished_before_reporting_a_step_has_resumed_not_failed() -> None:
    # ftd bench recovery, rank_killed: generation 1 trained its last steps and ended (exit 0, spares
    # released) before its ranks' first step report; the resume watch then waited the whole
    # resume_deadline_s and would have escalated "did not train again". With an hour's deadline this
    # test hung.
    out = await resume_after_exits([0, 0, 0], restarted_at=time.time(), deadline_s=3600.0)
    assert out["finished"] is True and out["resumed_on"] == list(SLOTS)
    assert "not_resumed" not in out and "state" not in out


async def test_a_generation_whose_slot_failed_is_not_taken_for_finished() -> None:
    out = await resume_after_exits([0, 1, 0], restarted_at=1.0, deadline_s=0.5)  # the deadline is past
    assert out["state"] == "escalated" and "not_resumed" in out


def verified(cluster: Cluster, node: str, step: int, shard: int, level: str, ok: bool = True) -> None:
    """What an agent publishes once it verified (or rejected) a rank's manifest (issue #34)."""
    data = {
        "job": JOB,
        "rank": shard,
        "shard_rank": shard,
        "step": step,
        "level": level,
        "ok": ok,
        "world_size": len(SLOTS),
        "root": f"/ck/{level}",
        "reason": "" if ok else "corrupt",
    }
    cluster.state.apply_event(
        make_event(node, Kind.CHECKPOINT, severity=Severity.INFO, source="agent", data=data)
    )


async def test_the_restart_resumes_from_the_newest_checkpoint_every_rank_can_read() -> None:
    """Issue #34: the new generation is told the newest step verified on every rank whose copies the
    restart can read (n1 is swapped out: its shard comes from its partner copy on n2), not the step
    the acks named, and ftd run passes step, level and path to the ranks."""
    cluster = Cluster()
    for shard, node in enumerate(SLOTS):
        verified(cluster, node, 150, shard, "local")
        verified(cluster, node, 200, shard, "local")
    verified(cluster, "n2", 150, 1, "partner")  # n1's shard of step 150, replicated to n2
    verified(cluster, "n0", 200, 0, "partner", ok=False)  # a rejected copy never counts
    detail = await run(executor(cluster), request(exclude=["n1"]))
    assert detail["path"] == "spare" and detail["out"] == ["n1"]
    assert detail["resume"]["step"] == 150 and detail["resume"]["level"] == "partner"
    assert "no readable verified copy of shard(s) 1" in detail["resume"]["why"]  # step 200's shard 1 is on n1
    assert detail["resume_step"] == 150 and detail["resume_from_acks"] == 100
    params = cluster.sent[0][1].params
    assert (params["resume_step"], params["resume_level"], params["resume_path"]) == (
        150,
        "partner",
        "/ck/partner",
    )
    parsed = parse_restart(params)
    assert isinstance(parsed, Restart)
    options = Options(command=["python", "train.py"], nodes=3, spares=1)
    env = rank_env(
        options,
        generation=1,
        slot=1,
        local_rank=0,
        master_addr="h",
        resume_step=parsed.resume_step,
        resume_level=parsed.resume_level,
        resume_path=parsed.resume_path,
    )
    assert (env["FTD_RESUME_STEP"], env["FTD_RESUME_LEVEL"], env["FTD_RESUME_PATH"]) == (
        "150",
        "partner",
        "/ck/partner",
    )


async def test_a_quarantined_step_is_never_resumed_from() -> None:
    cluster = Cluster()
    for step in (150, 200):
        for shard, node in enumerate(SLOTS):
            verified(cluster, node, step, shard, "local")
    cluster.state.checkpoints.quarantine(JOB, 200, "the generation that resumed from it crashed")
    detail = await run(executor(cluster), request(exclude=["n1"]))
    # n1's local copies are unreadable (swapped out) and there is no partner or shared copy
    assert detail["resume"] == {"step": None, "why": "no checkpoint verified on every rank can be read"}
    assert detail["resume_step"] == 100  # the acks' step stands; nothing verified is offered
    assert "resume_level" not in cluster.sent[0][1].params
    cluster2 = Cluster()
    for step in (150, 200):
        for shard, node in enumerate(SLOTS):
            verified(cluster2, node, step, shard, "shared")
    cluster2.state.checkpoints.quarantine(JOB, 200, "the generation that resumed from it crashed")
    detail = await run(executor(cluster2), request(exclude=["n1"]))
    assert detail["resume"]["step"] == 150 and detail["resume"]["level"] == "shared"
    assert "step 200 quarantined" in detail["resume"]["why"]


def test_a_resume_that_crashes_on_every_slot_quarantines_its_checkpoint_and_one_slot_does_not() -> None:
    cluster = Cluster()
    for step in (150, 200):
        for shard, node in enumerate(SLOTS):
            verified(cluster, node, step, shard, "local")
    phase = executor(cluster).in_allocation
    record = request()
    record.detail["resume"] = {"step": 200, "level": "local", "path": "/ck/local", "why": "newest"}
    phase._quarantine_if_resume_crashed(record, list(SLOTS), {"n1": "exited 1"})  # one slot: a node's trouble
    assert cluster.state.checkpoints.choose(JOB) is not None
    assert cluster.state.checkpoints.choose(JOB).step == 200  # type: ignore[union-attr]
    phase._quarantine_if_resume_crashed(record, list(SLOTS), dict.fromkeys(SLOTS, "exited 1"))
    choice = cluster.state.checkpoints.choose(JOB)
    assert choice is not None and choice.step == 150 and "step 200 quarantined" in choice.why
    assert record.detail["quarantined"] == {"200": "every slot failed resuming from it (n0, n1, n2)"}


async def test_a_quarantine_outlives_a_coordinator_restart(tmp_path: Path) -> None:
    """The step a resume crashed on is in its action's detail in the ledger: a new coordinator over
    the same ledger quarantines it again at load, so its next restart does not resume from it."""
    path = tmp_path / "ledger.sqlite"
    store = SqliteStore(Ledger(path))
    record = request()
    record.state = ActionState.FAILED
    record.detail["quarantined"] = {"200": "every slot failed resuming from it (n0, n1, n2)"}
    await store.save_action(record)
    await store.close()
    cluster = Cluster()
    engine = await engine_over(cluster, path, executor(cluster))
    for step in (150, 200):
        for shard, node in enumerate(SLOTS):
            verified(cluster, node, step, shard, "local")
    choice = cluster.state.checkpoints.choose(JOB)
    assert choice is not None and choice.step == 150 and "step 200 quarantined" in choice.why
    assert cluster.state.checkpoints.quarantined(JOB) == record.detail["quarantined"]
    await engine.close()
    await engine.ledger.close()
