"""A dead rack broker does not hide its nodes' deaths (issue #25, the bridge tier's gap).

The bookkeeping (:mod:`ftd.coordinator.intake.rack_bridges`) and the daemon's handling of a rack's
bridge notification, through :meth:`Coordinator.handle_message` on the in-memory bus: a ``0`` puts
every node online through that rack in the Last Will's grace (offline in the state, one
``rack_bridge_down`` decision), a live message of a node cancels its wait, the others become
``node_offline`` events with ``why = bridge_down`` when the grace ends; nodes on other racks or on the
core are untouched; a repeated ``0``, a ``1`` and a garbled payload decide nothing (the last is
counted as a bad message). The real brokers' side is tests/e2e/test_bridge_tier.py."""

from __future__ import annotations

import pytest

from ftd.bus import topics
from ftd.bus.base import Message
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import Config, ConfigError, CoordinatorConfig, parse_config
from ftd.config.schema import OfflineGraceConfig
from ftd.coordinator.daemon import Coordinator
from ftd.coordinator.intake.offline_grace import BRIDGE_DOWN, LAST_WILL, OfflineGrace
from ftd.coordinator.intake.rack_bridges import RackBridges, bridge_up
from ftd.coordinator.ledger.sqlite import Ledger
from ftd.coordinator.wiring import build
from ftd.events import DecodeError, Kind, NodeStatus, encode, make_event


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_bridge_payloads() -> None:
    assert bridge_up(b"1") is True and bridge_up(b"0") is False
    for bad in (b"", b"on", b"10", b" 1", b"\xff"):
        with pytest.raises(DecodeError):
            bridge_up(bad)


def test_book_keeping() -> None:
    book = RackBridges()
    book.seen("n1", "rack-a")
    book.seen("n2", "rack-a")
    book.seen("n3", "rack-b")
    book.seen("n4", "")
    assert (book.rack_of("n1"), book.rack_of("n4"), book.rack_of("unknown")) == ("rack-a", "", "")
    assert book.nodes_on("rack-a", ["n4", "n2", "n3", "n1"]) == ["n2", "n1"]
    assert book.went("rack-a", True) is False  # never heard of: taken as up
    assert book.went("rack-a", False) is True and book.went("rack-a", False) is False
    assert book.is_down("rack-a") and not book.is_down("rack-b")
    assert (book.down_rack("n1"), book.down_rack("n3"), book.down_rack("n4")) == ("rack-a", None, None)
    book.seen("n1", "")  # moved to the core broker
    assert book.down_rack("n1") is None and book.nodes_on("rack-a", ["n1", "n2"]) == ["n2"]
    assert book.went("rack-a", True) is True and book.down_rack("n2") is None
    with pytest.raises(ValueError, match="rack broker"):
        book.seen("n5", "rack/a")


def make_coordinator(last_will_s: float = 10.0) -> tuple[Coordinator, Clock]:
    config = Config(
        coordinator=CoordinatorConfig(
            ledger_path=":memory:",
            scheduler="none",
            offline_grace=OfflineGraceConfig(last_will_s=last_will_s, clean_stop_s=120),
        )
    )
    coordinator = build(config, bus=MemoryBus(MemoryBroker()), scheduler=None, ledger=Ledger(":memory:"))
    clock = Clock()
    coordinator.offline_grace = OfflineGrace(config.coordinator.offline_grace, clock)
    return coordinator, clock


def status(node: str, state: str = "online", rack: str = "", *, retain: bool = True) -> Message:
    payload = encode(NodeStatus(node=node, state=state, ts=1.0, rack_broker=rack))  # type: ignore[arg-type]
    return Message(topics.node_status(node), payload, retain)


def bridge(rack: str, payload: bytes, *, retain: bool = False) -> Message:
    return Message(topics.bridge_state(rack), payload, retain)


async def offline_events(coordinator: Coordinator) -> list[tuple[str, str, str]]:
    events = await coordinator.ledger.events(limit=100)
    return sorted(
        (e.node, str(e.data["why"]), str(e.data.get("rack_broker", "")))
        for e in events
        if e.kind == Kind.NODE_OFFLINE
    )


