"""Issue #11, broker identity: mutual TLS on a real Mosquitto, with the shipped TLS listener.

Certificates are made in a temp dir by ``scripts/make-certs.sh`` (the operator's tool); the broker
runs deploy/mosquitto's config, ACL and TLS listener block (``require_certificate``,
``use_identity_as_username``) on loopback; ftd's own clients are built by
:func:`ftd.bus.factory.make_mqtt_bus` from a ``[bus]`` config with ``cert_file``/``key_file``, as
the daemons build theirs. Findings reproduced: nodes could authenticate by password only (no client
certificate settings; the TLS listener was commented out, the plain one on every interface).

- a valid certificate connects and publishes; the identity is the certificate's CN: node-1's
  certificate cannot publish or read as node-2, even when it sends node-2's username and password;
- no certificate, an expired one, or one from an unknown CA: refused in the handshake;
- a node's certificate connecting with the coordinator's client id does not take over its session;
- ``check-config`` checks ``cert_file``/``key_file`` (missing, unpaired, mismatched key, an agent's
  certificate naming another node).
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ftd.bus import topics
from ftd.bus.factory import make_mqtt_bus
from ftd.bus.mqtt import MqttBus
from ftd.commands.config_check import check_references
from ftd.config import AgentConfig, BusConfig, Config
from tests.contract.test_mosquitto_acl import (
    DEPLOY,
    OBSERVER_ACL,
    _chown_for_broker,
    _mosquitto_dir,
    deploy_conf_lines,
    deploy_tls_listener,
    make_passwd,
)
from tests.e2e.daemons import Daemon
from tests.realparts import Mosquitto, free_port, require_binary, wait_port
from tests.security.bus import USERS, Inbox

pytestmark = pytest.mark.real

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make-certs.sh"
CONNACK_OK = b"\x20\x02\x00\x00"  # MQTT 3.1.1 CONNACK, session present 0, return code 0


@dataclass
class Pki:
    dir: Path  # ca.crt, server.*, and a certificate per user (CN = user)
    expired: Path  # node-1's certificate, same CA, already expired
    foreign: Path  # node-1's certificate from another CA

    def cert(self, name: str) -> tuple[str, str]:
        return str(self.dir / f"{name}.crt"), str(self.dir / f"{name}.key")


def make_certs(directory: Path, *args: str) -> None:
    subprocess.run([str(SCRIPT), "-d", str(directory), *args], check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    require_binary("openssl", package="openssl")
    base = tmp_path_factory.mktemp("pki")
    main, expired, foreign = base / "main", base / "expired", base / "foreign"
    make_certs(main, "ca")
    make_certs(main, "server", "localhost", "127.0.0.1")
    make_certs(main, "client", *USERS)
    expired.mkdir()
    for name in ("ca.crt", "ca.key"):
        shutil.copy(main / name, expired / name)
    make_certs(expired, "-D", "-1", "client", "node-1")
    make_certs(foreign, "ca")
    make_certs(foreign, "client", "node-1")
    return Pki(main, expired, foreign)


@dataclass
class TlsBroker:
    broker: Mosquitto
    tls_port: int


@pytest.fixture(scope="module")
def tls_broker(pki: Pki) -> Iterator[TlsBroker]:
    workdir = _mosquitto_dir()
    try:
        make_passwd(workdir, USERS)
        (workdir / "acl").write_text((DEPLOY / "acl").read_text() + OBSERVER_ACL)
        _chown_for_broker(workdir / "acl")
        (workdir / "broker").mkdir()
        _chown_for_broker(workdir / "broker")
        port = free_port()
        conf = deploy_conf_lines(workdir) + deploy_tls_listener(port, pki.dir)
        assert "require_certificate true" in conf and "use_identity_as_username true" in conf
        broker = Mosquitto(workdir / "broker", extra_conf=conf).start()
        try:
            wait_port(port)
            yield TlsBroker(broker, port)
        finally:
            broker.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def connect_packet(client_id: str) -> bytes:
    """An MQTT 3.1.1 CONNECT with a clean session and no credentials."""
    cid = client_id.encode()
    body = b"\x00\x04MQTT\x04\x02\x00\x0a" + len(cid).to_bytes(2, "big") + cid
    return bytes([0x10, len(body)]) + body


def tls_connect(port: int, ca: str, cert: tuple[str, str] | None) -> bytes | str:
    """Open TLS with ``cert`` (or none), send CONNECT; the first 4 bytes back, or the error."""
    context = ssl.create_default_context(cafile=ca)
    if cert is not None:
        context.load_cert_chain(*cert)
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
        ):
            conn.sendall(connect_packet("probe"))
            return conn.recv(4)
    except (ssl.SSLError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"


def verify(ca: str, cert: str) -> str:
    """``openssl verify`` of ``cert`` against ``ca``: its output."""
    proc = subprocess.run(["openssl", "verify", "-CAfile", ca, cert], capture_output=True, text=True)
    return proc.stdout + proc.stderr


def bus_as(tls: TlsBroker, pki: Pki, name: str, **overrides: object) -> MqttBus:
    """A bus built as the daemons build theirs: ``[bus] tls``, ``ca_file``, ``cert_file``, ``key_file``."""
    cert, key = pki.cert(name)
    options: dict[str, object] = {
        "host": "127.0.0.1",
        "port": tls.tls_port,
        "tls": True,
        "ca_file": str(pki.dir / "ca.crt"),
        "cert_file": cert,
        "key_file": key,
        "keepalive_s": 2,
        "reconnect_max_s": 1.0,
        **overrides,
    }
    client_id = str(options.pop("client_id_", f"ftd-{name}"))
    clean = bool(options.pop("clean_session", True))
    return make_mqtt_bus(BusConfig(**options), client_id=client_id, clean_session=clean)  # type: ignore[arg-type]


def test_valid_certificate_is_accepted_and_none_expired_or_foreign_refused(tls: TlsBroker, pki: Pki) -> None:
    ca = str(pki.dir / "ca.crt")
    assert tls_connect(tls.tls_port, ca, pki.cert("node-1")) == CONNACK_OK
    old = (str(pki.expired / "node-1.crt"), str(pki.expired / "node-1.key"))
    alien = (str(pki.foreign / "node-1.crt"), str(pki.foreign / "node-1.key"))
    # The fixtures are what they claim: same CA but expired; a chain to another CA.
    assert "certificate has expired" in verify(ca, old[0])
    assert "unable to get local issuer certificate" in verify(ca, alien[0])
    # Each is refused in the TLS handshake: no CONNACK, an SSL error (the broker's alert -- expired,
    # unknown ca, certificate required -- when it is read before the connection closes; TLS 1.3
    # sends it after the client's side of the handshake).
    for what, cert in {"no certificate": None, "expired": old, "unknown CA": alien}.items():
        got = tls_connect(tls.tls_port, ca, cert)
        assert isinstance(got, str) and got.startswith("SSL"), f"{what}: {got!r}"


async def test_certificate_cn_is_the_identity_for_publish_and_read(tls: TlsBroker, pki: Pki) -> None:
    observer = await Inbox(bus_as(tls, pki, "observer")).start("ftd/v1/nodes/#")
    # node-1's certificate, claiming node-2's username and password on the TLS listener.
    node1 = await Inbox(bus_as(tls, pki, "node-1", username="node-2", password=USERS["node-2"])).start(
        topics.node_job_directives("node-2"), topics.node_job_directives("node-1")
    )
    coordinator = bus_as(tls, pki, "coordinator")
    await coordinator.start()
    assert await coordinator.wait_connected(10)
    try:
        await node1.bus.publish(topics.node_event("node-2", "xid"), b"forged as node-2")
        await node1.bus.publish(topics.node_status("node-2"), b"forged status")
        await node1.bus.publish(topics.node_event("node-1", "xid"), b"node-1 ok")
        await observer.wait(lambda: any(m.payload == b"node-1 ok" for m in observer.got), 10, "the control")
        events = [(m.topic, m.payload) for m in observer.got if "/events/" in m.topic or "/status" in m.topic]
        assert events == [(topics.node_event("node-1", "xid"), b"node-1 ok")]

        await coordinator.publish(topics.node_job_directives("node-2"), b"save on node-2")
        await coordinator.publish(topics.node_job_directives("node-1"), b"save on node-1")
        await node1.wait(lambda: bool(node1.got), 10, "node-1's own directive")
        assert [(m.topic, m.payload) for m in node1.got] == [
            (topics.node_job_directives("node-1"), b"save on node-1")
        ]
    finally:
        await coordinator.stop()
        await node1.close()
        await observer.close()


async def test_a_nodes_certificate_cannot_take_over_the_coordinators_session(
    tls: TlsBroker, pki: Pki
) -> None:
    coordinator = await Inbox(bus_as(tls, pki, "coordinator", client_id_="ftd-coordinator")).start(
        topics.ALL_NODE_EVENTS
    )
    intruder = bus_as(tls, pki, "node-1", client_id_="ftd-coordinator", clean_session=True)
    await intruder.start()
    try:
        assert await intruder.wait_connected(10)  # let in ... as node-1, not as the coordinator
        await intruder.publish(topics.node_event("node-1", "xid"), b"after the intruder connected")
        await coordinator.wait(lambda: bool(coordinator.got), 10, "the event, on the coordinator's session")
        await asyncio.sleep(0.3)
        assert coordinator.bus.connects == 1  # never kicked off (a takeover disconnects the holder)
        assert coordinator.bus.connected
    finally:
        await intruder.stop()
        await coordinator.close()


def test_check_config_checks_client_certificate_files(pki: Pki, tmp_path: Path) -> None:
    cert, key = pki.cert("node-1")
    ca = str(pki.dir / "ca.crt")

    def problems(**bus: object) -> dict[str, str]:
        config = Config(bus=BusConfig(**bus))  # type: ignore[arg-type]
        found = check_references(config, roles=())
        return {p.path: p.message for p in found}

    assert problems(tls=True, ca_file=ca, cert_file=cert, key_file=key) == {}
    missing = problems(tls=True, ca_file=ca, cert_file=str(tmp_path / "nope.crt"), key_file=key)
    assert list(missing) == ["bus.cert_file"] and "nope.crt" in missing["bus.cert_file"]
    assert list(problems(tls=True, cert_file=cert)) == ["bus.cert_file"]  # no key_file
    assert list(problems(tls=True, key_file=key)) == ["bus.key_file"]
    assert set(problems(tls=False, cert_file=cert, key_file=key)) == {"bus.cert_file", "bus.key_file"}
    other_cert, other_key = pki.cert("node-2")
    mismatch = problems(tls=True, ca_file=ca, cert_file=cert, key_file=other_key)
    assert list(mismatch) == ["bus.cert_file"] and "does not load" in mismatch["bus.cert_file"]

    # An agent's certificate must name its node: the broker would know it by the CN.
    def agent_cert_problem(node: str, cert_file: str, key_file: str) -> str | None:
        bus = BusConfig(tls=True, ca_file=ca, cert_file=cert_file, key_file=key_file)
        config = Config(bus=bus, agent=AgentConfig(node=node))
        found = {p.path: p.message for p in check_references(config, roles=("agent",))}
        return found.get("bus.cert_file")

    assert agent_cert_problem("node-1", cert, key) is None
    wrong = agent_cert_problem("node-1", other_cert, other_key)
    assert wrong is not None and "'node-2'" in wrong and "'node-1'" in wrong


@pytest.fixture(scope="module")
def tls(tls_broker: TlsBroker) -> TlsBroker:
    return tls_broker


async def test_ftd_agent_daemon_connects_with_its_certificate_and_refuses_another_nodes(
    tls: TlsBroker, pki: Pki, tmp_path: Path
) -> None:
    """``ftd agent`` from a config file with ``cert_file``/``key_file``: it connects over mutual TLS
    and its retained ``online`` status reaches the broker; with another node's certificate it does
    not start at all (exit 2, the CN named), instead of running with every event dropped."""
    observer = await Inbox(bus_as(tls, pki, "observer")).start(topics.node_status("node-1"))
    run_dir = Path(tempfile.mkdtemp(prefix="ftd-mtls-", dir="/tmp"))  # short unix socket path

    def agent(name: str, cert: str) -> Daemon:
        (tmp_path / "kmsg").touch()
        return Daemon(
            name,
            f"""[bus]
host = "127.0.0.1"
port = {tls.tls_port}
tls = true
ca_file = "{pki.dir / "ca.crt"}"
cert_file = "{pki.dir / f"{cert}.crt"}"
key_file = "{pki.dir / f"{cert}.key"}"
keepalive_s = 2

[agent]
node = "node-1"
kmsg_path = "{tmp_path / "kmsg"}"
state_dir = "{tmp_path / name}"
socket_path = "{run_dir / f"{name}.sock"}"

[agent.nvml]
enabled = false

[log]
json = true
""",
            tmp_path,
        )

    wrong = agent("agent-wrong", "node-2").start()
    good = agent("agent-node-1", "node-1")
    try:
        assert wrong.proc is not None and wrong.proc.wait(30) == 2
        assert "CN is 'node-2'" in wrong.log()
        good.start()

        def online() -> bool:
            return any(b'"online"' in m.payload for m in observer.got)

        await observer.wait(online, 20, "node-1's online status over mutual TLS")
    finally:
        good.stop()
        await observer.close()
        shutil.rmtree(run_dir, ignore_errors=True)
