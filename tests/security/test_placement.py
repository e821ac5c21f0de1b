"""Issue #11, authority follows placement: one node's valid credentials speak only for the jobs the
scheduler runs on that node, and read only that node's directives.

Real parts: Mosquitto with the shipped deploy config and ACL (one password per node), a real Slurm
(one slurmd: jobs run on node-1; node-2 is the node whose credentials try to speak for them), and
the real :class:`~ftd.coordinator.daemon.Coordinator` with the Slurm scheduler. The nodes are MQTT
clients with their own credentials that publish exactly what an agent (or an attacker holding a
node's credentials) would. Findings reproduced (each failed before the fix):

- forged acknowledgement: node-2 acknowledged the save directive of a job running on node-1 for
  rank 0; the action ended ``succeeded`` with the forged checkpoint path while the rank never saved;
- forged presence: node-2 claimed the job, then reported an Xid 13: the real job was saved, stopped
  and requeued;
- forged heartbeat: node-2 reported a lost heartbeat of the job's rank: the job was restarted (now:
  the genuine one starts the hang diagnosis, the forged one nothing);
- every node could read every job's directives (``ftd/v1/jobs/+/directives``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ftd.bus import topics
from ftd.bus.mqtt import MqttBus
from ftd.config import ApiConfig, Config, CoordinatorConfig, SlurmConfig
from ftd.coordinator.daemon import Coordinator
from ftd.coordinator.ledger.sqlite import Ledger, SqliteStore
from ftd.coordinator.wiring import build, coordinator_will, make_scheduler
from ftd.events import (
    Ack,
    Directive,
    Event,
    JobPresence,
    Kind,
    RankInfo,
    Receipt,
    Severity,
    decode,
    encode,
    make_event,
)
from ftd.plugin.actions import ActionKind, ActionRecord, ActionState
from tests.realparts import Mosquitto, SlurmCluster
from tests.security.bus import USERS, Inbox, deploy_broker, node_bus

pytestmark = pytest.mark.real

XID13 = {"code": 13, "pci": "0000:3b:00.0", "pid": 4242, "process": "python"}


@pytest.fixture(scope="module")
def broker() -> Iterator[Mosquitto]:
    with deploy_broker() as b:
        yield b


@dataclass
class Env:
    coordinator: Coordinator
    node1: Inbox  # the node the job runs on (what its agent would do)
    node2: Inbox  # another node's valid credentials, speaking for node-1's job
    ledger: Path


@pytest.fixture
async def env(broker: Mosquitto, slurm: SlurmCluster, tmp_path: Path) -> AsyncIterator[Env]:
    ledger = tmp_path / "ledger.sqlite"
    config = Config(
        coordinator=CoordinatorConfig(
            ledger_path=str(ledger),
            save_deadline_s=4,
            stop_deadline_s=4,
            # The restart is judged on its save and stop here; following the job until it trains again
            # (the resume phase: tests/e2e/test_restart_followed_slurm.py) would wait for ranks no one runs.
            resume_deadline_s=0,
            scheduler="slurm",
            slurm=SlurmConfig(slurm_conf=str(slurm.conf_path)),
            api=ApiConfig(enabled=False),
        )
    )
    bus = MqttBus(
        host="127.0.0.1",
        port=broker.port,
        client_id="ftd-coordinator",
        username="coordinator",
        password=USERS["coordinator"],
        will=coordinator_will(),
        manual_ack=True,
        keepalive_s=2,
        reconnect_max_s=1.0,
    )
    coordinator = build(config, bus=bus, scheduler=make_scheduler(config))
    ready = asyncio.Event()
    task = asyncio.create_task(coordinator.run(ready.set))
    await asyncio.wait_for(ready.wait(), 20)
    node1 = await Inbox(node_bus(broker, "node-1")).start(
        topics.node_job_directives("node-1"), topics.node_receipts("node-1")
    )
    # Everything node-2 might try to read: the broker must deliver none of node-1's traffic.
    node2 = await Inbox(node_bus(broker, "node-2")).start(
        topics.node_receipts("node-2"),
        "ftd/v1/nodes/+/directives/jobs",
        "ftd/v1/nodes/node-1/#",
        "ftd/v1/jobs/#",
    )
    try:
        yield Env(coordinator, node1, node2, ledger)
    finally:
        await node1.close()
        await node2.close()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await coordinator.close()


def running_job(slurm: SlurmCluster) -> str:
    job = slurm.sbatch(None, "--requeue", "-w", "node-1", wrap="sleep 300")
    slurm.wait_job_state(job, "RUNNING")
    return job


async def present(bus: MqttBus, node: str, job: str, ranks: list[int]) -> None:
    payload = encode(JobPresence(job=job, node=node, ranks=[RankInfo(rank=r) for r in ranks], ts=time.time()))
    await bus.publish(topics.node_job(node, job), payload if ranks else b"", retain=True)


async def send_event(bus: MqttBus, event: Event) -> None:
    await bus.publish(topics.node_event(event.node, event.kind), encode(event))


def sqlite_ledger(coordinator: Coordinator) -> Ledger:
    """The coordinator's SQLite ledger, read at once (a predicate until() polls cannot await)."""
    store = coordinator.ledger
    assert isinstance(store, SqliteStore)
    return store.ledger


