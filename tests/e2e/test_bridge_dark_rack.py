"""A dead rack broker does not hide its nodes' deaths (issue #25, part 6's gap), all on real brokers.

The shipped bridge tier (deploy/mosquitto/bridge/: ``notifications true``, its ``notification_topic``
ftd/v1/bridges/rack-a/state, core.acl letting the bridge write it) between a real rack broker and a real
core broker on mutual TLS (the set-up of tests/e2e/test_bridge_tier.py); ``ftd agent`` (node-1,
``[bus] rack_broker = "rack-a"``) on the rack broker with a trainer registered, ``ftd coordinator`` on
the core with ``offline_grace.last_will_s = GRACE_S``. A SIGKILLed rack broker fires none of its nodes'
Last Wills; the core fires the bridge's (``0``). Checked:

* the rack broker SIGKILLed and restarted at once: the coordinator logs ``rack_bridge_down`` (rack-a,
  1 node), node-1 comes back through the restarted bridge within the grace (``offline_grace_cancelled``,
  why ``bridge_down``), and nothing is decided: no ``node_offline`` in the ledger, no action, well past
  the grace;
* the rack broker SIGKILLed and left dead: after the grace (not before) the ledger has node-1's
  ``node_offline`` (why ``bridge_down``, rack_broker rack-a, the trainer's job in its jobs) and the
  rule's decision for it: one ``checkpoint_restart`` of that job;
* the core keeps the bridge's ``0`` retained (a coordinator started later reads it).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from ftd.bus import topics
from ftd.bus.mqtt import MqttBus
from ftd.client import Client
from tests.contract.test_mosquitto_acl import OBSERVER_ACL
from tests.e2e.daemons import Daemon
from tests.e2e.shipped_stack import _log_records, agent_daemon, bus_section
from tests.e2e.test_agent_spool import wait_for
from tests.e2e.test_bridge_tier import BRIDGE, BRIDGE_USER, CORE_USERS, NODE, Observer, rack_broker
from tests.e2e.tls_broker import tls_broker

RACK = "rack-a"  # the rack in the shipped rack-bridge.conf's notification_topic
GRACE_S = 8.0  # coordinator.offline_grace.last_will_s: a rack broker restart fits in it on a loaded VM
JOB = "dark-rack"


def ledger_rows(ledger: Path, sql: str) -> list[tuple[Any, ...]]:
    if not ledger.exists():
        return []
    with sqlite3.connect(ledger) as db:
        return db.execute(sql).fetchall()


def offline_events(ledger: Path) -> list[dict[str, Any]]:
    rows = ledger_rows(ledger, f"SELECT body FROM events WHERE kind = 'node_offline' AND node = '{NODE}'")
    return [json.loads(body)["data"] for (body,) in rows]


def restarts(ledger: Path) -> list[str]:
    return [t for (t,) in ledger_rows(ledger, "SELECT target FROM actions WHERE kind = 'checkpoint_restart'")]


async def retained_bridge_state(core_port: int) -> bytes:
    """What a subscriber that comes now reads on the core for rack-a's bridge."""
    bus = MqttBus(
        host="127.0.0.1",
        port=core_port,
        client_id="observer-bridge",
        username="observer",
        password=CORE_USERS["observer"],
        clean_session=True,
    )
    await bus.subscribe(topics.bridge_state(RACK))
    await bus.start()
    try:
        assert await bus.wait_connected(20)
        async with asyncio.timeout(10):
            async for message in bus.messages():
                assert message.retain
                return message.payload
    finally:
        await bus.stop()
    raise AssertionError("no retained bridge state")


