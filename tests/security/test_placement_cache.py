"""The placement check's cache and failure policy (ftd.coordinator.intake.placement), on the real
Coordinator's message handling with an in-process scheduler whose answers the test controls.

- A scheduler that cannot answer never lets a claim through (fail closed), but a genuine message is
  held and handled once it answers again; past ``retry_s`` it is refused as ``placement_unverified``.
- A dead scheduler is asked once per ``failure_hold_s``, not once per message.
- A job requeued onto another node: that node is believed after a refresh (cache miss -> lookup);
  at once when ftd requeued it itself.
- A node inventing job ids costs at most its miss budget in scheduler calls.
- A forged heartbeat inside an event batch is dropped alone.
- The warm-up at start caches every running job in one scheduler call.
- A node-level answer (gpu_reset, diagnostics) counts only from the node its directive went to.
"""

from __future__ import annotations

import asyncio
import time

from ftd.bus import topics
from ftd.bus.base import Message
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import ApiConfig, Config, CoordinatorConfig
from ftd.coordinator.actions.scheduler import FakeScheduler, SchedulerError
from ftd.coordinator.daemon import Coordinator
from ftd.coordinator.intake.placement import Placement
from ftd.coordinator.ledger.sqlite import Ledger
from ftd.coordinator.wiring import build
from ftd.events import NODE_RANK, Ack, Directive, JobPresence, Kind, RankInfo, Severity, encode, make_event


class Flaky(FakeScheduler):
    """A FakeScheduler whose ``job_nodes`` fails while ``down`` is set."""

    down: bool = False

    async def job_nodes(self, job: str) -> tuple[str, ...]:
        self.calls.append(("job_nodes", (job,)))
        if self.down:
            raise SchedulerError("scontrol failed", returncode=1, stderr="Unable to contact slurm controller")
        j = self.jobs.get(job)
        return j.nodes if j is not None and j.state == "RUNNING" else ()


def coordinator(scheduler: FakeScheduler, *, retry_s: float = 5.0) -> Coordinator:
    config = Config(coordinator=CoordinatorConfig(ledger_path=":memory:", api=ApiConfig(enabled=False)))
    c = build(config, bus=MemoryBus(MemoryBroker()), scheduler=scheduler, ledger=Ledger(":memory:"))
    c.placement = Placement(scheduler, retry_s=retry_s, failure_hold_s=0.05, lookup_timeout_s=1.0)
    return c


def presence(node: str, job: str, *ranks: int) -> Message:
    body = JobPresence(job=job, node=node, ranks=[RankInfo(rank=r) for r in ranks], ts=time.time())
    return Message(topics.node_job(node, job), encode(body), retain=True)


def lookups(scheduler: FakeScheduler) -> int:
    return sum(1 for op, _ in scheduler.calls if op == "job_nodes")


