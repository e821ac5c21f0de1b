"""Build the configured bus for a daemon (credentials, TLS, will and birth)."""

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
    tls: ssl.SSLContext | None = None
    if cfg.tls:
        tls = ssl.create_default_context(cafile=cfg.ca_file)
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
