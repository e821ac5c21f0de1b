"""The agent's watchdog thread: a blocked event loop and a stalled kernel-log reader are noticed from
outside the loop, stacks are dumped once per stall, and systemd is pinged only while the loop runs."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from ftd.agent.watchdog import AgentWatchdog, FileKmsgProbe
from ftd.agent.watchers.kmsg import KmsgWatcher
from ftd.agent.watchers.kmsg_checkpoint import KmsgCheckpoint
from ftd.events import Event


def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> socket.socket:
    path = str(tmp_path / "notify.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    server.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    return server


def received(server: socket.socket) -> list[bytes]:
    out = []
    while True:
        try:
            out.append(server.recv(100))
        except BlockingIOError:
            return out


class Probe:
    def __init__(self) -> None:
        self.lines = 0
        self.waiting = 0

    def progress(self) -> int:
        return self.lines

    def pending(self) -> int:
        return self.waiting


async def test_a_blocked_loop_is_reported_once_with_stacks_and_stops_the_systemd_pings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = notify_socket(tmp_path, monkeypatch)
    dumps: list[float] = []
    watchdog = AgentWatchdog(
        healthy=lambda: True,
        stall_s=0.4,
        check_s=0.02,
        ping_every_s=0.05,
        dump_stacks=lambda: dumps.append(time.monotonic()),
    )
    with capture_logs() as logs:
        watchdog.start()
        try:
            await asyncio.sleep(0.5)  # a live loop: pings every 50 ms, no stall
            assert watchdog.stats.loop_stalls == 0 and dumps == []
            assert received(server).count(b"WATCHDOG=1") >= 5
            blocked_at = time.monotonic()
            time.sleep(1.2)  # noqa: ASYNC251 -- the point: the loop thread blocks, as a stuck lock would
            during = received(server)
            await asyncio.sleep(0.3)  # the loop runs again
        finally:
            watchdog.stop()
    stats = watchdog.stats
    assert stats.loop_stalls == 1 and stats.stack_dumps == 1 and len(dumps) == 1
    assert 0.35 <= dumps[0] - blocked_at < 1.2  # noticed while the loop was still blocked
    assert not stats.loop_stalled and stats.longest_loop_stall_s >= 0.4
    # The pings stopped within the stall threshold: what was sent during the block was sent before it.
    assert during.count(b"WATCHDOG=1") <= round(0.4 / 0.05) + 1
    assert received(server).count(b"WATCHDOG=1") >= 1  # and came back with the loop
    events = [entry["event"] for entry in logs]
    assert events.count("agent_loop_stalled") == 1 and events.count("agent_loop_recovered") == 1
    server.close()


async def test_no_pings_while_the_core_tasks_are_dead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = notify_socket(tmp_path, monkeypatch)
    healthy = [True]
    watchdog = AgentWatchdog(healthy=lambda: healthy[0], check_s=0.02, ping_every_s=0.05)
    watchdog.start()
    try:
        await asyncio.sleep(0.3)
        assert received(server).count(b"WATCHDOG=1") >= 3
        healthy[0] = False
        await asyncio.sleep(0.1)  # a beat sees it
        received(server)
        await asyncio.sleep(0.3)
        assert received(server) == []
        assert watchdog.stats.loop_stalls == 0
    finally:
        watchdog.stop()
        server.close()


async def test_without_systemd_watchdog_nothing_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = notify_socket(tmp_path, monkeypatch)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    watchdog = AgentWatchdog(healthy=lambda: True, check_s=0.02)
    watchdog.start()
    try:
        await asyncio.sleep(0.2)
    finally:
        watchdog.stop()
    assert received(server) == [] and watchdog.stats.pings == 0
    server.close()


def test_a_kmsg_reader_without_progress_while_input_waits_is_reported_once() -> None:
    probe = Probe()
    watchdog = AgentWatchdog(healthy=lambda: True, kmsg=probe, kmsg_stall_s=5.0, ping_every_s=None)
    with capture_logs() as logs:
        seen = watchdog.check_kmsg(100.0, (-1, 100.0))
        probe.lines, probe.waiting = 10, 0
        seen = watchdog.check_kmsg(101.0, seen)
        assert seen == (10, 101.0)
        probe.waiting = 512  # input arrives; the reader takes none of it
        for t in (102.0, 104.0, 105.9):
            seen = watchdog.check_kmsg(t, seen)
        assert watchdog.stats.kmsg_stalls == 0  # 4.9 s: not yet
        for t in (106.0, 107.0, 120.0):
            seen = watchdog.check_kmsg(t, seen)
        assert watchdog.stats.kmsg_stalls == 1 and watchdog.stats.kmsg_stalled
        probe.lines = 11  # it reads again
        seen = watchdog.check_kmsg(121.0, seen)
        assert not watchdog.stats.kmsg_stalled and seen == (11, 121.0)
        probe.lines = 11  # idle with nothing waiting is no stall
        probe.waiting = 0
        seen = watchdog.check_kmsg(200.0, seen)
    assert watchdog.stats.kmsg_stalls == 1
    stalled = [e for e in logs if e["event"] == "kmsg_reader_stalled"]
    assert len(stalled) == 1 and stalled[0]["pending_bytes"] == 512 and stalled[0]["lines"] == 10
    assert [e["event"] for e in logs].count("kmsg_reader_recovered") == 1


async def test_file_probe_counts_the_bytes_past_the_readers_position(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.log"
    path.write_text("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n")
    emitted: list[Event] = []

    async def emit(event: Event) -> None:
        emitted.append(event)

    watcher = KmsgWatcher(str(path), "n1", emit, checkpoint=KmsgCheckpoint(tmp_path / "pos"), from_start=True)
    probe = FileKmsgProbe(watcher)
    assert probe.pending() == 0  # not started: no position to compare with
    task = asyncio.create_task(watcher.run())
    try:
        for _ in range(200):
            if emitted:
                break
            await asyncio.sleep(0.01)
        assert len(emitted) == 1 and probe.pending() == 0 and probe.progress() == 1
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        extra = "NVRM: Xid (PCI:0000:3c:00): 79, pid=2, GPU has fallen off the bus.\n"
        with path.open("a") as handle:
            handle.write(extra)
        assert probe.pending() == len(extra)  # written, not read: the reader is not running
    finally:
        task.cancel()