async def until(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_scheduler_down_holds_genuine_and_forged_claims_until_it_answers() -> None:
    sched = Flaky()
    sched.add_job("77", ["node-1"])
    c = coordinator(sched)
    sched.down = True
    assert await c.handle(presence("node-1", "77", 0))  # held (acknowledged to the broker: kept here)
    assert await c.handle(presence("node-2", "77", 0))
    assert "77" not in c.state.jobs  # nothing accepted unverified
    assert c.placement.held == 2 and c.placement.violations == 0
    await asyncio.sleep(0.3)
    assert "77" not in c.state.jobs
    # Retries are spaced by the failure hold: a dead scheduler is not asked for every message.
    assert lookups(sched) <= 12
    sched.down = False
    await until(lambda: c.placement.held == 0)
    assert c.state.jobs["77"].nodes == ["node-1"]  # the genuine claim, handled late but not lost
    assert c.placement.violations == 1  # the forged one, refused once the scheduler could say so
    assert c.placement.unverified == 0
    await c.placement.close()


async def test_scheduler_down_past_retry_window_refuses_as_unverified() -> None:
    sched = Flaky()
    sched.add_job("78", ["node-1"])
    c = coordinator(sched, retry_s=0.3)
    sched.down = True
    ack = Ack(directive_id="d-1", job="78", rank=0, node="node-1", path="/ckpt")
    assert await c.handle(Message(topics.node_acks("node-1"), encode(ack)))
    await until(lambda: c.placement.held == 0)
    assert c.placement.unverified == 1
    assert c.acks.outcome("d-1", [0]).missing == frozenset({0})  # never recorded
    assert c.bad_messages == 1
    assert c.inputs.pending()[0].data["rejected_reasons"] == {"placement_unverified": 1}
    assert c.placement.violations == 0  # the scheduler's fault, not the node's: no security event
    await c.placement.close()


async def test_job_requeued_onto_another_node_is_believed_after_a_refresh() -> None:
    sched = Flaky()
    sched.add_job("79", ["node-1"])
    c = coordinator(sched)
    c.placement.refresh_s = 0.1
    assert await c.handle(presence("node-1", "79", 0))
    assert c.state.jobs["79"].nodes == ["node-1"]
    sched.jobs["79"].nodes = ("node-2",)  # requeued and started on node-2
    assert await c.handle(presence("node-2", "79", 0))  # within refresh_s: the cached list says no
    assert c.placement.violations == 1
    await asyncio.sleep(0.15)
    assert await c.handle(presence("node-2", "79", 0))  # looked up again: now it is node-2's
    assert c.state.jobs["79"].ranks_by_node.keys() >= {"node-2"}
    assert c.placement.violations == 1
    assert lookups(sched) == 2


async def test_a_job_ftd_requeued_itself_is_looked_up_again_at_once() -> None:
    """The executor tells placement (``job_moved``) right after its requeue: the ranks restarting on
    another node within ``refresh_s`` are believed, where the test above books a violation."""
    sched = Flaky()
    sched.add_job("80", ["node-1"])
    c = coordinator(sched)
    c.placement.refresh_s = 60.0
    assert await c.handle(presence("node-1", "80", 0))
    await sched.requeue("80", exclude=["node-1"])
    c.placement.forget("80")  # what CheckpointRestart does through ExecutorContext.job_moved
    sched.start_job("80", ["node-2"])
    assert await c.handle(presence("node-2", "80", 0))
    assert c.state.jobs["80"].ranks_by_node.keys() >= {"node-2"}
    assert c.placement.violations == 0 and lookups(sched) == 2
    assert await c.handle(presence("node-3", "80", 0))  # a forger right after: the new list says no
    assert c.placement.violations == 1 and lookups(sched) == 2


async def test_invented_job_ids_cost_at_most_the_miss_budget_in_scheduler_calls() -> None:
    sched = Flaky()
    c = coordinator(sched)
    clock = [1000.0]
    c.placement = Placement(sched, miss_rate=5.0, miss_burst=20.0, clock=lambda: clock[0], retry_s=0.2)
    for i in range(200):
        await c.handle(presence("node-2", f"9{i:04d}", 0))
    assert lookups(sched) == 20  # the burst; the rest wait (held, then refused), none accepted
    assert c.state.jobs == {}
    assert c.placement.violations == 20  # the 20 looked up: no such job runs on node-2
    await c.placement.close()


async def test_forged_heartbeat_inside_a_batch_is_dropped_and_the_rest_handled() -> None:
    """A batch cannot smuggle a heartbeat for another node's job: that event alone is refused."""
    sched = Flaky()
    sched.add_job("80", ["node-1"])
    c = coordinator(sched)
    claim = {"job": "80", "rank": 0}
    lost = make_event("node-2", Kind.RANK_HEARTBEAT_LOST, severity=Severity.ERROR, data=claim)
    xid = make_event("node-2", Kind.XID, severity=Severity.WARNING, data={"code": 43})
    batch = b"[" + encode(lost) + b"," + encode(xid) + b"]"
    assert await c.handle(Message(topics.node_event_batch("node-2"), batch))
    stored = {e.id for e in await c.ledger.events()}
    assert xid.id in stored and lost.id not in stored
    assert c.placement.violations == 1
    assert not [a for a in await c.ledger.actions() if a.request.target == "80"]
    assert c.receipts.pending["node-2"].rejected.keys() == {lost.id}
    assert c.receipts.pending["node-2"].ids == [xid.id]


async def test_warm_up_caches_every_running_job_in_one_call() -> None:
    """A starting coordinator receives every job's retained presence at once: after the warm-up they
    are decided from the cache, with no scheduler call per job (the bus pump is not held up)."""
    sched = Flaky()
    for i in range(50):
        sched.add_job(str(100 + i), [f"node-{i % 4}"])
    c = coordinator(sched)
    assert await c.placement.warm() == 50
    for i in range(50):
        assert await c.handle(presence(f"node-{i % 4}", str(100 + i), 0))
    assert await c.handle(presence("node-9", "100", 0))  # forged: decided from the cache too
    assert len(c.state.jobs) == 50 and c.placement.violations == 1
    assert [op for op, _ in sched.calls] == ["running_job_nodes"]


async def test_a_node_level_answer_counts_only_from_the_node_the_directive_was_sent_to() -> None:
    """gpu_reset / diagnostics answers (rank NODE_RANK) are matched by directive id, and directive
    ids are guessable (a node sees action ids in its own directives): another node's answer is a
    violation, not the answer."""
    c = coordinator(Flaky())
    await c.bus.start()
    reset = Directive(id="act-1-gpu_reset", ts=time.time(), action="gpu_reset", node="node-2")
    await c.directives.send("node-2", reset)
    forged = Ack(directive_id=reset.id, job="", rank=NODE_RANK, node="node-1", reason="reset: ok")
    assert await c.handle(Message(topics.node_acks("node-1"), encode(forged)))
    assert c.acks.outcome(reset.id, [NODE_RANK]).missing == frozenset({NODE_RANK})
    assert c.placement.violations == 1
    (summary,) = c.placement.security.pending()
    assert summary.node == "node-1" and summary.data["by_message"] == {"node_ack": 1}
    genuine = Ack(directive_id=reset.id, job="", rank=NODE_RANK, node="node-2", reason="reset: ok")
    assert await c.handle(Message(topics.node_acks("node-2"), encode(genuine)))
    assert c.acks.outcome(reset.id, [NODE_RANK]).acked[NODE_RANK].node == "node-2"
    await c.bus.stop()
