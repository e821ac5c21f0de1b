"""A real Mosquitto with the shipped deploy config (deploy/mosquitto: ACL, per-node passwords), and
MQTT clients (ftd's own bus) speaking as one node or as the coordinator, for the security tests.

The broker setup is the contract test's (tests/contract/test_mosquitto_acl.py), reused: the password
file is made with ``mosquitto_passwd``, the ACL is the shipped one plus a test-only read-everything
``observer`` user.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ftd.bus.base import Message
from ftd.bus.mqtt import MqttBus
from tests.contract.test_mosquitto_acl import (
    DEPLOY,
    OBSERVER_ACL,
    _chown_for_broker,
    _mosquitto_dir,
    deploy_conf_lines,
    make_passwd,
)
from tests.realparts import Mosquitto

USERS = {
    "node-1": "pw-node-1",
    "node-2": "pw-node-2",
    "coordinator": "pw-coordinator",
    "observer": "pw-observer",
}


@contextmanager
def deploy_broker() -> Iterator[Mosquitto]:
    """Mosquitto on loopback with deploy/mosquitto's config, ACL and one password per user."""
    workdir = _mosquitto_dir()
    try:
        make_passwd(workdir, USERS)
        (workdir / "acl").write_text((DEPLOY / "acl").read_text() + OBSERVER_ACL)
        _chown_for_broker(workdir / "acl")
        (workdir / "broker").mkdir()
        _chown_for_broker(workdir / "broker")
        broker = Mosquitto(workdir / "broker", extra_conf=deploy_conf_lines(workdir)).start()
        try:
            yield broker
        finally:
            broker.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def node_bus(broker: Mosquitto, user: str, **options: object) -> MqttBus:
    """An MQTT bus authenticated as ``user`` (client ids are the user names on this broker)."""
    return MqttBus(
        host="127.0.0.1",
        port=broker.port,
        client_id=f"ftd-{user}",
        username=user,
        password=USERS[user],
        clean_session=True,
        keepalive_s=2,
        reconnect_max_s=1.0,
        **options,  # type: ignore[arg-type]
    )


class Inbox:
    """Collects what a started bus receives, in a background task."""

    def __init__(self, bus: MqttBus) -> None:
        self.bus = bus
        self.got: list[Message] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self, *patterns: str) -> Inbox:
        for pattern in patterns:
            await self.bus.subscribe(pattern)
        await self.bus.start()
        assert await self.bus.wait_connected(10), "bus did not connect"
        self._task = asyncio.create_task(self._collect())
        return self

    async def _collect(self) -> None:
        async for message in self.bus.messages():
            self.got.append(message)

    def on(self, topic: str) -> list[Message]:
        return [m for m in self.got if m.topic == topic]

    async def wait(self, predicate: Callable[[], bool], timeout: float = 10.0, what: str = "it") -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            if loop.time() > deadline:
                topics = sorted({m.topic for m in self.got})
                raise AssertionError(f"timed out after {timeout}s waiting for {what}; got topics {topics}")
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.bus.stop()
