"""The agent's outbox: nothing lost across a broker outage or a full disk; bounded, dropping low
severity first.

The full-disk tests put the spool on a tiny tmpfs mounted for the test (root only): a real filesystem
that really fills up, so the kernel's own short writes and ``ENOSPC`` are what the outbox meets.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftd.agent.spool import Outbox, Outgoing, read_spool
from ftd.agent.spool.outbox import RETRY_PAUSE_S
from ftd.bus.base import BusUnavailable, ForwardingBus
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.bus.mqtt import MqttBus
from tests.realparts import REQUIRE_REAL, Mosquitto


async def collect(
    bus: MemoryBus | MqttBus,
    count: int,
    timeout: float = 15.0,
    distinct: bool = False,
    sink: list[bytes] | None = None,
) -> list[bytes]:
    """The first ``count`` payloads (or, with ``distinct``, every payload until ``count`` distinct ones)."""
    got: list[bytes] = [] if sink is None else sink

    async def run() -> None:
        async for message in bus.messages():
            got.append(message.payload)
            if len(set(got) if distinct else got) == count:
                return

    await asyncio.wait_for(run(), timeout)
    return got


async def test_memory_outage_delays_but_loses_nothing_and_keeps_order() -> None:
    broker = MemoryBroker()
    sub, pub = MemoryBus(broker, client_id="sub"), MemoryBus(broker, client_id="pub")
    await sub.subscribe("t/#")
    await sub.start()
    await pub.start()
    outbox = Outbox(pub, max_entries=100)
    task = asyncio.create_task(outbox.run())
    broker.go_down()
    for i in range(20):
        outbox.put(Outgoing("t/x", str(i).encode()))
    await asyncio.sleep(0.1)
    assert len(outbox) == 20  # held while the broker is down
    broker.come_up()
    assert await collect(sub, 20) == [str(i).encode() for i in range(20)]
    task.cancel()


def test_full_outbox_drops_lowest_priority_oldest_first_and_counts() -> None:
    outbox = Outbox(MemoryBus(MemoryBroker()), max_entries=3)
    outbox.put(Outgoing("t", b"info-1", priority=0))
    outbox.put(Outgoing("t", b"crit-1", priority=3))
    outbox.put(Outgoing("t", b"info-2", priority=0))
    outbox.put(Outgoing("t", b"crit-2", priority=3))  # evicts info-1
    outbox.put(Outgoing("t", b"info-3", priority=0))  # evicts info-2 (oldest of the lowest)
    assert [item.payload for item in outbox._queue] == [b"crit-1", b"crit-2", b"info-3"]
    outbox.put(Outgoing("t", b"warn-1", priority=1))  # evicts info-3
    outbox.put(Outgoing("t", b"info-4", priority=0))  # lower than everything queued: dropped itself
    assert [item.payload for item in outbox._queue] == [b"crit-1", b"crit-2", b"warn-1"]
    assert outbox.dropped == 4


@pytest.mark.real
async def test_real_mosquitto_restart_mid_stream_loses_nothing(tmp_path: Path) -> None:
    broker = Mosquitto(tmp_path / "mosq").start()
    sub = MqttBus(host="127.0.0.1", port=broker.port, client_id="sub", reconnect_max_s=0.3)
    pub = MqttBus(host="127.0.0.1", port=broker.port, client_id="pub", reconnect_max_s=0.3)
    try:
        await sub.subscribe("t/#")
        await sub.start()
        await pub.start()
        assert await sub.wait_connected(10) and await pub.wait_connected(10)
        outbox = Outbox(pub, max_entries=10_000)
        runner = asyncio.create_task(outbox.run())
        partial: list[bytes] = []
        received = asyncio.create_task(collect(sub, 300, timeout=60, distinct=True, sink=partial))
        for i in range(100):
            outbox.put(Outgoing("t/x", f"{i}".encode()))
        await asyncio.sleep(0.2)
        await asyncio.to_thread(broker.stop)  # persistent sessions survive a clean broker stop
        for i in range(100, 200):  # generated while the broker is down
            outbox.put(Outgoing("t/x", f"{i}".encode()))
            await asyncio.sleep(0.001)
        await asyncio.to_thread(broker.start)
        for i in range(200, 300):
            outbox.put(Outgoing("t/x", f"{i}".encode()))
        try:
            got = await received
        except TimeoutError:
            missing = sorted(set(range(300)) - {int(p) for p in partial})
            raise AssertionError(
                f"missing {len(missing)} of 300 after 60 s (first: {missing[:10]}); "
                f"outbox holds {len(outbox)}, "
                f"pub connected={pub.connected} connects={pub.connects}, sub connected={sub.connected} "
                f"connects={sub.connects}"
            ) from None
        # At-least-once: duplicates are allowed (the coordinator drops them by id), gaps are not.
        assert {int(p) for p in got} == set(range(300))
        runner.cancel()
    finally:
        for bus in (sub, pub):
            with contextlib.suppress(Exception):
                await bus.stop()
        broker.stop()


# --- a full disk ----------------------------------------------------------------------------------


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real, tiny filesystem at ``path`` (root only), unmounted afterwards."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        msg = "mounting a tmpfs needs root and mount(8)"
        if REQUIRE_REAL:
            pytest.fail(f"FTD_REQUIRE_REAL=1 and {msg}", pytrace=False)
        pytest.skip(msg)
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=False)


def fill(filler: Path) -> None:
    """Write ``filler`` until the filesystem is full, down to the last byte."""
    with filler.open("wb", buffering=0) as handle:
        for chunk in (1 << 16, 1 << 12, 1 << 8, 1):
            with contextlib.suppress(OSError):
                while handle.write(b"\0" * chunk) == chunk:
                    pass
    with pytest.raises(OSError) as full:
        (filler.parent / "probe").write_bytes(b"\0" * 4096)
    assert full.value.errno == errno.ENOSPC


def event(i: int) -> bytes:
    return b'{"id": "e%d", "pad": "%s"}' % (i, b"x" * 300)


async def published(outbox: Outbox, count: int) -> None:
    for _ in range(500):
        if outbox.sent >= count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"only {outbox.sent} of {count} published")


async def drain(bus: MemoryBus) -> list[bytes]:
    got: list[bytes] = []
    with contextlib.suppress(TimeoutError):
        while True:
            got.append((await asyncio.wait_for(anext(bus.messages()), 0.05)).payload)
    return got


@pytest.mark.real
async def test_full_disk_memory_only_loses_nothing_leaves_no_torn_record_and_recovers(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs", "256k") as fs:
        broker = MemoryBroker()
        sub, pub = MemoryBus(broker, client_id="sub"), MemoryBus(broker, client_id="pub")
        await sub.subscribe("t/#")
        await sub.start()
        await pub.start()
        path = fs / "outbox.spool"
        outbox = Outbox(pub, path=path, spool_retry_s=0.0)
        task = asyncio.create_task(outbox.run())
        try:
            for i in range(20):
                outbox.put(Outgoing("t/e", event(i), priority=2, receipt_id=f"e{i}"))
            assert outbox.durable
            fill(fs / "filler")
            for i in range(20, 120):  # the spool's last page takes a few, then a short write, then ENOSPC
                outbox.put(Outgoing("t/e", event(i), priority=2, receipt_id=f"e{i}"))
            assert not outbox.durable and outbox.spool_outages == 1
            assert "No space left on device" in outbox.last_spool_error
            # The failed write was cut back: the file is whole records, the first ones in order.
            on_disk, _, problem = read_spool(path.read_bytes())
            assert problem is None
            assert [e.receipt_id for e in on_disk] == [f"e{i}" for i in range(len(on_disk))]
            assert 20 <= len(on_disk) < 120

            await published(outbox, 120)  # memory-only: still published, in order, all of them
            assert await drain(sub) == [event(i) for i in range(120)]
            assert outbox.receipted(f"e{i}" for i in range(0, 120, 2)) == 60  # and receipted
            assert len(outbox) == 60
            assert not outbox.check_spool() and outbox.spool_outages == 1  # still full: same outage
            assert not (fs / ".outbox.spool.tmp").exists()

            (fs / "filler").unlink()
            assert outbox.check_spool() and outbox.durable and outbox.spool_recoveries == 1
            on_disk, _, problem = read_spool(path.read_bytes())  # exactly what is held, nothing done
            assert problem is None
            assert [e.receipt_id for e in on_disk] == [f"e{i}" for i in range(1, 120, 2)]
            outbox.put(Outgoing("t/e", event(120), priority=2, receipt_id="e120"))  # appended again
            outbox.receipted(["e1"])
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            outbox.close()
        again = Outbox(pub, path=path)  # a restart replays exactly what was not done
        assert [e.receipt_id for e in again._queue] == [f"e{i}" for i in range(3, 120, 2)] + ["e120"]
        assert again.damage == []
        again.close()


@pytest.mark.real
async def test_a_spool_that_cannot_be_rewritten_at_start_is_held_in_memory_until_space_returns(
    tmp_path: Path,
) -> None:
    with tmpfs(tmp_path / "fs", "128k") as fs:
        path = fs / "outbox.spool"
        first = Outbox(MemoryBus(MemoryBroker()), path=path)
        for i in range(10):
            first.put(Outgoing("t/e", event(i), receipt_id=f"e{i}"))
        first.close()
        before = path.read_bytes()
        fill(fs / "filler")
        # compact_bytes=1: the file must be rewritten at start, and there is no room for that.
        outbox = Outbox(MemoryBus(MemoryBroker()), path=path, compact_bytes=1, spool_retry_s=0.0)
        assert outbox.replayed == 10 and len(outbox) == 10
        assert not outbox.durable and outbox.spool_outages == 1
        assert path.read_bytes() == before and not (fs / ".outbox.spool.tmp").exists()
        outbox.put(Outgoing("t/e", event(10), receipt_id="e10"))  # held in memory, no exception
        outbox.receipted(["e0"])
        (fs / "filler").unlink()
        assert outbox.check_spool()
        on_disk, _, problem = read_spool(path.read_bytes())
        assert problem is None and [e.receipt_id for e in on_disk] == [f"e{i}" for i in range(1, 11)]
        outbox.close()


class LossNotSeenYet(ForwardingBus):
    """Publishes fail while the bus still says "connected": the turns of the loop between a
    connection loss seen on the socket and the bus's connection task knowing of it (issue #31)."""

    def __init__(self, inner: MemoryBus) -> None:
        super().__init__(inner)
        self.failing = True
        self.attempts = 0

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self.attempts += 1
        if self.failing:
            raise BusUnavailable("connection lost")
        await super().publish(topic, payload, retain=retain)


