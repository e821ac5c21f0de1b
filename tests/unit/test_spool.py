"""The durable spool: written before publishing, replayed after a restart, bounded, corruption-safe."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from ftd.agent.app import Agent
from ftd.agent.spool import MAGIC, Outbox, Outgoing, read_spool
from ftd.bus import topics
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import AgentConfig
from ftd.events import Event, Kind, decode
from tests.unit.helpers import until


def test_entries_are_on_disk_before_publishing_and_replayed_by_the_next_outbox(tmp_path: Path) -> None:
    path = tmp_path / "outbox.spool"
    first = Outbox(MemoryBus(MemoryBroker()), path=path)
    for i in range(5):
        first.put(Outgoing("t/x", f"e{i}".encode(), priority=i % 4))
    first.put(Outgoing("t/presence", b"stale", durable=False))  # memory only
    entries, _, problem = read_spool(path.read_bytes())
    assert problem is None and [e.payload for e in entries] == [f"e{i}".encode() for i in range(5)]
    first.close()  # "killed": nothing was acknowledged
    second = Outbox(MemoryBus(MemoryBroker()), path=path)
    assert second.replayed == 5
    assert [e.payload for e in second._queue] == [f"e{i}".encode() for i in range(5)]
    assert [e.priority for e in second._queue] == [0, 1, 2, 3, 0]
    second.close()


async def test_acknowledged_entries_are_not_replayed(tmp_path: Path) -> None:
    path = tmp_path / "outbox.spool"
    broker = MemoryBroker()
    sub, pub = MemoryBus(broker, client_id="sub"), MemoryBus(broker, client_id="pub")
    await sub.subscribe("t/#")
    await sub.start()
    await pub.start()
    outbox = Outbox(pub, path=path)
    runner = asyncio.create_task(outbox.run())
    for i in range(10):
        outbox.put(Outgoing("t/x", f"{i}".encode()))
    await until(lambda: outbox.sent == 10)
    broker.go_down()
    for i in range(10, 13):
        outbox.put(Outgoing("t/x", f"{i}".encode()))
    await asyncio.sleep(0.05)
    runner.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await runner
    outbox.close()
    again = Outbox(pub, path=path)
    assert [e.payload for e in again._queue] == [b"10", b"11", b"12"]
    again.close()


def test_drops_for_space_are_counted_and_not_replayed(tmp_path: Path) -> None:
    path = tmp_path / "outbox.spool"
    outbox = Outbox(MemoryBus(MemoryBroker()), max_entries=3, path=path)
    for payload, priority in ((b"info-1", 0), (b"crit-1", 3), (b"info-2", 0), (b"crit-2", 3), (b"warn", 1)):
        outbox.put(Outgoing("t", payload, priority=priority))
    assert outbox.dropped == 2
    outbox.close()
    again = Outbox(MemoryBus(MemoryBroker()), max_entries=3, path=path)
    assert [e.payload for e in again._queue] == [b"crit-1", b"crit-2", b"warn"]
    again.close()


def test_byte_bound_drops_lowest_priority_first(tmp_path: Path) -> None:
    outbox = Outbox(MemoryBus(MemoryBroker()), path=tmp_path / "s", max_bytes=3000)
    outbox.put(Outgoing("t", b"c" * 1000, priority=3))
    outbox.put(Outgoing("t", b"i" * 1000, priority=0))
    outbox.put(Outgoing("t", b"e" * 1000, priority=2))
    assert outbox.dropped == 1
    assert [e.payload[:1] for e in outbox._queue] == [b"c", b"e"]
    outbox.close()


def test_corrupt_spool_is_quarantined_records_before_the_damage_salvaged(tmp_path: Path) -> None:
    path = tmp_path / "outbox.spool"
    first = Outbox(MemoryBus(MemoryBroker()), path=path)
    for i in range(3):
        first.put(Outgoing("t/x", f"good{i}".encode()))
    first.close()
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # flip a byte inside the last record: CRC mismatch
    path.write_bytes(bytes(data))
    again = Outbox(MemoryBus(MemoryBroker()), path=path)
    assert [e.payload for e in again._queue] == [b"good0", b"good1"]
    assert len(again.quarantined) == 1 and Path(again.quarantined[0]).exists()
    assert "CRC" in again.problems[0]
    again.close()
    entries, _, problem = read_spool(path.read_bytes())  # the fresh spool holds the salvage
    assert problem is None and [e.payload for e in entries] == [b"good0", b"good1"]


def test_file_is_truncated_once_everything_is_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "outbox.spool"
    outbox = Outbox(MemoryBus(MemoryBroker()), path=path)
    for _ in range(200):
        outbox.put(Outgoing("t/x", b"x" * 500))
    assert path.stat().st_size > 64 << 10
    while outbox._queue:  # as the publisher does after each PUBACK
        outbox._forget(outbox._queue.popleft())
    assert path.read_bytes() == MAGIC
    outbox.close()


async def test_agent_reports_a_corrupt_spool_and_carries_on(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "outbox.spool").write_bytes(b"this is not a spool file at all")
    (tmp_path / "kmsg").touch()
    cfg = AgentConfig(
        node="node-1",
        kmsg_path=str(tmp_path / "kmsg"),
        state_dir=str(state),
        socket_path=str(tmp_path / "a.sock"),
    )
    broker = MemoryBroker()
    sub = MemoryBus(broker, client_id="sub")
    await sub.subscribe(topics.node_event("node-1", "agent_health"))
    await sub.subscribe(topics.node_event("node-1", "xid"))
    await sub.start()
    agent = Agent(cfg, bus=MemoryBus(broker, client_id="agent"), node="node-1")
    task = asyncio.create_task(agent.run())
    try:
        message = await asyncio.wait_for(anext(sub.messages()), 5)
        event = decode(message.payload, Event)
        assert event.kind is Kind.AGENT_HEALTH and event.data["problem"] == "spool_corrupt"
        assert list(state.glob("outbox.spool.corrupt-*"))
        with (tmp_path / "kmsg").open("a") as kmsg:  # and it still works
            kmsg.write("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n")
        message = await asyncio.wait_for(anext(sub.messages()), 5)
        assert decode(message.payload, Event).data["code"] == 79
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
