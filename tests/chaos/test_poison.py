"""Poison from one node's credentials against a real ``ftd coordinator`` on a real Mosquitto.

Operators reported (docs/architecture.md §11.2: no payload can crash, stall or starve the coordinator): JSON
nested 1000 deep killed the coordinator with a RecursionError, and sent *retained* on the node's status topic
crash-looped it on every restart; a node flooding 10k events/s delayed another node's decisions by 38 s; an 8
MB batch froze it for 4.5 s; 10 MB events were stored verbatim.

Each test publishes only under one node's own ``ftd/v1/nodes/{node}/`` subtree (what its
credentials may write), then checks with exact counts: the coordinator process is alive and was
never restarted, ``ftd_bad_messages_total`` is the number of poison messages, nothing oversized is
in the ledger, the node's ``bad_input`` summary says what was refused or folded, and every event
with an id the coordinator could read is receipted (committed or rejected with a reason), so the
agent would not resend it forever. A good event sent after the poison is decided: the coordinator
handles messages of one publisher in order, so once it is in the ledger the poison before it has
been handled.

Found already fixed by the decode hardening (``ftd.events.decode`` raises only ``DecodeError``):
the RecursionError (deep and retained-deep); these tests document it. Failing before this change:
refused payloads were neither reported (no ``bad_input`` event) nor receipted, the flood was stored
event by event (no rate limit, no summary).
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from ftd.bus import topics
from ftd.events import (
    MAX_PAYLOAD_BYTES,
    CoordinatorStatus,
    Kind,
    Receipt,
    Severity,
    decode,
    encode,
    make_event,
)
from tests.e2e.daemons import Daemon
from tests.realparts import Mosquitto, free_port

pytestmark = [pytest.mark.real, pytest.mark.slow]


# --- helpers (also used by test_ledger_corrupt) ----------------------------------------------------


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


class NodeClient:
    """One node's MQTT connection: publishes under its own subtree, collects its receipts."""

    def __init__(self, port: int, node: str) -> None:
        self.node = node
        self.committed: set[str] = set()
        self.rejected: dict[str, str] = {}
        self.statuses: list[CoordinatorStatus] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"test-{node}", clean_session=True)
        self.client.max_inflight_messages_set(100)
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *_: self._subscribed.set()
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        self.client.subscribe([(topics.node_receipts(node), 1), (topics.COORDINATOR_STATUS, 1)])
        if not self._subscribed.wait(10):
            raise TimeoutError("subscription not acknowledged")

    def _on_message(self, _client: Any, _userdata: Any, msg: mqtt.MQTTMessage) -> None:
        if not msg.payload:
            return
        with self._lock:
            if msg.topic == topics.COORDINATOR_STATUS:
                self.statuses.append(decode(msg.payload, CoordinatorStatus))
            else:
                receipt = decode(msg.payload, Receipt, max_bytes=64 << 20)
                self.committed.update(receipt.ids)
                self.rejected.update(receipt.rejected)

    def wait_online(self, since: float, timeout: float = 30.0) -> None:
        """Wait for the coordinator's retained ``online`` published after ``since`` (wall clock)."""

        def online() -> bool:
            with self._lock:
                return any(s.state == "online" and s.ts >= since for s in self.statuses)

        wait_until(online, timeout, "the coordinator to say it is online")

    def publish(self, suffix: str, payload: bytes, *, retain: bool = False, wait: bool = True) -> Any:
        """Publish on ``ftd/v1/nodes/{node}/{suffix}``, QoS 1; by default wait for the broker's PUBACK."""
        info = self.client.publish(f"ftd/v1/nodes/{self.node}/{suffix}", payload, qos=1, retain=retain)
        if wait:
            info.wait_for_publish(60)
        return info

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


