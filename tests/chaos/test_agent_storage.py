"""Storage faults under a real ``ftd agent``: a full ``state_dir`` and a corrupt spool (docs/architecture.md
§11.2).

Real parts only: a private Mosquitto, the agent as a subprocess with a config file, its ``state_dir``
on a small tmpfs mounted for the test (a real filesystem that really fills up: the kernel answers
short writes and ``ENOSPC``, nothing is mocked), Xid lines appended to its kernel-log file (a
different GPU per line, so storm control lets every one through as its own event) and a subscriber
on the bus counting distinct event ids. No coordinator runs, so nothing is receipted: every event
stays live in the spool, which is what makes the spool's contents exact to check.

Full disk: the agent keeps running memory-only, publishes every event, reports ``spool_unavailable``
once, leaves no torn record behind, and when space returns writes what it holds back to disk; a
later SIGKILL during a broker outage then loses nothing. Corrupt spool: the records after the damage
are re-published, not only those before it (before the fix replay stopped at the first bad record).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import shutil
import signal
import struct
import subprocess
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ftd.agent.spool import Outbox, Outgoing, read_spool
from ftd.bus import topics
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.bus.mqtt import MqttBus
from ftd.events import Event, Kind, Severity, decode, encode, make_event
from tests.e2e.daemons import Daemon
from tests.realparts import REQUIRE_REAL, Mosquitto

NODE = "storage-node"


def xid_line(i: int) -> str:
    # A different GPU/code per line, so storm control lets every one through as its own event.
    return (
        f"NVRM: Xid (PCI:0000:{i % 200 + 16:02x}:00): {13 + (i // 200) % 3}, pid={1000 + i}, name=t, n{i}\n"
    )


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


def fill(filler: Path) -> int:
    """Write ``filler`` until the filesystem is full, down to the last byte; returns its size."""
    size = 0
    with filler.open("wb", buffering=0) as handle:
        for chunk in (1 << 16, 1 << 12, 1 << 8, 1):
            while True:
                try:
                    written = handle.write(b"\0" * chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
                size += written or 0
                if not written or written < chunk:
                    break
    return size


def position(state: Path) -> int:
    try:
        return int(json.loads((state / "kmsg.position").read_text())["offset"])
    except (OSError, ValueError, KeyError):
        return -1


async def wait_for(
    predicate: Callable[[], bool], timeout: float, what: str, detail: Callable[[], str] = lambda: ""
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} {detail()}")
        await asyncio.sleep(0.05)


class Watch:
    """A subscriber on the node's xid and agent_health events."""

    def __init__(self, port: int) -> None:
        self.bus = MqttBus(host="127.0.0.1", port=port, client_id="storage-sub", reconnect_max_s=0.3)
        self.xids: list[str] = []
        self.health: list[Event] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.bus.subscribe(topics.node_event(NODE, "xid"))
        await self.bus.subscribe(topics.node_event(NODE, "agent_health"))
        await self.bus.start()
        assert await self.bus.wait_connected(10)
        self._task = asyncio.create_task(self._collect())

    async def _collect(self) -> None:
        async for message in self.bus.messages():
            event = decode(message.payload, Event)
            if event.kind is Kind.XID:
                self.xids.append(event.id)
            elif event.kind is Kind.AGENT_HEALTH:
                self.health.append(event)

    def problems(self, name: str) -> list[Event]:
        return list({e.id: e for e in self.health if e.data.get("problem") == name}.values())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await self.bus.stop()


def agent_config(port: int, tmp_path: Path, state: Path, kmsg: Path) -> str:
    return (
        f'[bus]\nhost = "127.0.0.1"\nport = {port}\nreconnect_max_s = 0.3\n\n'
        f'[agent]\nnode = "{NODE}"\nkmsg_path = "{kmsg}"\nstate_dir = "{state}"\n'
        "kmsg_from_start = true\n"  # the log starts empty: nothing written after start is missed
        f'socket_path = "{tmp_path}/a.sock"\n'
    )