async def test_a_dead_bridge_takes_its_online_nodes_after_the_grace() -> None:
    coordinator, clock = make_coordinator(last_will_s=10)
    for message in (
        status("a1", rack="rack-a"),
        status("a2", rack="rack-a"),
        status("a3", "offline", rack="rack-a"),  # already gone (its own Last Will): not counted twice
        status("b1", rack="rack-b"),
        status("core1"),
    ):
        assert await coordinator.handle_message(message)
    clock.now += 100
    await coordinator._offline_when_due(once=True)
    assert await offline_events(coordinator) == [("a3", LAST_WILL, "")]

    assert await coordinator.handle_message(bridge("rack-a", b"0"))
    assert coordinator.state.online_nodes() == ["b1", "core1"]
    assert [p.why for p in map(coordinator.offline_grace.pending, ("a1", "a2"))] == [BRIDGE_DOWN] * 2
    assert coordinator.offline_grace.pending("b1") is None

    # a1 is heard from through the restarted bridge (an event); a2 is not.
    clock.now += 5
    await coordinator.handle_message(bridge("rack-a", b"1"))
    event = make_event("a1", Kind.XID, data={"code": 43})
    await coordinator.handle_message(Message(topics.node_event("a1", "xid"), encode(event)))
    clock.now += 5.1
    await coordinator._offline_when_due(once=True)
    assert await offline_events(coordinator) == [("a2", BRIDGE_DOWN, "rack-a"), ("a3", LAST_WILL, "")]
    assert coordinator.bad_messages == 0


async def test_nodes_back_within_the_grace_cost_nothing() -> None:
    coordinator, clock = make_coordinator(last_will_s=10)
    for node in ("a1", "a2"):
        await coordinator.handle_message(status(node, rack="rack-a"))
    await coordinator.handle_message(bridge("rack-a", b"0"))
    await coordinator.handle_message(bridge("rack-a", b"0"))  # said again: the same deadline, no new decision
    clock.now += 3
    await coordinator.handle_message(bridge("rack-a", b"1"))
    for node in ("a1", "a2"):  # the agents' birth messages, live through the bridge
        await coordinator.handle_message(status(node, rack="rack-a", retain=False))
    assert coordinator.state.online_nodes() == ["a1", "a2"]
    clock.now += 100
    await coordinator._offline_when_due(once=True)
    assert await offline_events(coordinator) == []


async def test_a_restarted_coordinator_reads_a_dark_rack_from_retained_messages() -> None:
    """Retained statuses first (the subscription order), then the rack's retained 0; and a retained
    online of a node on that rack read after it is its word from before, not a sign of life."""
    coordinator, _ = make_coordinator(last_will_s=0)
    await coordinator.handle_message(status("a1", rack="rack-a"))
    await coordinator.handle_message(bridge("rack-a", b"0", retain=True))
    await coordinator.handle_message(status("a2", rack="rack-a"))  # retained, read after the 0
    await coordinator.handle_message(status("b1", rack="rack-b"))
    assert await offline_events(coordinator) == [("a1", BRIDGE_DOWN, "rack-a"), ("a2", BRIDGE_DOWN, "rack-a")]
    assert coordinator.state.online_nodes() == ["b1"]


async def test_garbled_bridge_messages_are_counted_and_decide_nothing() -> None:
    coordinator, _ = make_coordinator(last_will_s=0)
    await coordinator.handle_message(status("a1", rack="rack-a"))
    for message in (
        bridge("rack-a", b"down"),
        Message("ftd/v1/bridges/rack-a/other", b"0"),
        Message("ftd/v1/bridges/rack-a", b"0"),
        Message(topics.node_status("a2"), b'{"schema":1,"node":"a2","state":"online","rack_broker":"a/b"}'),
    ):
        assert await coordinator.handle_message(message)  # refused for good: acknowledged
    assert coordinator.bad_messages == 4
    assert await coordinator.handle_message(bridge("rack-a", b""))  # a cleared notification: nothing said
    assert coordinator.bad_messages == 4
    assert coordinator.state.online_nodes() == ["a1"] and await offline_events(coordinator) == []


def test_the_config_key() -> None:
    assert parse_config("").bus.rack_broker is None
    assert parse_config('[bus]\nrack_broker = "rack-a"\n').bus.rack_broker == "rack-a"
    with pytest.raises(ConfigError, match=r"bus\.rack_broker"):
        parse_config('[bus]\nrack_broker = "rack/a"\n')
    with pytest.raises(ConfigError, match=r"bus\.rack_broker.*embedded"):
        parse_config('[bus]\nrack_broker = "rack-a"\nembedded = true\n')
