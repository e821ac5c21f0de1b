"""The shipped Mosquitto security config (deploy/mosquitto) against a real Mosquitto 2.0 broker.

docs/architecture.md §11.4: node credentials cannot publish as another node or send directives. Mosquitto
drops an unauthorized publish silently under MQTT 3.1.1, so every "cannot" below is asserted by non-delivery,
with a permitted publish from the same client sent *after* the forbidden ones as a positive control: QoS 1
messages from one publisher arrive in order, so once the control arrives the forbidden ones would have arrived
too.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import queue
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from ftd.bus import topics
from tests.realparts import Mosquitto, require_binary

pytestmark = pytest.mark.real

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "mosquitto"
#: Under the coordinator's ``ftd/v1/actions/#`` grant in the shipped ACL (no ftd code publishes there).
ACTIONS_TOPIC = "ftd/v1/actions/a1/started"
USERS = {
    "node-1": "pw-node-1",
    "node-2": "pw-node-2",
    "coordinator": "pw-coordinator",
    "observer": "pw-observer",
}
# Test-only ACL lines: a read-everything user that watches what arrives. Client ids are bound to
# usernames (use_username_as_clientid), so a second "coordinator" client would replace the first.
OBSERVER_ACL = "\n# test only\nuser observer\ntopic read ftd/v1/#\n"
# Lines of deploy/mosquitto.conf that tests.realparts.Mosquitto sets itself (port, loopback, temp dir).
_OWN_KEYS = {"listener", "persistence", "persistence_location", "log_dest"}


def _mosquitto_dir() -> Path:
    """A temp dir the broker can read after dropping root to the ``mosquitto`` user (Mosquitto 2.0
    reads password and ACL files after the drop; pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="ftd-mqacl-"))
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam("mosquitto")
        except KeyError:
            return path
        os.chown(path, pw.pw_uid, pw.pw_gid)
    return path


def _chown_for_broker(path: Path) -> None:
    if os.geteuid() == 0:
        with contextlib.suppress(LookupError):  # no mosquitto user: the broker keeps running as root
            shutil.chown(path, "mosquitto", "mosquitto")


def _deploy_conf() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(key, value) pairs of deploy/mosquitto.conf: the general part (up to the second ``listener``)
    and the TLS listener block (from it to the end; its settings belong to that listener)."""
    general: list[tuple[str, str]] = []
    tls: list[tuple[str, str]] = []
    listeners = 0
    for raw in (DEPLOY / "mosquitto.conf").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition(" ")
        listeners += key == "listener"
        (tls if listeners >= 2 else general).append((key, value))
    return general, tls


def deploy_conf_lines(workdir: Path) -> list[str]:
    """deploy/mosquitto.conf minus what the test broker sets (and minus its TLS listener: see
    :func:`deploy_tls_listener`), with file paths pointed into workdir."""
    lines = []
    for key, value in _deploy_conf()[0]:
        if key in _OWN_KEYS:
            continue
        if key in {"password_file", "acl_file"}:
            value = str(workdir / Path(value).name)
        lines.append(f"{key} {value}")
    return lines


def deploy_plain_listener() -> str:
    """The value of deploy/mosquitto.conf's plain-MQTT ``listener`` line."""
    return next(value for key, value in _deploy_conf()[0] if key == "listener")


def deploy_tls_listener(port: int, certs: Path) -> list[str]:
    """deploy/mosquitto.conf's TLS listener block, on 127.0.0.1:``port`` with its CA, certificate and
    key taken from ``certs`` (same file names)."""
    lines = []
    for key, value in _deploy_conf()[1]:
        if key == "listener":
            value = f"{port} 127.0.0.1"
        elif key in {"cafile", "certfile", "keyfile"}:
            value = str(certs / Path(value).name)
        lines.append(f"{key} {value}")
    return lines


