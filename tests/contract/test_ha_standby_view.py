"""An HA standby's warm view on the shipped broker config (deploy/mosquitto) and a real Mosquitto 2.0.

Reported on Mosquitto 2.0.11: the standby's read-only view (:class:`ftd.coordinator.ha.runner.RetainedView`)
logged in with the coordinator's credentials; ``use_username_as_clientid`` made it *the*
``coordinator`` client, and the broker closed the leader's persistent session to let it in ("Client
coordinator already connected, closing old connection"). Now the view logs in as the ACL's read-only
``coordinator-standby`` (``coordinator.ha.standby_*``), or is not opened at all.

``test_the_coordinators_login_for_the_view_takes_the_leaders_session_over`` is the bug as it was, so
the leader-never-kicked check below is known to be able to fail.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog.testing

from ftd.bus import topics
from ftd.bus.base import Bus
from ftd.bus.factory import make_mqtt_bus
from ftd.config import Config, config_from_data
from ftd.coordinator.ha.runner import RetainedView, view_bus_maker
from tests.contract.conftest import SHIPPED_USERS as USERS
from tests.contract.test_mosquitto_acl import Client
from tests.realparts import Mosquitto

pytestmark = pytest.mark.real

TAKEN_OVER = "already connected, closing old connection"


def _config(broker: tuple[Mosquitto, Path], standby: str | None) -> Config:
    b, workdir = broker
    bus = {"port": b.port, "username": "coordinator", "password_file": str(workdir / "coordinator.pw")}
    ha: dict[str, object] = {"ledger": "postgresql", "dsn": "host=unused"}
    if standby is not None:
        ha |= {"standby_username": standby, "standby_password_file": str(workdir / f"{standby}.pw")}
    return config_from_data({"bus": {**bus, "client_id": "ftd-coordinator"}, "coordinator": {"ha": ha}})


def _taken_over(b: Mosquitto, since: int) -> bool:
    return TAKEN_OVER in b.log_path.read_text()[since:]


async def _view_sees_status(make_bus: Callable[[], Bus], node_status: str) -> RetainedView:
    view = RetainedView(make_bus)
    await view.start()
    deadline = time.monotonic() + 10
    while node_status not in view.retained:
        assert time.monotonic() < deadline, f"the view never received {node_status}"
        await asyncio.sleep(0.05)
    return view


async def _leader_with_a_standby_view(
    broker: tuple[Mosquitto, Path], make_view_bus: Callable[[str], Bus]
) -> tuple[bool, bool, RetainedView]:
    """The leader's persistent session and node-1's retained status, then a standby's view: whether
    the broker closed the leader's connection, whether the leader still got node-1's next event, and
    the view (stopped)."""
    b, _ = broker
    node = Client(b.port, "node-1", USERS["node-1"])
    leader = Client(
        b.port, "coordinator", USERS["coordinator"], client_id="ftd-coordinator", clean_session=False
    )
    try:
        assert not node.rc.is_failure and not leader.rc.is_failure
        leader.subscribe(topics.ALL_NODE_EVENTS)
        node.c.publish(
            topics.node_status("node-1"), b'{"state":"online"}', qos=1, retain=True
        ).wait_for_publish(5)
        since = len(b.log_path.read_text())
        view = await _view_sees_status(lambda: make_view_bus("ftd-standby-a"), topics.node_status("node-1"))
        try:
            node.publish(topics.node_event("node-1", "xid"), b"after the view")
            try:
                await asyncio.to_thread(leader.received_until, b"after the view", 3.0)
                received = True
            except AssertionError:
                received = False
            await asyncio.sleep(0.5)  # the broker logs a takeover as it happens
        finally:
            await view.stop()
        return _taken_over(b, since), received, view
    finally:
        node.close()
        leader.close()


async def test_the_standby_view_logs_in_as_coordinator_standby_and_leaves_the_leader_alone(
    shipped_broker: tuple[Mosquitto, Path],
) -> None:
    broker = shipped_broker
    make_view_bus = view_bus_maker(_config(broker, "coordinator-standby"))
    assert make_view_bus is not None
    taken_over, received, view = await _leader_with_a_standby_view(broker, make_view_bus)
    assert not taken_over, broker[0].log_path.read_text()[-2000:]
    assert received  # the leader's session goes on
    snapshot = {m.topic: m.payload for m in view.snapshot()}
    assert snapshot[topics.node_status("node-1")] == b'{"state":"online"}'


async def test_the_coordinators_login_for_the_view_takes_the_leaders_session_over(
    shipped_broker: tuple[Mosquitto, Path],
) -> None:
    """The bug as it was (the view made from ``bus`` as is): the broker closes the leader's session."""
    broker = shipped_broker
    config = _config(broker, None)

    def as_it_was(client_id: str) -> Bus:
        return make_mqtt_bus(config.bus, client_id=client_id, clean_session=True)

    taken_over, received, _ = await _leader_with_a_standby_view(broker, as_it_was)
    assert taken_over and not received


def test_no_view_on_an_authenticated_bus_without_a_standby_login(
    shipped_broker: tuple[Mosquitto, Path],
) -> None:
    with structlog.testing.capture_logs() as logs:
        assert view_bus_maker(_config(shipped_broker, None)) is None
    warnings = [entry for entry in logs if entry["event"] == "standby_view_disabled"]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"
    assert "coordinator.ha.standby_username" in warnings[0]["reason"]