def job_actions(coordinator: Coordinator, job: str) -> list[ActionRecord]:
    return [a for a in sqlite_ledger(coordinator).actions() if a.request.target == job]


def security_events(ledger: Path) -> list[dict[str, object]]:
    with sqlite3.connect(ledger) as db:
        rows = db.execute("SELECT body FROM events WHERE kind = 'security'").fetchall()
    return [json.loads(body) for (body,) in rows]


async def one_security_event(ledger: Path) -> dict[str, object]:
    """The one ``security`` summary in the ledger, once it is there: the coordinator commits it with
    its next flush of summaries, a moment after the message it counts (under load, more than one)."""
    await until(lambda: security_events(ledger), 10, "the security summary committed")
    (security,) = security_events(ledger)
    return security


async def until(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


async def finished(coordinator: Coordinator, job: str, timeout: float = 30) -> ActionRecord:
    done = {ActionState.SUCCEEDED, ActionState.ESCALATED, ActionState.FAILED}
    await until(
        lambda: any(a.state in done for a in job_actions(coordinator, job)), timeout, f"action on job {job}"
    )
    (record,) = [a for a in job_actions(coordinator, job) if a.state in done]
    return record


async def save_directive(env: Env, job: str) -> Directive:
    """The save directive as node-1 (the node running the job) receives it on its own topic."""
    topic = topics.node_job_directives("node-1")

    def got_save() -> bool:
        return any(decode(m.payload, Directive).action == "save" for m in env.node1.on(topic))

    await env.node1.wait(got_save, 15, "the save directive on node-1's own topic")
    return next(d for m in env.node1.on(topic) if (d := decode(m.payload, Directive)).action == "save")


async def clear_presence_on_stop(env: Env, job: str) -> None:
    """What node-1's agent does when its rank exits after ``stop``: its presence empties."""
    topic = topics.node_job_directives("node-1")

    def got_stop() -> bool:
        return any(decode(m.payload, Directive).action == "stop" for m in env.node1.on(topic))

    await env.node1.wait(got_stop, 20, "the stop directive on node-1's own topic")
    await present(env.node1.bus, "node-1", job, [])


def foreign_traffic(env: Env) -> list[str]:
    """Topics node-2 received that are not its own."""
    return [m.topic for m in env.node2.got if not m.topic.startswith("ftd/v1/nodes/node-2/")]


async def test_forged_ack_from_another_node_is_rejected_and_the_save_does_not_succeed(
    env: Env, slurm: SlurmCluster
) -> None:
    job = running_job(slurm)
    await present(env.node1.bus, "node-1", job, [0])
    await until(lambda: job in env.coordinator.state.jobs, 10, "node-1's presence accepted")
    await send_event(env.node1.bus, make_event("node-1", Kind.XID, severity=Severity.ERROR, data=XID13))
    directive = await save_directive(env, job)
    assert directive.job == job
    stopper = asyncio.create_task(clear_presence_on_stop(env, job))

    # node-2 holds valid credentials and knows the directive (here: told by the test; it can no
    # longer read it) and acknowledges the save for rank 0, which runs on node-1.
    forged = Ack(directive_id=directive.id, job=job, rank=0, node="node-2", step=7, path="/forged/ckpt")
    await env.node2.bus.publish(topics.node_acks("node-2"), encode(forged))

    record = await finished(env.coordinator, job)
    await stopper
    assert record.request.kind == ActionKind.CHECKPOINT_RESTART
    assert record.state == ActionState.ESCALATED  # rank 0 never saved: said so, not "succeeded"
    assert record.detail["save_missing"] == [0]
    assert record.detail["saved"] == {}
    assert "/forged/ckpt" not in json.dumps(record.detail)
    assert env.coordinator.placement.violations == 1
    security = await one_security_event(env.ledger)
    assert security["node"] == "node-2" and security["severity"] == "error" and security["count"] == 1
    assert security["data"]["by_message"] == {"ack": 1}  # type: ignore[index]
    assert security["data"]["jobs"] == {job: 1}  # type: ignore[index]
    assert "/forged/ckpt" not in json.dumps(security)  # counted, never stored verbatim
    assert foreign_traffic(env) == []  # node-2 read none of node-1's directives


async def test_genuine_ack_from_the_node_running_the_job_still_succeeds(
    env: Env, slurm: SlurmCluster
) -> None:
    job = running_job(slurm)
    await present(env.node1.bus, "node-1", job, [0])
    await until(lambda: job in env.coordinator.state.jobs, 10, "node-1's presence accepted")
    await send_event(env.node1.bus, make_event("node-1", Kind.XID, severity=Severity.ERROR, data=XID13))
    directive = await save_directive(env, job)
    stopper = asyncio.create_task(clear_presence_on_stop(env, job))
    ack = Ack(directive_id=directive.id, job=job, rank=0, node="node-1", step=11, path="/ckpt/step-11")
    await env.node1.bus.publish(topics.node_acks("node-1"), encode(ack))

    record = await finished(env.coordinator, job)
    await stopper
    assert record.state == ActionState.SUCCEEDED
    assert record.detail["saved"] == {"0": {"step": 11, "path": "/ckpt/step-11"}}
    assert env.coordinator.placement.violations == 0
    assert security_events(env.ledger) == []
    await until(lambda: slurm.job(job).get("Restarts") == "1", 20, "the job requeued in Slurm")
    assert foreign_traffic(env) == []


async def test_forged_presence_then_xid_does_not_touch_the_job(env: Env, slurm: SlurmCluster) -> None:
    job = running_job(slurm)
    await present(env.node2.bus, "node-2", job, [0])  # node-2 claims node-1's job
    xid = make_event("node-2", Kind.XID, severity=Severity.ERROR, data=XID13)
    await send_event(env.node2.bus, xid)
    ledger = sqlite_ledger(env.coordinator)
    await until(lambda: any(e.id == xid.id for e in ledger.events()), 10, "the Xid handled")

    assert job not in env.coordinator.state.jobs
    assert env.coordinator.state.jobs_on_node("node-2") == []
    assert job_actions(env.coordinator, job) == []  # no save, no stop, no requeue
    assert env.coordinator.placement.violations == 1
    security = await one_security_event(env.ledger)
    assert security["data"]["by_message"] == {"presence": 1}  # type: ignore[index]
    assert slurm.job(job)["JobState"] == "RUNNING" and slurm.job(job)["Restarts"] == "0"

    # The node that runs it is believed.
    await present(env.node1.bus, "node-1", job, [0])
    await until(lambda: job in env.coordinator.state.jobs, 10, "node-1's presence accepted")
    assert env.coordinator.state.jobs[job].nodes == ["node-1"]
    assert env.coordinator.placement.violations == 1
    await present(env.node2.bus, "node-2", job, [])  # a node may always clear its own claim
    await present(env.node1.bus, "node-1", job, [])


async def test_forged_heartbeat_is_rejected_and_the_genuine_one_starts_the_hang_diagnosis(
    env: Env, slurm: SlurmCluster
) -> None:
    job = running_job(slurm)
    await present(env.node1.bus, "node-1", job, [0])
    await until(lambda: job in env.coordinator.state.jobs, 10, "node-1's presence accepted")
    lost = {"job": job, "rank": 0, "pid": 4242, "silent_s": 30.0}
    forged = make_event("node-2", Kind.RANK_HEARTBEAT_LOST, severity=Severity.ERROR, data=lost)
    await send_event(env.node2.bus, forged)

    def rejected() -> bool:
        receipts = [decode(m.payload, Receipt) for m in env.node2.on(topics.node_receipts("node-2"))]
        return any(forged.id in r.rejected for r in receipts)

    await env.node2.wait(rejected, 10, "node-2's forged heartbeat receipted as rejected")
    assert job_actions(env.coordinator, job) == []
    assert not [e for e in await env.coordinator.ledger.events() if e.id == forged.id]  # never stored
    assert env.coordinator.placement.violations == 1
    security = await one_security_event(env.ledger)
    assert security["data"]["by_message"] == {"rank_heartbeat_lost": 1}  # type: ignore[index]

    genuine = make_event("node-1", Kind.RANK_HEARTBEAT_LOST, severity=Severity.ERROR, data=lost)
    await send_event(env.node1.bus, genuine)

    def diagnosing() -> bool:  # a lost heartbeat is a hang suspect: first the diagnosis (issue #33)
        return any(a.request.kind == ActionKind.DIAGNOSE_HANG for a in job_actions(env.coordinator, job))

    await until(
        diagnosing,
        10,
        "diagnose_hang of the job for node-1's genuine report",
    )
    assert env.coordinator.placement.violations == 1


async def test_a_node_cannot_read_another_nodes_job_directives(broker: Mosquitto) -> None:
    """The ACL side, without a coordinator: the coordinator's credentials publish a job directive to
    node-1; node-2 subscribed to every pattern that could match it receives nothing."""
    coordinator = node_bus(broker, "coordinator")
    node1 = await Inbox(node_bus(broker, "node-1")).start(topics.node_job_directives("node-1"))
    node2 = await Inbox(node_bus(broker, "node-2")).start(
        topics.node_job_directives("node-1"),
        "ftd/v1/nodes/+/directives/jobs",
        "ftd/v1/nodes/+/directives/#",
        "ftd/v1/#",
        "#",
        topics.node_job_directives("node-2"),
    )
    await coordinator.start()
    assert await coordinator.wait_connected(10)
    try:
        await coordinator.publish(topics.node_job_directives("node-1"), b"save for node-1")
        await coordinator.publish(topics.node_job_directives("node-2"), b"control for node-2")
        control = b"control for node-2"
        await node2.wait(lambda: any(m.payload == control for m in node2.got), 10, "node-2's own directive")
        await node1.wait(lambda: bool(node1.got), 10, "node-1's directive")
        assert [(m.topic, m.payload) for m in node1.got] == [
            (topics.node_job_directives("node-1"), b"save for node-1")
        ]
        # QoS 1 from one publisher arrives in order: had node-2 been sent node-1's, it came first.
        # (Overlapping subscriptions may deliver its own more than once; the retained coordinator
        # status is node-2's to read.)
        own = {topics.node_job_directives("node-2")}
        assert {m.topic for m in node2.got} - {topics.COORDINATOR_STATUS} == own
        assert not [m for m in node2.got if b"node-1" in m.payload]
    finally:
        await coordinator.stop()
        await node1.close()
        await node2.close()
