"""The database goes down under the leader: it steps down and nothing acts; when PostgreSQL is back
one replica takes a new term and the event sent meanwhile is decided once (real PostgreSQL and
Mosquitto, the coordinator in-process through ftd.coordinator.ha.runner.HaRunner)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from ftd.bench.failover import Nodes, RecordingBus, RecordingScheduler, _config, _Effects, _effects
from ftd.bus.base import Bus
from ftd.bus.factory import make_mqtt_bus
from ftd.bus.mqtt import MqttBus
from ftd.config import load_config
from ftd.coordinator.ha.lease import LeaseLost
from ftd.coordinator.ha.runner import HaRunner
from ftd.coordinator.wiring import coordinator_will
from ftd.events import Severity
from tests.realparts import Mosquitto, start_postgres

pytestmark = pytest.mark.timeout(180)


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_database_down_the_leader_steps_down_and_nothing_acts(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    pg = start_postgres(tmp_path / "pg")
    config_path = tmp_path / "coordinator.toml"
    _config(config_path, "coord-a", mosquitto.port, pg.dsn)
    text = config_path.read_text().replace("lease_ttl_s = 5.0", "lease_ttl_s = 2.0")
    config_path.write_text(text.replace("renew_interval_s = 1.0", "renew_interval_s = 0.5"))
    config = load_config(config_path)
    effects_path = tmp_path / "effects.jsonl"
    effects = _Effects(effects_path)

    def make_bus() -> Bus:
        bus = make_mqtt_bus(config.bus, client_id="ftd-coordinator", will=coordinator_will(), manual_ack=True)
        return RecordingBus(bus, effects)

    def view_bus(client_id: str) -> Bus:
        return make_mqtt_bus(config.bus, client_id=client_id, clean_session=True)

    runner = HaRunner(
        config, make_bus=make_bus, scheduler=RecordingScheduler(effects), make_view_bus=view_bus
    )
    task = asyncio.create_task(runner.run())
    nodes_bus = MqttBus(host="127.0.0.1", port=mosquitto.port, client_id="test-nodes", clean_session=True)
    nodes = Nodes(nodes_bus, 1)
    pump: asyncio.Task[None] | None = None
    try:
        await until(lambda: runner.status.role == "leader" and runner.coordinator is not None, 30, "a leader")
        await until(lambda: runner.coordinator.bus.connected, 30, "the leader on the bus")
        await nodes.start()
        pump = asyncio.create_task(nodes.pump())
        await until(lambda: "job-0" in runner.coordinator.state.jobs, 30, "the job's presence")
        assert runner.status.epoch == 1
        assert runner.view is not None and runner.view.bus is None  # leading: its view is closed

        pg.stop()  # immediate: like a crash of the database
        down = time.time()
        await until(lambda: runner.status.role == "standby", 15, "the leader to step down")
        assert runner.view is not None
        await until(lambda: runner.view.bus is not None, 10, "the view reopened on standing by")
        with pytest.raises(LeaseLost):
            runner.lease.check()
        await nodes.event(0, 13, Severity.ERROR)  # actionable, while nobody can lead
        await asyncio.sleep(3.0)
        assert [e for e in _effects(effects_path) if e["t"] >= down] == []  # nothing acted
        assert runner.status.role == "standby" and nodes.unreceipted  # and nothing was receipted

        pg.start()
        await until(lambda: runner.status.role == "leader", 30, "a new term")
        assert runner.status.epoch == 2
        await until(lambda: not nodes.unreceipted, 30, "the event receipted")
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            events = conn.execute("SELECT count(*) FROM events WHERE id = 'node-0-bench-1'").fetchone()
            actions = conn.execute(
                "SELECT count(*) FROM actions WHERE kind = 'checkpoint_restart' AND target = 'job-0'"
            ).fetchone()
        assert events == (1,)
        assert actions == (1,)  # decided once, after the database came back
    finally:
        if pump is not None:
            pump.cancel()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await nodes_bus.stop()
        pg.remove()


async def test_a_short_outage_that_fails_a_write_ends_the_term_and_the_next_one_catches_up(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    """The database is gone for about a second, less than the 5 s lease, while an event arrives: the
    leader could not record it, so it ends its term (without that, the unacknowledged message would
    wait for a reconnect that never comes); the next term gets it again and decides it once."""
    pg = start_postgres(tmp_path / "pg")
    config_path = tmp_path / "coordinator.toml"
    _config(config_path, "coord-a", mosquitto.port, pg.dsn)  # lease_ttl_s 5, renewal every 1 s
    config = load_config(config_path)
    effects = _Effects(tmp_path / "effects.jsonl")

    def make_bus() -> Bus:
        bus = make_mqtt_bus(config.bus, client_id="ftd-coordinator", will=coordinator_will(), manual_ack=True)
        return RecordingBus(bus, effects)

    def view_bus(client_id: str) -> Bus:
        return make_mqtt_bus(config.bus, client_id=client_id, clean_session=True)

    runner = HaRunner(
        config, make_bus=make_bus, scheduler=RecordingScheduler(effects), make_view_bus=view_bus
    )
    task = asyncio.create_task(runner.run())
    nodes_bus = MqttBus(host="127.0.0.1", port=mosquitto.port, client_id="test-nodes", clean_session=True)
    nodes = Nodes(nodes_bus, 1)
    pump: asyncio.Task[None] | None = None
    try:
        await until(lambda: runner.status.role == "leader" and runner.coordinator is not None, 30, "a leader")
        await until(lambda: runner.coordinator.bus.connected, 30, "the leader on the bus")
        await nodes.start()
        pump = asyncio.create_task(nodes.pump())
        await until(lambda: "job-0" in runner.coordinator.state.jobs, 30, "the job's presence")
        ledger = runner.coordinator.ledger
        pg.stop()
        await nodes.event(0, 13, Severity.ERROR)
        await until(lambda: ledger.write_failures > 0, 10, "the leader to fail to record the event")
        pg.start()
        await until(lambda: runner.status.epoch == 2, 30, "the next term")
        await until(lambda: not nodes.unreceipted, 30, "the event receipted")
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            events = conn.execute("SELECT count(*) FROM events WHERE id = 'node-0-bench-1'").fetchone()
            actions = conn.execute(
                "SELECT count(*) FROM actions WHERE kind = 'checkpoint_restart' AND target = 'job-0'"
            ).fetchone()
        assert events == (1,)
        assert actions == (1,)
    finally:
        if pump is not None:
            pump.cancel()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await nodes_bus.stop()
        pg.remove()