@pytest.mark.real
async def test_a_dead_rack_broker_does_not_hide_its_nodes_deaths(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "coordinator.pw").write_text(CORE_USERS["coordinator"] + "\n")
    core_acl = "\n" + (BRIDGE / "core.acl").read_text() + OBSERVER_ACL
    with (
        tls_broker(tmp_path / "pki", [BRIDGE_USER], users=CORE_USERS, acl_extra=core_acl) as core,
        rack_broker(core, secrets) as rack,
    ):
        ledger = tmp_path / "ledger.sqlite"
        coordinator = Daemon(
            "coordinator",
            f"""{bus_section(core.broker, secrets, "coordinator")}
[coordinator]
ledger_path = "{ledger}"
scheduler = "none"
save_deadline_s = 5
stop_deadline_s = 5

[coordinator.offline_grace]
last_will_s = {GRACE_S}

[coordinator.api]
enabled = false

[log]
level = "info"
json = true
""",
            tmp_path / "coordinator",
        )
        agent, _, socket_path = agent_daemon(rack, secrets, tmp_path, bus_extra=f'rack_broker = "{RACK}"\n')
        observer = Observer(core)
        client: Client | None = None

        def logged(event: str) -> list[dict[str, Any]]:
            return _log_records(coordinator.log(), event)

        coordinator.start()
        agent.start()
        try:
            await observer.start()
            await asyncio.to_thread(coordinator.wait_log, "node_status", 30)
            await wait_for(lambda: observer.status == "online", 20, "node-1 online on the core")
            client = Client(job=JOB, rank=0, socket_path=socket_path)
            client.heartbeat(1)
            await wait_for(lambda: JOB in observer.jobs, 20, "the trainer's presence on the core")
            await asyncio.sleep(0.2)  # the coordinator read the same messages from the core

            # 1. Killed and restarted at once: node-1 is back within the grace; nothing is decided.
            await asyncio.to_thread(rack.stop, signal.SIGKILL)
            await wait_for(lambda: logged("rack_bridge_down"), 20, "the coordinator's rack_bridge_down")
            [down] = logged("rack_bridge_down")
            assert (down["rack"], down["nodes"], down["jobs"], down["grace_s"]) == (RACK, 1, 1, GRACE_S)
            await asyncio.to_thread(rack.start)
            await wait_for(
                lambda: [r for r in logged("offline_grace_cancelled") if r["why"] == "bridge_down"],
                30,
                "node-1 back through the restarted bridge",
                lambda: coordinator.log()[-3000:],
            )
            [back] = logged("offline_grace_cancelled")
            assert back["node"] == NODE and back["away_s"] < GRACE_S
            await asyncio.sleep(GRACE_S + 2)  # past the grace: nothing that was pending may fire
            assert offline_events(ledger) == [] and restarts(ledger) == []
            assert await retained_bridge_state(core.broker.port) == b"1"

            # 2. Killed and left dead: node_offline after the grace, and its job's restart decided.
            await wait_for(lambda: observer.status == "online", 20, "node-1 online on the core again")
            killed = time.monotonic()
            await asyncio.to_thread(rack.stop, signal.SIGKILL)
            await wait_for(lambda: len(logged("rack_bridge_down")) == 2, 20, "the second rack_bridge_down")
            assert logged("rack_bridge_down")[1]["nodes"] == 1
            await wait_for(lambda: offline_events(ledger), GRACE_S + 30, "node-1's node_offline")
            waited = time.monotonic() - killed
            [offline] = offline_events(ledger)
            assert (offline["why"], offline["rack_broker"], offline["jobs"]) == ("bridge_down", RACK, [JOB])
            assert waited >= GRACE_S - 0.5, f"decided {waited:.1f} s after the kill, before the grace"
            await wait_for(lambda: restarts(ledger), 20, "the job's checkpoint_restart")
            assert restarts(ledger) == [JOB]
            assert [r["node"] for r in logged("node_offline")] == [NODE]
            assert await retained_bridge_state(core.broker.port) == b"0"
            print(
                f"dark rack: node_offline {waited:.1f} s after the rack broker's SIGKILL (grace {GRACE_S} s)"
            )
        finally:
            if client is not None:
                client.close()
            await observer.stop()
            agent.stop()
            coordinator.stop()
            for daemon in (agent, coordinator):
                print(f"----- {daemon.name} log (tail)\n{daemon.log()[-4000:]}")