def make_passwd(workdir: Path, users: dict[str, str]) -> Path:
    binary = require_binary("mosquitto_passwd", package="mosquitto")
    path = workdir / "passwd"
    path.unlink(missing_ok=True)
    for i, (user, password) in enumerate(users.items()):
        args = [binary, *(["-c"] if i == 0 else []), "-b", str(path), user, password]
        subprocess.run(args, check=True, capture_output=True)
    path.chmod(0o600)
    _chown_for_broker(path)
    return path


@pytest.fixture(scope="module")
def broker() -> Iterator[Mosquitto]:
    workdir = _mosquitto_dir()
    try:
        make_passwd(workdir, USERS)
        (workdir / "acl").write_text((DEPLOY / "acl").read_text() + OBSERVER_ACL)
        _chown_for_broker(workdir / "acl")
        conf = deploy_conf_lines(workdir)
        assert "allow_anonymous false" in conf and any(c.startswith("acl_file ") for c in conf)
        b = Mosquitto(workdir / "broker", extra_conf=conf)
        (workdir / "broker").mkdir()
        _chown_for_broker(workdir / "broker")
        b.start()
        try:
            yield b
        finally:
            b.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class Client:
    """A paho MQTT 3.1.1 client that records what it receives."""

    def __init__(
        self,
        port: int,
        user: str | None,
        password: str | None = None,
        *,
        client_id: str | None = None,
        clean_session: bool = True,
    ) -> None:
        self.messages: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self.connack: queue.Queue[ReasonCode] = queue.Queue()
        self.subacks: queue.Queue[list[ReasonCode]] = queue.Queue()
        self.c = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id or f"t-{uuid.uuid4().hex[:10]}",
            protocol=mqtt.MQTTv311,
            clean_session=clean_session,
        )
        if user is not None:
            self.c.username_pw_set(user, password)
        self.c.on_connect = lambda _c, _u, _f, rc, _p: self.connack.put(rc)
        self.c.on_message = lambda _c, _u, msg: self.messages.put((msg.topic, bytes(msg.payload)))
        self.c.on_subscribe = lambda _c, _u, _mid, rcs, _p: self.subacks.put(list(rcs))
        self.c.connect("127.0.0.1", port, keepalive=10)
        self.c.loop_start()
        self.rc = self.connack.get(timeout=5)

    def subscribe(self, pattern: str) -> list[ReasonCode]:
        self.c.subscribe(pattern, qos=1)
        return self.subacks.get(timeout=5)

    def publish(self, topic: str, payload: bytes) -> None:
        self.c.publish(topic, payload, qos=1).wait_for_publish(timeout=5)

    def received_until(self, marker: bytes, timeout: float = 5.0) -> list[tuple[str, bytes]]:
        """Everything received up to and including the message with payload ``marker``."""
        got: list[tuple[str, bytes]] = []
        while True:
            try:
                item = self.messages.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"positive control {marker!r} never arrived; got {got}") from None
            got.append(item)
            if item[1] == marker:
                return got

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


Connect = Callable[..., Client]


@pytest.fixture
def connect(broker: Mosquitto) -> Iterator[Connect]:
    """``connect(user, password=None)``: a client on the shared broker (password from USERS)."""
    opened: list[Client] = []

    def open_client(user: str | None, password: str | None = None, **options: Any) -> Client:
        secret = password if password is not None else USERS.get(user or "")
        client = Client(broker.port, user, secret, **options)
        opened.append(client)
        return client

    yield open_client
    for client in opened:
        client.close()


def test_plain_listener_is_on_loopback_only() -> None:
    """Passwords cross the plain listener in clear text: the shipped config keeps it off the network
    (nodes use the TLS listener, tests/security/test_mtls.py)."""
    assert deploy_plain_listener() == "1883 127.0.0.1"


def test_anonymous_and_wrong_password_refused(connect: Connect) -> None:
    anon = connect(None)
    assert anon.rc.is_failure and str(anon.rc) == "Not authorized"  # 3.1.1 CONNACK 5
    wrong = connect("node-1", "not-the-password")
    assert wrong.rc.is_failure
    assert not connect("node-1").rc.is_failure  # the right password is accepted