class CoordinatorRig:
    """``ftd coordinator`` as a subprocess on a private ledger, its HTTP API on a free port."""

    def __init__(self, workdir: Path, broker: Mosquitto) -> None:
        self.api_port = free_port()
        self.ledger = workdir / "coordinator" / "ledger.sqlite"
        config = (
            f'[bus]\nhost = "127.0.0.1"\nport = {broker.port}\n\n'
            f'[coordinator]\nledger_path = "{self.ledger}"\nscheduler = "none"\n\n'
            f'[coordinator.api]\nport = {self.api_port}\n\n[log]\nlevel = "info"\njson = true\n'
        )
        self.daemon = Daemon("coordinator", config, workdir / "coordinator")

    def start(self, observer: NodeClient) -> None:
        since = time.time()
        self.daemon.start()
        try:
            observer.wait_online(since)
        except TimeoutError:
            raise AssertionError(f"coordinator not online:\n{self.daemon.log()[-3000:]}") from None

    @property
    def pid(self) -> int | None:
        return self.daemon.proc.pid if self.daemon.proc is not None else None

    def alive(self) -> bool:
        return self.daemon.proc is not None and self.daemon.proc.poll() is None

    def stop(self) -> int | None:
        return self.daemon.stop()

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        if match is None:
            raise KeyError(f"{name} not in /metrics")
        return float(match.group(1))

    def bad_messages(self) -> int:
        return int(self.metric("ftd_bad_messages_total"))

    def rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with contextlib.closing(sqlite3.connect(self.ledger)) as db:
            return list(db.execute(sql, args))

    def event_ids(self, node: str) -> set[str]:
        sql = "SELECT id FROM events WHERE node = ? AND kind != 'bad_input'"
        return {r[0] for r in self.rows(sql, (node,))}

    def bad_input(self, node: str) -> list[dict[str, Any]]:
        """The data of ``node``'s ``bad_input`` summary events, oldest window first."""
        sql = "SELECT body FROM events WHERE node = ? AND kind = 'bad_input' ORDER BY ts"
        return [json.loads(body)["data"] for (body,) in self.rows(sql, (node,))]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    # deploy/mosquitto's queue limits: with Mosquitto's default (1000 messages) a flood overflows the
    # coordinator's session queue and the broker drops events (agents resend them; this test's don't).
    b = Mosquitto(tmp_path / "mosq", extra_conf=["max_queued_messages 100000"]).start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def node1(broker: Mosquitto) -> Iterator[NodeClient]:
    client = NodeClient(broker.port, "node-1")
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def rig(tmp_path: Path, broker: Mosquitto) -> Iterator[CoordinatorRig]:
    r = CoordinatorRig(tmp_path, broker)
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
def running(rig: CoordinatorRig, node1: NodeClient) -> CoordinatorRig:
    rig.start(node1)
    return rig


def control(node: NodeClient, rig: CoordinatorRig) -> None:
    """Send a good event after the poison and wait until it is decided (and so all before it)."""
    good = make_event(node.node, Kind.XID, severity=Severity.WARNING, data={"code": 43})
    node.publish("events/xid", encode(good))
    wait_until(lambda: good.id in rig.event_ids(node.node), 30, "the control event to be decided")
    wait_until(lambda: good.id in node.committed, 10, "the control event's receipt")


def deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def event_with(node: str, **fields: Any) -> bytes:
    doc = json.loads(encode(make_event(node, Kind.XID, data={"code": 43})))
    doc.update(fields)
    return json.dumps(doc).encode()


# --- tests ------------------------------------------------------------------------------------------


def test_deeply_nested_json_is_refused_counted_and_reported(
    running: CoordinatorRig, node1: NodeClient
) -> None:
    pid = running.pid
    nested = b'{"a":' + deep(1000) + b"}"
    deep_event = event_with("node-1", id="deep-event", data="DEEP").replace(b'"DEEP"', nested)
    node1.publish("events/xid", deep_event)
    node1.publish("events/xid", deep(100_000))
    node1.publish("acks", deep(1000))
    node1.publish("jobs/7", b'{"schema":1,"job":"7","node":"node-1","ranks":' + deep(1000) + b"}")
    control(node1, running)
    assert running.alive() and running.pid == pid
    assert running.bad_messages() == 4
    [summary] = running.bad_input("node-1")
    assert summary["rejected"] == 4 and summary["rejected_reasons"] == {"invalid": 4}
    assert summary["folded"] == 0


