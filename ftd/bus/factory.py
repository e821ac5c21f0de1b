"""Build the configured bus for a daemon (credentials, TLS, will and birth).

TLS (``[bus] tls = true``): the broker is verified against ``ca_file`` (or the system CAs), host
name included. With ``cert_file`` and ``key_file`` the daemon also presents a client certificate
(mutual TLS): with ``deploy/mosquitto``'s TLS listener (``require_certificate``,
``use_identity_as_username``) the certificate's CN is the identity the broker's ACL knows the client
by -- the node name, or ``coordinator`` -- so no password crosses the network and a node's
certificate cannot act as another node. ``scripts/make-certs.sh`` makes the CA and certificates.
"""

from __future__ import annotations

import ssl

from ftd.bus.base import LastWill, Message
from ftd.bus.mqtt import MqttBus
from ftd.config import BusConfig, resolve_password


def make_mqtt_bus(
    cfg: BusConfig,
    *,
    client_id: str,
    will: LastWill | None = None,
    birth: Message | None = None,
    port: int | None = None,
    clean_session: bool = False,
    manual_ack: bool = False,
) -> MqttBus:
    tls = tls_context(cfg)
    return MqttBus(
        host=cfg.host,
        port=port or cfg.port,
        client_id=cfg.client_id or client_id,
        username=cfg.username,
        password=resolve_password(cfg),
        tls_context=tls,
        keepalive_s=cfg.keepalive_s,
        will=will,
        birth=birth,
        reconnect_min_s=cfg.reconnect_min_s,
        reconnect_max_s=cfg.reconnect_max_s,
        clean_session=clean_session,
        manual_ack=manual_ack,
    )


def tls_context(cfg: BusConfig) -> ssl.SSLContext | None:
    """The client TLS context of ``cfg`` (None without ``tls``): verifies the broker against
    ``ca_file`` and, with ``cert_file``/``key_file``, presents that client certificate. A file that
    does not load raises :class:`ssl.SSLError` or :class:`OSError` (``check-config`` reports it
    first)."""
    if not cfg.tls:
        return None
    context = ssl.create_default_context(cafile=cfg.ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cfg.cert_file is not None:
        context.load_cert_chain(cfg.cert_file, cfg.key_file)
    return context
