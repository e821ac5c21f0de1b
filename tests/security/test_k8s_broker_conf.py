"""The broker deploy/kubernetes ships is a working, locked Mosquitto (issue #12): the ConfigMap's
``mosquitto.conf`` and ``acl``, verbatim but for the pod paths (moved to a temp dir) and the port,
run by a real Mosquitto 2.0 with certificates from ``scripts/make-certs.sh``.

- Mosquitto opens the TLS listener only (no default plain listener on 1883);
- a client without a certificate is refused in the TLS handshake; node-1's certificate is accepted;
- the coordinator (CN coordinator) hears node-1's status, and never a directive node-1 tries to
  publish (the ACL: a node may not write directives).
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]

from ftd.bus import topics
from ftd.bus.mqtt import MqttBus
from tests.realparts import free_port, require_binary, wait_port
from tests.security.bus import Inbox
from tests.security.test_mtls import CONNACK_OK, make_certs, tls_connect

pytestmark = pytest.mark.real

REPO = Path(__file__).resolve().parents[2]


def configmap() -> dict[str, str]:
    for doc in yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "base" / "mosquitto.yaml").read_text()):
        if doc and doc["kind"] == "ConfigMap":
            data: dict[str, str] = doc["data"]
            return data
    raise AssertionError("no ConfigMap in mosquitto.yaml")


@pytest.fixture(scope="module")
def k8s_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path, Path]]:
    binary = require_binary("mosquitto", package="mosquitto")
    require_binary("openssl", package="openssl")
    base = tmp_path_factory.mktemp("k8s-broker")
    certs, config, data = base / "certs", base / "config", base / "data"
    make_certs(certs, "ca")
    make_certs(certs, "server", "localhost", "127.0.0.1")
    make_certs(certs, "client", "node-1", "coordinator")
    config.mkdir()
    data.mkdir()
    cm = configmap()
    port = free_port()
    conf = (
        cm["mosquitto.conf"]
        .replace("/mosquitto/config/", f"{config}/")
        .replace("/mosquitto/certs/", f"{certs}/")
        .replace("/mosquitto/data/", f"{data}/")
        .replace("listener 8883", f"listener {port} 127.0.0.1")
    )
    (config / "acl").write_text(cm["acl"])
    (config / "mosquitto.conf").write_text(conf + "user root\n")  # the test runs it as root
    log = (base / "mosquitto.log").open("ab")
    proc = subprocess.Popen([binary, "-c", str(config / "mosquitto.conf")], stdout=log, stderr=log)
    try:
        wait_port(port)
        yield port, certs, base / "mosquitto.log"
    finally:
        proc.terminate()
        proc.wait(10)


def tls_bus(port: int, certs: Path, user: str) -> MqttBus:
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    context.load_cert_chain(str(certs / f"{user}.crt"), str(certs / f"{user}.key"))
    return MqttBus(
        host="127.0.0.1",
        port=port,
        client_id=f"ftd-{user}",
        clean_session=True,
        keepalive_s=2,
        reconnect_max_s=1.0,
        tls_context=context,
    )


def test_only_clients_with_a_certificate_connect(k8s_broker: tuple[int, Path, Path]) -> None:
    port, certs, log = k8s_broker
    opened = [line for line in log.read_text().splitlines() if "listen socket on port" in line]
    assert opened and all(line.endswith(f"port {port}.") for line in opened), opened  # TLS listener only
    ca = str(certs / "ca.crt")
    assert tls_connect(port, ca, None) != CONNACK_OK
    assert tls_connect(port, ca, (str(certs / "node-1.crt"), str(certs / "node-1.key"))) == CONNACK_OK


async def test_the_acl_holds_node_status_through_directives_refused(
    k8s_broker: tuple[int, Path, Path],
) -> None:
    port, certs, _ = k8s_broker
    coordinator = await Inbox(tls_bus(port, certs, "coordinator")).start("ftd/v1/#")
    node = tls_bus(port, certs, "node-1")
    await node.start()
    try:
        assert await node.wait_connected(10)
        await node.publish(topics.node_directives("node-2"), b'{"forged": true}')
        await node.publish(topics.node_status("node-1"), b'{"node": "node-1", "state": "online"}')
        await coordinator.wait(
            lambda: bool(coordinator.on(topics.node_status("node-1"))), what="node-1 status"
        )
        await asyncio.sleep(0.3)
        assert coordinator.on(topics.node_directives("node-2")) == []
    finally:
        await node.stop()
        await coordinator.close()