def test_huge_event_is_refused_never_stored_and_receipted_rejected(
    running: CoordinatorRig, node1: NodeClient
) -> None:
    huge = make_event("node-1", Kind.LOG_PATTERN, data={"line": "x" * (10 << 20)})
    payload = encode(huge)
    node1.publish("events/log_pattern", payload)
    control(node1, running)
    wait_until(lambda: huge.id in node1.rejected, 10, "the huge event's rejected receipt")
    assert "over the limit" in node1.rejected[huge.id]
    assert huge.id not in node1.committed
    assert running.bad_messages() == 1
    [(largest,)] = running.rows("SELECT max(length(body)) FROM events")
    assert largest < MAX_PAYLOAD_BYTES
    [summary] = running.bad_input("node-1")
    assert summary["rejected_reasons"] == {"oversized": 1}
    assert summary["largest_bytes"] == len(payload)


def test_retained_deep_status_does_not_crash_loop_the_coordinator(
    rig: CoordinatorRig, node1: NodeClient
) -> None:
    node1.publish("status", b'{"schema":1,"node":"node-1","state":' + deep(1000) + b"}", retain=True)
    for run in (1, 2):
        rig.start(node1)
        pid = rig.pid
        control(node1, rig)
        assert rig.alive() and rig.pid == pid, rig.daemon.log()[-2000:]
        assert rig.bad_messages() == 1  # the retained message, once per run
        assert sum(s["rejected"] for s in rig.bad_input("node-1")) == run
        assert rig.stop() == 0  # a clean exit on SIGTERM, not a crash
    node1.publish("status", b"", retain=True)


WRONG_TYPES = [
    ("events/xid", event_with("node-1", id="bad-ts", ts="yesterday")),
    ("events/xid", event_with("node-1", id="bad-severity", severity="apocalyptic")),
    ("events/xid", event_with("node-1", id="bad-data", data=[1, 2, 3])),
    ("events/xid", event_with("node-1", id="bad-schema", schema=2)),
    ("events/xid", event_with("node-1", id=12345)),
    ("events/xid", b"12345"),
    ("events/xid", b"null"),
    ("events/xid", b'"a string"'),
    ("events/xid", b"[]"),
    ("events/batch", b'{"not": "a list"}'),
    ("status", b'{"schema":1,"node":"node-1","state":1}'),
    ("acks", b'{"schema":1,"directive_id":"d","job":"7","rank":"zero","node":"node-1"}'),
]


def test_wrong_types_are_refused_counted_and_receipted_when_they_have_an_id(
    running: CoordinatorRig, node1: NodeClient
) -> None:
    for suffix, payload in WRONG_TYPES:
        node1.publish(suffix, payload)
    control(node1, running)
    assert running.bad_messages() == len(WRONG_TYPES)
    readable = {"bad-ts", "bad-severity", "bad-data", "bad-schema"}
    wait_until(lambda: readable <= set(node1.rejected), 10, "rejected receipts")
    assert "unsupported schema version 2" in node1.rejected["bad-schema"]
    [summary] = running.bad_input("node-1")
    assert summary["rejected"] == len(WRONG_TYPES)
    assert running.event_ids("node-1").isdisjoint(readable)