def test_node_publishes_only_its_own_subtree(connect: Connect) -> None:
    coord = connect("coordinator")
    assert not coord.rc.is_failure
    assert coord.subscribe("ftd/v1/#")[0].value == 1
    node = connect("node-1")

    allowed = [
        topics.node_status("node-1"),
        topics.node_event("node-1", "xid"),
        topics.node_condition("node-1", "gpu_health"),
        topics.node_job("node-1", "42"),
        topics.node_acks("node-1"),
    ]
    forbidden = [
        topics.node_event("node-2", "xid"),  # as another node
        topics.node_status("node-2"),
        topics.node_job_directives("node-2"),  # directives: coordinator only
        topics.node_directives("node-2"),
        topics.node_directives("node-1"),  # ... even inside its own subtree
        topics.node_job_directives("node-1"),
        "ftd/v1/jobs/X/directives",  # the old shared job topic: nobody's to write
        ACTIONS_TOPIC,
        "ftd/v1/other",
    ]
    for topic in forbidden:
        node.publish(topic, b"forbidden " + topic.encode())
    for topic in allowed:
        node.publish(topic, b"ok " + topic.encode())
    node.publish(topics.node_event("node-1", "marker"), b"control-1")

    got = coord.received_until(b"control-1")
    assert sorted(t for t, _ in got[:-1]) == sorted(allowed)
    assert not [t for t, p in got if p.startswith(b"forbidden")]


def test_coordinator_directives_reach_node_and_only_its_own(connect: Connect) -> None:
    node1 = connect("node-1")
    # The agent's own subscriptions (ftd/agent/inbound.py) are granted ...
    assert [rc.value for rc in node1.subscribe(topics.node_directives("node-1"))] == [1]
    assert [rc.value for rc in node1.subscribe(topics.node_job_directives("node-1"))] == [1]
    # ... and greedy ones may be accepted, but must not deliver other nodes' traffic.
    node1.subscribe("ftd/v1/nodes/node-2/#")  # Mosquitto 2.0.11 grants it (SUBACK 1)
    node1.subscribe("ftd/v1/nodes/+/directives/jobs")
    node1.subscribe("ftd/v1/jobs/#")
    node2 = connect("node-2")
    coord = connect("coordinator")

    node2.publish(topics.node_event("node-2", "xid"), b"node-2 event")
    coord.publish(topics.node_directives("node-2"), b"for node-2")
    coord.publish(topics.node_job_directives("node-2"), b"job 8 save on node-2")
    coord.publish("ftd/v1/jobs/8/directives", b"old shared job topic")  # the coordinator may not
    coord.publish(topics.node_job_directives("node-1"), b"job 7 save")
    coord.publish(topics.node_directives("node-1"), b"for node-1")

    got = node1.received_until(b"for node-1")
    assert got == [
        (topics.node_job_directives("node-1"), b"job 7 save"),
        (topics.node_directives("node-1"), b"for node-1"),
    ]


def test_coordinator_writes_actions_but_not_node_events(connect: Connect) -> None:
    coord = connect("observer")
    coord.subscribe("ftd/v1/#")
    writer = connect("coordinator")
    writer.publish(topics.node_event("node-1", "xid"), b"forged event")
    writer.publish(topics.node_status("node-1"), b"forged status")
    writer.publish(ACTIONS_TOPIC, b"action")

    got = coord.received_until(b"action")
    assert got == [(ACTIONS_TOPIC, b"action")]


