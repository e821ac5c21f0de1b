"""An embedded MQTT 3.1.1 broker (amqtt) for ``ftd demo`` and single-machine use.

When no broker is configured (``bus.embedded = true``) the process that needs one starts it on
loopback. It allows anonymous clients and therefore refuses any address but loopback: a real
cluster runs Mosquitto (or another broker) with per-node credentials (deploy/mosquitto).

A late acknowledgement is no error: amqtt waits 5 s for a QoS 1 PUBACK, then fails the delivery
task it never awaits, and asyncio printed a "Task exception was never retrieved" traceback per
message -- 16-22 on a clean ``ftd demo --serve`` start whenever the coordinator (it acknowledges what
it has handled) was slow to start on a loaded machine. The message was delivered; only its
acknowledgement came late. amqtt's broadcast loop also logs it ("Task failed and will be skipped",
with the traceback). While the broker runs, both are counted (:attr:`EmbeddedBroker.late_acks`) and
logged at debug level; every other error asyncio reports goes to the handler that was there, and every
other record of amqtt's logger is kept.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from typing import Any

from amqtt.broker import Broker

from ftd.logs import get_logger

log = get_logger(__name__)
LATE_ACK = "Timeout waiting for PUBACK"  # amqtt's message when a subscriber acknowledged late


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
        self.late_acks = 0  # QoS 1 deliveries acknowledged after amqtt's 5 s (delivered all the same)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handler: Any = None

    async def start(self) -> EmbeddedBroker:
        # amqtt logs every connection at INFO; keep the demo's timeline readable.
        logging.getLogger("amqtt").setLevel(logging.ERROR)
        config = {
            "listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{self.port}"}},
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
        }
        self._broker = Broker(config)
        await self._broker.start()
        self._loop = asyncio.get_running_loop()
        self._handler = self._loop.get_exception_handler()
        self._loop.set_exception_handler(self._unretrieved)
        logging.getLogger("amqtt.broker").addFilter(self._late_ack_record)
        return self

    def _late_ack_record(self, record: logging.LogRecord) -> bool:
        """amqtt's own report of the same late PUBACK (its broadcast loop logs "Task failed and will be
        skipped" with the traceback): counted like the unretrieved one, not printed. Other records pass."""
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, TimeoutError) and str(error).startswith(LATE_ACK):
            self.late_acks += 1
            log.debug("embedded_broker_late_ack", error=str(error), late_acks=self.late_acks)
            return False
        return True

    def _unretrieved(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """asyncio's report of a task error nobody awaited: amqtt's late PUBACK counted (see the
        module docstring), anything else passed on."""
        error = context.get("exception")
        if isinstance(error, TimeoutError) and str(error).startswith(LATE_ACK):
            self.late_acks += 1
            log.debug("embedded_broker_late_ack", error=str(error), late_acks=self.late_acks)
            return
        if self._handler is not None:
            self._handler(loop, context)
        else:
            loop.default_exception_handler(context)

    async def stop(self) -> None:
        logging.getLogger("amqtt.broker").removeFilter(self._late_ack_record)
        if self._broker is not None:
            await self._broker.shutdown()
            self._broker = None
        if self._loop is not None and self._loop.get_exception_handler() == self._unretrieved:
            self._loop.set_exception_handler(self._handler)
        self._loop = None