@pytest.mark.real
async def test_full_state_dir_agent_runs_memory_only_reports_once_and_spools_again(tmp_path: Path) -> None:
    broker = Mosquitto(tmp_path / "mosq").start()
    kmsg = tmp_path / "kmsg.log"
    kmsg.touch()
    watch = Watch(broker.port)
    agent: Daemon | None = None

    def write(lines: range) -> None:
        with kmsg.open("a") as handle:
            handle.write("".join(xid_line(i) for i in lines))

    def distinct() -> int:
        return len(set(watch.xids))

    def alive() -> None:
        assert agent is not None and agent.proc is not None
        assert agent.proc.poll() is None, f"agent exited {agent.proc.returncode}:\n{agent.log()[-3000:]}"

    with tmpfs(tmp_path / "state", "1m") as state:
        try:
            await watch.start()
            agent = Daemon("agent", agent_config(broker.port, tmp_path, state, kmsg), tmp_path / "agent")
            agent.start()
            await asyncio.to_thread(agent.wait_log, "agent_started", 20)
            write(range(0, 20))
            await wait_for(lambda: distinct() == 20, 20, "the first 20 events", lambda: f"(got {distinct()})")

            filler = state / "filler"
            assert fill(filler) > 0  # the disk is full now, down to the last byte
            write(range(20, 80))  # each one needs the spool: short writes, then ENOSPC
            await wait_for(
                lambda: distinct() == 80, 20, "80 events on a full disk", lambda: f"({distinct()})"
            )
            alive()
            await wait_for(lambda: len(watch.problems("spool_unavailable")) >= 1, 10, "spool_unavailable")
            report = watch.problems("spool_unavailable")[0]
            assert report.severity is Severity.ERROR and "No space left" in report.data["error"]
            # What is on disk is a clean prefix: the torn record was cut back, nothing looks corrupt.
            _, _, problem = read_spool((state / "outbox.spool").read_bytes())
            assert problem is None

            write(range(80, 90))  # still full: the outage goes on, and is not reported again
            await wait_for(lambda: distinct() == 90, 20, "90 events", lambda: f"({distinct()})")
            filler.unlink()  # space returns: the agent spools durably again
            await wait_for(lambda: len(watch.problems("spool_recovered")) == 1, 10, "spool_recovered")
            alive()
            live, _, problem = read_spool((state / "outbox.spool").read_bytes())
            # Nothing is receipted (no coordinator): every event is in the spool again, exactly once.
            assert problem is None
            assert sorted(e.receipt_id or "" for e in live if "/events/xid" in e.topic) == sorted(
                set(watch.xids)
            )

            # Durable again: a broker outage, then SIGKILL, then a restart loses nothing.
            await asyncio.to_thread(broker.stop)
            write(range(90, 110))
            size = kmsg.stat().st_size
            await wait_for(lambda: position(state) == size, 20, "the outage lines handled")
            assert agent.proc is not None
            agent.proc.send_signal(signal.SIGKILL)
            agent.proc.wait(10)
            await asyncio.to_thread(broker.start)
            agent.start()
            await wait_for(lambda: distinct() >= 110, 30, "all 110 events", lambda: f"({distinct()})")
            await asyncio.sleep(0.5)  # late duplicates must not add distinct events
            assert distinct() == 110
            assert len(watch.problems("spool_unavailable")) == 1  # one outage, one report
            assert not watch.problems("spool_corrupt")
        finally:
            await watch.stop()
            if agent is not None:
                agent.stop()
            broker.stop()


# --- corrupt spool --------------------------------------------------------------------------------


def v1_spool(items: list[Outgoing]) -> bytes:
    """A spool as the agent wrote it before the per-record sync marker (header ``FTDSPL1\\n``)."""
    out = [b"FTDSPL1\n"]
    for seq, item in enumerate(items, 1):
        topic, rid = item.topic.encode(), (item.receipt_id or "").encode()
        head = struct.pack("<cQBBHH", b"R", seq, item.priority, 0, len(topic), len(rid))
        body = head + topic + rid + item.payload
        out.append(struct.pack("<II", len(body), zlib.crc32(body)) + body)
    return b"".join(out)


def current_spool(path: Path, items: list[Outgoing]) -> bytes:
    outbox = Outbox(MemoryBus(MemoryBroker()), path=path)
    for item in items:
        outbox.put(item)
    outbox.close()
    return path.read_bytes()


@pytest.mark.real
@pytest.mark.parametrize("version", ["current", "v1"])
async def test_corrupt_spool_records_after_the_damage_are_republished(tmp_path: Path, version: str) -> None:
    broker = Mosquitto(tmp_path / "mosq").start()
    kmsg = tmp_path / "kmsg.log"
    kmsg.touch()
    state = tmp_path / "state"
    state.mkdir()
    events = [
        make_event(NODE, Kind.XID, severity=Severity.ERROR, source="kmsg", data={"code": 79, "n": i})
        for i in range(30)
    ]
    items = [Outgoing(topics.node_event(NODE, "xid"), encode(e), priority=2, receipt_id=e.id) for e in events]
    spool = state / "outbox.spool"
    data = bytearray(v1_spool(items) if version == "v1" else current_spool(spool, items))
    # Damage inside records 10 and 11 (a run of zeroes over their boundary): 28 intact records.
    at = data.index(events[10].id.encode())
    end = data.index(events[11].id.encode())
    data[at : end + 4] = bytes(end + 4 - at)
    spool.write_bytes(bytes(data))
    expected = {e.id for i, e in enumerate(events) if i not in (10, 11)}

    watch = Watch(broker.port)
    agent = Daemon("agent", agent_config(broker.port, tmp_path, state, kmsg), tmp_path / "agent")
    try:
        await watch.start()
        agent.start()
        await wait_for(
            lambda: len(set(watch.xids)) >= len(expected),
            20,
            "the salvaged events",
            lambda: f"({len(set(watch.xids))} of {len(expected)})",
        )
        await wait_for(lambda: bool(watch.problems("spool_corrupt")), 10, "spool_corrupt")
        await asyncio.sleep(0.3)
        assert set(watch.xids) == expected  # every intact record, before and after the damage
        [report] = watch.problems("spool_corrupt")
        assert report.data["salvaged"] == 28 and report.data["skipped_bytes"] > 0
        assert await asyncio.to_thread(os.path.exists, report.data["quarantined"])
        # The fresh spool holds the salvage in the current format.
        live, _, problem = read_spool(spool.read_bytes())
        assert problem is None and {e.receipt_id for e in live} >= expected
        assert agent.proc is not None and agent.proc.poll() is None
    finally:
        await watch.stop()
        agent.stop()
        broker.stop()