async def test_a_publish_failing_while_the_bus_says_connected_does_not_stop_the_loop() -> None:
    """Before the fix the outbox retried at once (``wait_connected`` returned at once), never yielding:
    the agent's whole event loop stopped, as in the reported freeze after a broker SIGKILL."""
    broker = MemoryBroker()
    inner = MemoryBus(broker, client_id="agent")
    sub = MemoryBus(broker, client_id="sub")
    await sub.subscribe("t")
    await inner.start()
    await sub.start()
    bus = LossNotSeenYet(inner)
    outbox = Outbox(bus, max_entries=10)
    outbox.put(Outgoing("t", b"held"))
    # On a spinning loop nothing here runs again: a thread ends the failure so the test can end.
    rescue = threading.Timer(3.0, lambda: setattr(bus, "failing", False))
    rescue.start()
    task = asyncio.create_task(outbox.run())
    try:
        started = time.monotonic()
        await asyncio.sleep(0.3)
        elapsed = time.monotonic() - started
        assert elapsed < 1.5, f"the event loop stopped for {elapsed:.1f} s"
        assert 2 <= bus.attempts <= 0.3 / RETRY_PAUSE_S + 2  # retried, at a pace
        assert outbox.sent == 0 and len(outbox) == 1  # nothing lost meanwhile
        bus.failing = False
        await published(outbox, 1)
        assert await drain(sub) == [b"held"]
    finally:
        rescue.cancel()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
