"""An embedded MQTT 3.1.1 broker (amqtt) for ``ftd demo`` and single-machine use.

When no broker is configured (``bus.embedded = true``) the process that needs one starts it on
loopback. It allows anonymous clients and therefore refuses any address but loopback: a real
cluster runs Mosquitto (or another broker) with per-node credentials (deploy/mosquitto).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from typing import Any

from amqtt.broker import Broker


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class EmbeddedBroker:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        if not ipaddress.ip_address(host).is_loopback:
            raise ValueError(
                f"the embedded broker allows anonymous clients: it binds loopback only, not {host}"
            )
        self.host = host
        self.port = port or _free_port(host)
        self._broker: Any = None

    async def start(self) -> EmbeddedBroker:
        # amqtt logs every connection at INFO; keep the demo's timeline readable.
        logging.getLogger("amqtt").setLevel(logging.ERROR)
        config = {
            "listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{self.port}"}},
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
        }
        self._broker = Broker(config)
        await self._broker.start()
        return self

    async def stop(self) -> None:
        if self._broker is not None:
            await self._broker.shutdown()
            self._broker = None
