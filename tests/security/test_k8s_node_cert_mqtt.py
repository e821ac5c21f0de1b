"""A node certificate issued through the Kubernetes CSR flow is the node's identity on a real Mosquitto.

The shipped broker (deploy/mosquitto config and ACL, mutual TLS, ``use_identity_as_username``) is
started by tests/e2e/tls_broker.py with the CA of scripts/make-certs.sh; that CA is the node CA the
signer holds. The agent's request and ``ftd cert-signer`` run against the fake Kubernetes API
(tests/contract/test_kubernetes_node_certs.py). With the issued certificate, the node publishes on
its own topics (the coordinator receives them) and cannot publish as another node.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ftd.bus import topics
from ftd.bus.factory import make_mqtt_bus
from ftd.config import BusConfig
from tests.contract.test_kubernetes_node_certs import NODE, cluster, issue_with_signer
from tests.e2e.tls_broker import tls_broker
from tests.security.bus import Inbox

pytestmark = pytest.mark.real


async def test_the_issued_certificate_is_the_nodes_identity_on_the_broker(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    with tls_broker(pki, ["coordinator"]) as tls:
        async with cluster(tmp_path) as c:
            # the signer's node CA is the broker's client CA
            for name in ("ca.crt", "ca.key"):
                shutil.copy(pki / name, c.ca_dir / name)
            cert, key = await issue_with_signer(c, "agent", NODE, tmp_path / "tls")

        def bus(cert_file: Path, key_file: Path, client_id: str) -> Inbox:
            cfg = BusConfig(
                host="127.0.0.1",
                port=tls.tls_port,
                tls=True,
                ca_file=str(tls.ca),
                cert_file=str(cert_file),
                key_file=str(key_file),
                keepalive_s=2,
                reconnect_max_s=1.0,
            )
            return Inbox(make_mqtt_bus(cfg, client_id=client_id, clean_session=True))

        coordinator = await bus(*tls.cert("coordinator"), "ftd-coordinator").start("ftd/v1/nodes/#")
        node = await bus(cert, key, f"ftd-{NODE}").start()
        try:
            await node.bus.publish(topics.node_event("gpu-a018", "xid"), b"forged as gpu-a018")
            await node.bus.publish(topics.node_event(NODE, "xid"), b"from gpu-a017")
            await coordinator.wait(
                lambda: bool(coordinator.on(topics.node_event(NODE, "xid"))), 10, "the event"
            )
            got = [(m.topic, m.payload) for m in coordinator.got if "/events/" in m.topic]
            assert got == [(topics.node_event(NODE, "xid"), b"from gpu-a017")]
        finally:
            await node.close()
            await coordinator.close()
