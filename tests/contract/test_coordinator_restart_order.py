"""A restarted coordinator decides the events queued for it knowing which jobs run where.

The coordinator's MQTT session is persistent: node events published while it is down wait at the
broker and arrive the moment it reconnects -- before the retained node status and job presence,
which the broker sends only after the coordinator subscribes again. Handled in that order, an Xid 79
on a node running a job found no job there: the rule drained the node and never saved or requeued
the job. Reproduced here on a real Mosquitto with the shipped config and ACL. The coordinator now
keeps each job's membership in the ledger (:mod:`ftd.coordinator.intake.presence_memory`) and reads it
back before its first message; what the scheduler no longer runs is dropped at the warm-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ftd.bus import topics
from ftd.bus.factory import make_mqtt_bus
from ftd.config import Config, config_from_data
from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.coordinator.daemon import Coordinator
from ftd.coordinator.ledger.sqlite import Ledger
from ftd.coordinator.wiring import build, coordinator_will
from ftd.events import JobPresence, Kind, NodeStatus, RankInfo, Severity, encode, make_event
from ftd.plugin.actions import ActionRecord
from tests.contract.conftest import SHIPPED_USERS
from tests.contract.test_mosquitto_acl import Client
from tests.realparts import Mosquitto

pytestmark = pytest.mark.real

NODE, JOB = "node-1", "4242"


def _config(broker: tuple[Mosquitto, Path], ledger: Path) -> Config:
    b, workdir = broker
    return config_from_data(
        {
            "bus": {
                "port": b.port,
                "username": "coordinator",
                "password_file": str(workdir / "coordinator.pw"),
            },
            "coordinator": {"ledger_path": str(ledger), "api": {"enabled": False}},
        }
    )


def _coordinator(config: Config, scheduler: FakeScheduler, ledger: Path) -> Coordinator:
    bus = make_mqtt_bus(config.bus, client_id="ftd-coordinator", will=coordinator_will(), manual_ack=True)
    return build(config, bus=bus, scheduler=scheduler, ledger=Ledger(ledger))


async def _until(what: str, predicate: object, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not in time: {what}"
        await asyncio.sleep(0.02)


async def _stop(task: asyncio.Task[None], coordinator: Coordinator) -> None:
    """Stop as the daemon does (``close``: the acknowledgements of what it handled are flushed). A bare
    ``bus.stop()`` left them unsent, and the broker delivered the last test's Xid again to the next
    test's coordinator (the same client id), which restarted a job that test had ended (CI under load)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await coordinator.close()


def _decided(ledger: Path) -> list[ActionRecord]:
    db = Ledger(ledger)
    try:
        return db.actions(limit=1000)
    finally:
        db.close()


async def _restart_with_a_queued_xid(
    broker: tuple[Mosquitto, Path],
    ledger: Path,
    scheduler: FakeScheduler,
    job: str,
    meanwhile: Callable[[], None],
) -> Coordinator:
    """Job ``job``'s rank 0 on node-1 (retained presence); the coordinator runs until it sees it and
    stops; ``meanwhile()``; an Xid 79 on node-1, queued by the broker for the stopped coordinator;
    the coordinator starts again and decides it. Returns the second coordinator (stopped)."""
    config = _config(broker, ledger)
    node = Client(broker[0].port, NODE, SHIPPED_USERS[NODE])
    try:
        status = NodeStatus(node=NODE, state="online", ts=time.time())
        node.c.publish(topics.node_status(NODE), encode(status), qos=1, retain=True).wait_for_publish(5)
        presence = JobPresence(job=job, node=NODE, ranks=[RankInfo(rank=0, pid=1)], ts=time.time())
        node.c.publish(topics.node_job(NODE, job), encode(presence), qos=1, retain=True).wait_for_publish(5)

        # The coordinator runs once (its persistent session and subscriptions are made), then stops.
        first = _coordinator(config, scheduler, ledger)
        task = asyncio.create_task(first.run())
        await _until("the first run sees the job", lambda: job in first.state.jobs)
        await _stop(task, first)
        meanwhile()

        # While it is down, the node's GPU falls off the bus: the broker queues the event for it.
        xid = make_event(NODE, Kind.XID, severity=Severity.CRITICAL, data={"code": 79, "pci": "0000:3b:00.0"})
        node.c.publish(topics.node_event(NODE, Kind.XID), encode(xid), qos=1).wait_for_publish(5)

        second = _coordinator(config, scheduler, ledger)
        task = asyncio.create_task(second.run())
        try:
            drained = lambda: any(r.request.kind == "drain_node" for r in _decided(ledger))  # noqa: E731
            await _until("the node's drain is decided", drained)
        finally:
            await _stop(task, second)
        return second
    finally:
        node.c.publish(topics.node_job(NODE, job), b"", qos=1, retain=True).wait_for_publish(5)
        node.close()


async def test_an_xid_queued_while_the_coordinator_was_down_is_decided_knowing_the_nodes_job(
    shipped_broker: tuple[Mosquitto, Path], tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.sqlite"
    scheduler = FakeScheduler()
    scheduler.add_job(JOB, [NODE])
    await _restart_with_a_queued_xid(shipped_broker, ledger, scheduler, JOB, lambda: None)
    decided = {(r.request.kind, r.request.target) for r in _decided(ledger)}
    # Decided together: the job on the node is saved and requeued elsewhere, and the node drained.
    assert decided == {("checkpoint_restart", JOB), ("drain_node", NODE)}, decided


async def test_a_job_that_ended_while_the_coordinator_was_down_is_forgotten_at_the_warm_up(
    shipped_broker: tuple[Mosquitto, Path], tmp_path: Path
) -> None:
    """The other side: the remembered presence of a job the scheduler no longer runs (it ended while
    the coordinator was down, and its agent's clearing presence never came) is dropped before the
    first message, so the queued Xid drains the node without restarting a job that is gone."""
    ledger = tmp_path / "ledger.sqlite"
    scheduler = FakeScheduler()
    scheduler.add_job(JOB, [NODE])

    def job_ends() -> None:
        assert [p.job for p in Ledger(ledger).presences()] == [JOB]  # remembered by the first run
        scheduler.finish_job(JOB)

    second = await _restart_with_a_queued_xid(shipped_broker, ledger, scheduler, JOB, job_ends)
    # The ended job's retained presence is still at the broker (nothing cleared it): the second run's
    # placement check refuses it, so it does not come back either.
    assert JOB not in second.state.jobs
    decided = {(r.request.kind, r.request.target) for r in _decided(ledger)}
    assert decided == {("drain_node", NODE)}, decided
    assert Ledger(ledger).presences() == []
