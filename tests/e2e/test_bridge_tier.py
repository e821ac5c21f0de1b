"""A broker tier that scales out: a rack broker bridged to a core broker, all real (issue #25 part 6).

The rack broker runs deploy/mosquitto as shipped (per-node passwords and ACL) plus
deploy/mosquitto/bridge/rack-bridge.conf (address and certificate paths rewritten); the core runs the
shipped config and ACL plus bridge/core.acl, with the bridge logging in on the core's mutual-TLS
listener with its own certificate (scripts/make-certs.sh). ``ftd agent`` (node-1) connects to the
rack broker, ``ftd coordinator`` to the core. Checked:

* directives reach the agent through the bridge, and its trainers: a trainer registers (presence up),
  an Xid 13 line -> the coordinator's ``save`` reaches the trainer (directive down), ack and ``stop``;
  the latency (kernel line written -> ``save`` at the trainer) is printed, not asserted;
* a rack broker SIGKILLed mid-stream loses nothing: 60 distinct Xid lines, 20 of them written as the
  rack broker is killed; then 20 more that the rack broker accepted while the core was down (so it
  surely held them) before it was killed. After it restarts every one of the 80 is in the
  coordinator's ledger exactly once (the agent re-sends what no receipt came for: sent 80, recorded
  80, lost 0); the directive path works again afterwards;
* the node's Last Will, fired by the rack broker, reaches the core as the retained ``offline`` status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import sqlite3
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftd.bus import topics
from ftd.bus.mqtt import MqttBus
from ftd.client import Client
from tests.contract.test_mosquitto_acl import (
    DEPLOY,
    OBSERVER_ACL,
    _chown_for_broker,
    _mosquitto_dir,
    deploy_conf_lines,
    make_passwd,
)
from tests.e2e.daemons import Daemon
from tests.e2e.shipped_stack import agent_daemon, bus_section
from tests.e2e.test_agent_spool import wait_for, xid_line
from tests.e2e.tls_broker import TlsBroker, tls_broker
from tests.realparts import Mosquitto

BRIDGE = DEPLOY / "bridge"
BRIDGE_USER = "bridge-rack-a"
NODE = "node-1"
CORE_USERS = {"coordinator": "pw-coordinator", "observer": "pw-observer"}


def rack_bridge_lines(core: TlsBroker) -> list[str]:
    """bridge/rack-bridge.conf as shipped, pointed at the test's core broker and certificates."""
    lines = []
    for raw in (BRIDGE / "rack-bridge.conf").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition(" ")
        if key == "address":
            value = f"127.0.0.1:{core.tls_port}"
        elif key == "bridge_cafile":
            value = str(core.ca)
        elif key in ("bridge_certfile", "bridge_keyfile"):
            cert, private_key = core.cert(BRIDGE_USER)
            value = str(cert if key == "bridge_certfile" else private_key)
        lines.append(f"{key} {value}")
    assert f"remote_clientid {BRIDGE_USER}" in lines and "cleansession false" in lines
    return lines


@contextlib.contextmanager
def rack_broker(core: TlsBroker, secrets: Path) -> Iterator[Mosquitto]:
    """The rack broker: shipped config and ACL, node-1's password, the shipped bridge to ``core``."""
    workdir = _mosquitto_dir()
    try:
        make_passwd(workdir, {NODE: f"pw-{NODE}"})
        shutil.copy(DEPLOY / "acl", workdir / "acl")
        _chown_for_broker(workdir / "acl")
        (secrets / f"{NODE}.pw").write_text(f"pw-{NODE}\n")
        (workdir / "broker").mkdir()
        _chown_for_broker(workdir / "broker")
        conf = [*deploy_conf_lines(workdir), *rack_bridge_lines(core)]
        broker = Mosquitto(workdir / "broker", extra_conf=conf).start()
        try:
            yield broker
        finally:
            broker.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class Observer:
    """A read-only login on the core (a test-only ACL entry): node-1's presence and status there."""

    def __init__(self, core: TlsBroker) -> None:
        self.bus = MqttBus(
            host="127.0.0.1",
            port=core.broker.port,
            client_id="observer",
            username="observer",
            password=CORE_USERS["observer"],
            clean_session=True,
        )
        self.jobs: set[str] = set()
        self.status = ""
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.bus.subscribe(f"{topics.PREFIX}/nodes/{NODE}/jobs/+")
        await self.bus.subscribe(topics.node_status(NODE))
        await self.bus.start()
        assert await self.bus.wait_connected(20)
        self._task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        async for message in self.bus.messages():
            if message.topic == topics.node_status(NODE):
                self.status = json.loads(message.payload)["state"]
                continue
            job = message.topic.rsplit("/", 1)[1]
            (self.jobs.add if message.payload and b'"rank"' in message.payload else self.jobs.discard)(job)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.bus.stop()