def test_add_node_script_then_sighup(tmp_path: Path) -> None:
    """add-node.sh adds credentials to the password file; after SIGHUP the new node can connect and
    publish its own events (and still not another node's)."""
    require_binary("mosquitto_passwd", package="mosquitto")
    workdir = _mosquitto_dir()
    try:
        make_passwd(workdir, {"coordinator": USERS["coordinator"]})
        shutil.copy(DEPLOY / "acl", workdir / "acl")
        _chown_for_broker(workdir / "acl")
        (workdir / "broker").mkdir()
        _chown_for_broker(workdir / "broker")
        b = Mosquitto(workdir / "broker", extra_conf=deploy_conf_lines(workdir)).start()
        try:
            assert b.proc is not None
            pid_file = tmp_path / "mosquitto.pid"
            pid_file.write_text(f"{b.proc.pid}\n")
            bad = subprocess.run(
                [str(DEPLOY / "add-node.sh"), "-f", str(workdir / "passwd"), "coordinator"],
                capture_output=True,
                text=True,
            )
            assert bad.returncode == 2 and "reserved" in bad.stderr
            out = subprocess.run(
                [str(DEPLOY / "add-node.sh"), "-f", str(workdir / "passwd"), "-r", str(pid_file), "node-3"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            password = out.split("password for node-3: ")[1].strip()
            assert len(password) >= 20

            coord = Client(b.port, "coordinator", USERS["coordinator"])
            coord.subscribe("ftd/v1/#")
            clients: list[Client] = [coord]
            try:
                node3 = None
                for _ in range(50):  # SIGHUP is handled asynchronously
                    candidate = Client(b.port, "node-3", password)
                    clients.append(candidate)
                    if not candidate.rc.is_failure:
                        node3 = candidate
                        break
                    time.sleep(0.1)
                assert node3 is not None, "node-3 could not connect after add-node.sh + SIGHUP"
                node3.publish(topics.node_event("node-1", "xid"), b"forged")
                node3.publish(topics.node_event("node-3", "xid"), b"node-3 ok")
                got = coord.received_until(b"node-3 ok")
                assert got == [(topics.node_event("node-3", "xid"), b"node-3 ok")]
            finally:
                for client in clients:
                    client.close()
        finally:
            b.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_receipts_reach_only_their_node_and_only_the_coordinator_writes_them(connect: Connect) -> None:
    node1, node2 = connect("node-1"), connect("node-2")
    assert node1.subscribe(topics.node_receipts("node-1"))[0].value == 1
    node1.subscribe(topics.node_directives("node-1"))
    node2.subscribe(topics.node_receipts("node-1"))  # another node's receipts: refused
    node2.subscribe(topics.node_directives("node-2"))
    node2.publish(topics.node_receipts("node-1"), b"forged receipt")  # dropped by the broker
    node2.publish(topics.node_receipts("node-2"), b"self-receipt")  # also not a node's to write
    coord = connect("coordinator")
    coord.publish(topics.node_receipts("node-1"), b"receipt")
    coord.publish(topics.node_directives("node-1"), b"done-1")
    coord.publish(topics.node_directives("node-2"), b"done-2")
    assert node1.received_until(b"done-1") == [
        (topics.node_receipts("node-1"), b"receipt"),
        (topics.node_directives("node-1"), b"done-1"),
    ]
    assert node2.received_until(b"done-2") == [(topics.node_directives("node-2"), b"done-2")]


def test_a_nodes_credentials_cannot_take_over_the_coordinators_session(connect: Connect) -> None:
    """Reported: a client taking the coordinator's client id with a clean session wiped its broker
    session, so events queued for it were lost. Client ids are the usernames now."""
    coord = connect("coordinator", client_id="ftd-coordinator", clean_session=False)
    coord.subscribe(topics.ALL_NODE_EVENTS)
    coord.close()  # away (a restart): the broker queues node events for its session
    intruder = connect("node-1", client_id="ftd-coordinator", clean_session=True)
    assert not intruder.rc.is_failure  # it is let in ... as "node-1", not as the coordinator
    intruder.close()
    connect("node-2").publish(topics.node_event("node-2", "xid"), b"queued while away")
    back = connect("coordinator", client_id="ftd-coordinator", clean_session=False)  # no resubscribe
    assert back.received_until(b"queued while away") == [
        (topics.node_event("node-2", "xid"), b"queued while away")
    ]
