"""The durable spool: written before publishing, replayed after a restart, bounded, corruption-safe,
and never fatal to the agent (a full disk is reported and outlived; see also test_spool_resync)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from ftd.agent.spool import MAGIC, Outbox, Outgoing, read_spool
from ftd.agent.wiring import build_agent
from ftd.bus import topics
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import AgentConfig
from ftd.events import Event, Kind, Severity, decode
from tests.unit.helpers import until
from tests.unit.test_outbox import fill, tmpfs


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


def test_corrupt_spool_is_quarantined_every_intact_record_salvaged(tmp_path: Path) -> None:
    path = tmp_path / "outbox.spool"
    first = Outbox(MemoryBus(MemoryBroker()), path=path)
    for i in range(5):
        first.put(Outgoing("t/x", f"good{i}".encode()))
    first.close()
    data = bytearray(path.read_bytes())
    data[data.index(b"good2") + 1] ^= 0xFF  # flip a byte inside the middle record: CRC mismatch
    path.write_bytes(bytes(data))
    again = Outbox(MemoryBus(MemoryBroker()), path=path)
    assert [e.payload for e in again._queue] == [b"good0", b"good1", b"good3", b"good4"]
    assert len(again.quarantined) == 1 and Path(again.quarantined[0]).exists()
    assert "CRC" in again.problems[0]
    [damage] = again.damage
    assert (damage.salvaged, damage.records, damage.regions) == (4, 4, 1)
    assert damage.skipped_bytes == (len(data) - len(MAGIC)) // 5  # one record (all five are the same size)
    again.close()
    entries, _, problem = read_spool(path.read_bytes())  # the fresh spool holds the salvage
    assert problem is None and [e.payload for e in entries] == [b"good0", b"good1", b"good3", b"good4"]


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
    agent = build_agent(cfg, bus=MemoryBus(broker, client_id="agent"), node="node-1")
    task = asyncio.create_task(agent.run())
    try:
        message = await asyncio.wait_for(anext(sub.messages()), 5)
        event = decode(message.payload, Event)
        assert event.kind is Kind.AGENT_HEALTH and event.data["problem"] == "spool_corrupt"
        assert event.data["salvaged"] == 0 and event.data["skipped_bytes"] == 31  # the whole file
        assert list(state.glob("outbox.spool.corrupt-*"))
        with (tmp_path / "kmsg").open("a") as kmsg:  # and it still works
            kmsg.write("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n")
        message = await asyncio.wait_for(anext(sub.messages()), 5)
        assert decode(message.payload, Event).data["code"] == 79
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.real
async def test_agent_on_a_full_disk_keeps_publishing_reports_the_outage_once_and_its_end(
    tmp_path: Path,
) -> None:
    (tmp_path / "kmsg").touch()
    broker = MemoryBroker()
    sub = MemoryBus(broker, client_id="sub")
    await sub.subscribe(topics.node_event("node-1", "xid"))
    await sub.subscribe(topics.node_event("node-1", "agent_health"))
    await sub.start()
    events: list[Event] = []

    async def collect() -> None:
        async for message in sub.messages():
            events.append(decode(message.payload, Event))

    def health(problem: str) -> list[Event]:
        return [e for e in events if e.kind is Kind.AGENT_HEALTH and e.data.get("problem") == problem]

    def xids() -> int:
        return len({e.id for e in events if e.kind is Kind.XID})

    def write(lines: range) -> None:
        with (tmp_path / "kmsg").open("a") as kmsg:
            kmsg.writelines(
                f"NVRM: Xid (PCI:0000:{16 + i:02x}:00): 13, pid={i}, name=t, Graphics Exception n{i}\n"
                for i in lines
            )

    with tmpfs(tmp_path / "state", "256k") as state:
        cfg = AgentConfig(
            node="node-1",
            kmsg_path=str(tmp_path / "kmsg"),
            kmsg_from_start=True,
            state_dir=str(state),
            socket_path=str(tmp_path / "a.sock"),
        )
        agent = build_agent(
            cfg, bus=MemoryBus(broker, client_id="agent"), node="node-1", health_interval_s=0.05
        )
        collector = asyncio.create_task(collect())
        task = asyncio.create_task(agent.run())
        try:
            write(range(5))
            await until(lambda: xids() == 5)
            fill(state / "filler")
            write(range(5, 60))
            await until(lambda: xids() == 60 and len(health("spool_unavailable")) == 1)
            [report] = health("spool_unavailable")
            assert report.severity is Severity.ERROR and "No space left" in report.data["error"]
            write(range(60, 70))  # the same outage: no second report
            await until(lambda: xids() == 70)
            await asyncio.sleep(0.2)
            assert len(health("spool_unavailable")) == 1 and not health("spool_recovered")
            (state / "filler").unlink()
            await until(lambda: len(health("spool_recovered")) == 1)
            assert agent.outbox.durable and not task.done()
            on_disk, _, problem = read_spool((state / "outbox.spool").read_bytes())
            assert problem is None
            assert {e.receipt_id for e in on_disk} >= {e.id for e in events if e.kind is Kind.XID}
        finally:
            task.cancel()
            collector.cancel()
            for t in (task, collector):
                with contextlib.suppress(asyncio.CancelledError):
                    await t