def test_batch_of_8_mb_is_refused_unread_and_its_events_receipted_rejected(
    running: CoordinatorRig, node1: NodeClient
) -> None:
    events, size = [], 2
    while size < 8_000_000:
        events.append(make_event("node-1", Kind.GPU_HEALTH, data={"gpu": 1, "util": 97, "pad": "x" * 200}))
        size += len(encode(events[-1])) + 1
    payload = b"[" + b",".join(encode(e) for e in events) + b"]"
    node1.publish("events/batch", payload)
    control(node1, running)
    ids = {e.id for e in events}
    wait_until(lambda: ids <= set(node1.rejected), 20, "every event of the batch receipted as rejected")
    assert running.bad_messages() == 1
    assert running.event_ids("node-1").isdisjoint(ids)
    [summary] = running.bad_input("node-1")
    assert summary["rejected_reasons"] == {"oversized": 1} and summary["largest_bytes"] == len(payload)


def test_flooding_node_is_folded_and_receipted_the_other_node_decided(
    running: CoordinatorRig, broker: Mosquitto
) -> None:
    flood, other = NodeClient(broker.port, "flood-node"), NodeClient(broker.port, "node-2")
    try:
        flood_ids, other_ids, infos = [], [], []
        for i in range(5000):
            event = make_event("flood-node", Kind.GPU_HEALTH, severity=Severity.INFO, data={"i": i})
            flood_ids.append(event.id)
            infos.append(flood.publish("events/gpu_health", encode(event), wait=False))
            if i % 250 == 0:
                event = make_event("node-2", Kind.THERMAL, severity=Severity.INFO, data={"i": i})
                other_ids.append(event.id)
                other.publish("events/thermal", encode(event))
        for info in infos:
            info.wait_for_publish(60)
        wait_until(lambda: set(flood_ids) <= flood.committed, 60, "every flood event receipted")
        wait_until(lambda: set(other_ids) <= running.event_ids("node-2"), 30, "node-2's events decided")
        assert not flood.rejected
        stored = running.event_ids("flood-node")
        folded = sum(s["folded"] for s in running.bad_input("flood-node"))
        assert stored <= set(flood_ids)
        assert folded > 0 and len(stored) + folded == len(flood_ids)
        assert running.bad_input("node-2") == []
        assert running.bad_messages() == 0 and running.alive()
    finally:
        flood.close()
        other.close()


def test_xid_79_slipped_into_an_xid_43_flood_is_decided(running: CoordinatorRig, broker: Mosquitto) -> None:
    """Never fold novelty (issue #25): a node floods Xid 43 at severity error, past its burst and its
    urgent reserve (2,000 tokens by default), and one Xid 79 goes out in the middle of it. The 79 is
    decided (stored, its drain asked for); the rest of the flood is folded and counted, exactly."""
    flood = NodeClient(broker.port, "flood-node")
    try:
        sent, infos = [], []
        for i in range(4000):
            if i == 3000:
                event = make_event(
                    "flood-node", Kind.XID, severity=Severity.ERROR, data={"code": 79, "gpu": 3}
                )
                fatal = event
            else:
                event = make_event("flood-node", Kind.XID, severity=Severity.ERROR, data={"code": 43, "i": i})
            sent.append(event.id)
            infos.append(flood.publish("events/xid", encode(event), wait=False))
        for info in infos:
            info.wait_for_publish(60)
        wait_until(lambda: set(sent) <= flood.committed, 60, "every flood event receipted")
        stored = running.event_ids("flood-node")
        folded = sum(s["folded"] for s in running.bad_input("flood-node"))
        assert fatal.id in stored  # decided, though far over the node's rate and reserve
        assert folded > 0 and len(stored) + folded == len(sent)
        # Its drain, asked for; scheduler "none" turns it into a notification saying so (fallback.py)
        sql = (
            "SELECT kind, json_extract(request, '$.params.instead_of') FROM actions"
            " WHERE json_extract(request, '$.event_id') = ?"
        )
        assert running.rows(sql, (fatal.id,)) == [("notify", "drain_node")]
        assert running.bad_messages() == 0 and running.alive()
    finally:
        flood.close()