async def directive_round_trip(observer: Observer, socket_path: str, kmsg: Path, i: int) -> float:
    """A trainer registers; an Xid 13 line; returns ms until its ``save`` arrived (then ack, stop, leave)."""
    job = f"bridge-{i}"
    client = Client(job=job, rank=0, socket_path=socket_path)
    try:
        await wait_for(lambda: job in observer.jobs, 20, f"{job}'s presence on the core")
        await asyncio.sleep(0.05)  # the coordinator got the same message from the core
        client.heartbeat(1)
        started = time.perf_counter_ns()
        with kmsg.open("a") as handle:
            handle.write(
                f"NVRM: Xid (PCI:0000:{0xA0 + i:02x}:00): 13, pid={9000 + i}, name=python, "
                "Graphics Exception\n"
            )
        got = await asyncio.to_thread(client.wait, 20)
        directive = client.pending_directive
        assert got == "save" and directive is not None, f"sample {i}: got {got!r}"
        latency_ms = (directive.received_ns - started) / 1e6
        client.ack_saved(1, None)
        assert await asyncio.to_thread(client.wait, 20) == "stop"
    finally:
        client.close()
    await wait_for(lambda: job not in observer.jobs, 20, f"{job}'s presence cleared on the core")
    return latency_ms


def recorded_pids(ledger: Path, pids: range) -> list[int]:
    """The ``pid`` of every node-1 Xid event in the coordinator's ledger within ``pids`` (repeats kept)."""
    if not ledger.exists():
        return []
    with sqlite3.connect(ledger) as db:
        rows = db.execute("SELECT body FROM events WHERE kind = 'xid' AND node = ?", (NODE,)).fetchall()
    found = (json.loads(body)["data"].get("pid") for (body,) in rows)
    return [pid for pid in found if isinstance(pid, int) and pid in pids]


@pytest.mark.real
async def test_rack_broker_bridged_to_core(tmp_path: Path) -> None:
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
# Every Xid here is on node-1: a real node would be a repeat offender (its drain is not tested here).
disabled_rules = ["repeat_offender"]

[coordinator.api]
enabled = false

[log]
level = "info"
json = true
""",
            tmp_path / "coordinator",
        )
        agent, kmsg, socket_path = agent_daemon(rack, secrets, tmp_path)
        observer = Observer(core)
        coordinator.start()
        agent.start()
        try:
            await observer.start()
            await asyncio.to_thread(coordinator.wait_log, "node_status", 30)
            await wait_for(lambda: observer.status == "online", 20, "node-1 online on the core")

            # Up and down through the bridge: presence and events up, save/stop directives down.
            latencies = [await directive_round_trip(observer, socket_path, kmsg, i) for i in range(10)]

            # The rack broker is SIGKILLed while the agent publishes; nothing may be lost.
            pids = range(1000, 1080)  # xid_line(i) has pid 1000 + i

            def write(lines: range) -> None:
                with kmsg.open("a") as handle:
                    handle.write("".join(xid_line(i) for i in lines))

            def distinct() -> int:
                return len(set(recorded_pids(ledger, pids)))

            write(range(0, 20))
            await wait_for(lambda: distinct() >= 20, 30, "the first 20 events")
            write(range(20, 40))  # the agent reads the file every 25 ms: killed as it reads and sends them
            await asyncio.to_thread(rack.stop, signal.SIGKILL)
            at_kill = distinct()
            await asyncio.sleep(0.5)
            await asyncio.to_thread(rack.start)
            write(range(40, 60))
            await wait_for(lambda: distinct() >= 60, 60, "all 60 events", lambda: f"(have {distinct()})")

            # Deterministically lost by the broker: with the core down, the rack broker accepts the
            # agent's events (PUBACK) and queues them for the bridge; then it is killed with them.
            await asyncio.to_thread(core.broker.stop)
            write(range(60, 80))
            await asyncio.sleep(1.0)  # read, published and acknowledged by the rack broker
            assert distinct() == 60  # none of them could pass the bridge
            await asyncio.to_thread(rack.stop, signal.SIGKILL)
            await asyncio.to_thread(core.broker.start)
            await asyncio.to_thread(rack.start)
            await wait_for(lambda: distinct() >= 80, 60, "all 80 events", lambda: f"(have {distinct()})")
            await asyncio.sleep(0.5)  # late re-sends: the ledger must keep one of each
            recorded = recorded_pids(ledger, pids)
            sent = len(pids)
            assert (sent, len(recorded), sent - len(set(recorded))) == (80, 80, 0)

            # The bridge's session on the core resumed: directives reach the agent again.
            latencies.append(await directive_round_trip(observer, socket_path, kmsg, 10))

            # The node dies: the rack broker fires its Last Will, the core has it retained.
            agent.stop(signal.SIGKILL)
            await wait_for(lambda: observer.status == "offline", 30, "node-1's Last Will on the core")
            # ... retained there: a subscriber that comes later (a restarted coordinator) reads it.
            await observer.stop()
            observer = Observer(core)
            await observer.start()
            await wait_for(lambda: observer.status == "offline", 10, "node-1's retained status on the core")
            latencies.sort()
            print(
                f"bridge tier: Xid line -> save at the trainer over rack + core broker: "
                f"p50 {statistics.median(latencies):.1f} ms, max {latencies[-1]:.1f} ms "
                f"({len(latencies)} samples); "
                f"{at_kill} of 40 events recorded when the rack broker was killed mid-stream"
            )
        finally:
            await observer.stop()
            agent.stop()
            coordinator.stop()
            for daemon in (agent, coordinator):
                print(f"----- {daemon.name} log (tail)\n{daemon.log()[-4000:]}")
