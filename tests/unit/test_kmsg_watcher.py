"""The kmsg watcher: following a file (append, truncate, rotate), a FIFO, /dev/kmsg, and restarts."""

# The tests poke at small files between awaits on purpose (that is the scenario being tested).
# ruff: noqa: ASYNC240

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from ftd.agent.watchers.kmsg import KmsgWatcher
from ftd.events import Event, Kind
from tests.realparts import REQUIRE_REAL

pytestmark = pytest.mark.timeout(60)


def xid(code: int, pid: int, bus: str = "3b") -> str:
    return f"[{time.monotonic():12.6f}] NVRM: Xid (PCI:0000:{bus}:00): {code}, pid={pid}, name=python, test\n"


class Harness:
    """Runs one watcher as a task and records what it emits."""

    def __init__(self, path: Path | str, state: Path | None, *, from_start: bool = False) -> None:
        self.events: list[Event] = []
        self.watcher = KmsgWatcher(str(path), "node-a", self._emit, state_path=state, from_start=from_start)
        self.task: asyncio.Task[None] | None = None

    async def _emit(self, event: Event) -> None:
        self.events.append(event)

    async def start(self) -> Harness:
        self.task = asyncio.create_task(self.watcher.run())
        await asyncio.sleep(0.1)  # let it open the source and settle its start position
        return self

    async def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    def pids(self) -> list[int]:
        return [e.data["pid"] for e in self.events if "pid" in e.data]

    async def wait_for(self, predicate: Callable[[], bool], within_s: float = 5.0) -> None:
        deadline = time.monotonic() + within_s
        while not predicate():
            if self.task is not None and self.task.done():
                self.task.result()  # surface a crash
            assert time.monotonic() < deadline, f"timed out; events={self.events}"
            await asyncio.sleep(0.01)


@pytest.fixture
async def log_file(tmp_path: Path) -> AsyncIterator[Path]:
    path = tmp_path / "kern.log"
    path.write_text("[    0.000000] Linux version 6.8.0\n" + xid(13, 1))  # pre-existing content
    yield path


def append(path: Path, text: str) -> None:
    with path.open("a") as handle:
        handle.write(text)


async def test_file_starts_at_end_and_follows_appends(log_file: Path, tmp_path: Path) -> None:
    harness = await Harness(log_file, tmp_path / "state.json").start()
    try:
        append(log_file, "noise\n" + xid(79, 101))
        await harness.wait_for(lambda: len(harness.events) == 1)
        event = harness.events[0]
        assert event.kind is Kind.XID and event.source == "kmsg" and event.node == "node-a"
        assert event.data["code"] == 79 and event.data["pci"] == "0000:3b:00.0" and event.data["pid"] == 101
        assert event.data["action"] == "RESTART_BM" and "uuid" not in event.data  # None values dropped
        assert event.severity == "critical"
        append(log_file, "half a li")  # incomplete line: not parsed until its newline arrives
        await asyncio.sleep(0.15)
        append(log_file, "ne\n" + xid(48, 102))
        await harness.wait_for(lambda: harness.pids() == [101, 102])
    finally:
        await harness.stop()


async def test_file_from_start_reads_existing(log_file: Path) -> None:
    harness = await Harness(log_file, None, from_start=True).start()
    try:
        await harness.wait_for(lambda: harness.pids() == [1])
    finally:
        await harness.stop()


async def test_latency_of_a_new_line(log_file: Path) -> None:
    harness = await Harness(log_file, None).start()
    try:
        start = time.monotonic()
        append(log_file, xid(79, 7))
        await harness.wait_for(lambda: len(harness.events) == 1)
        assert time.monotonic() - start < 0.5  # generous on a shared CI core; typical is ~25 ms
    finally:
        await harness.stop()


async def test_file_truncation(log_file: Path) -> None:
    harness = await Harness(log_file, None).start()
    try:
        append(log_file, xid(79, 201))
        await harness.wait_for(lambda: harness.pids() == [201])
        log_file.write_text("")  # truncate (logrotate copytruncate)
        await asyncio.sleep(0.1)
        append(log_file, xid(79, 202))
        await harness.wait_for(lambda: harness.pids() == [201, 202])
    finally:
        await harness.stop()


async def test_file_rotation(log_file: Path) -> None:
    harness = await Harness(log_file, None).start()
    try:
        append(log_file, xid(79, 301))
        await harness.wait_for(lambda: harness.pids() == [301])
        rotated = log_file.with_suffix(".1")
        log_file.rename(rotated)
        append(rotated, xid(79, 302))  # written by the old writer after the rename: still read
        log_file.write_text(xid(79, 303))  # the new file
        await harness.wait_for(lambda: harness.pids() == [301, 302, 303])
        append(log_file, xid(79, 304))
        await harness.wait_for(lambda: harness.pids() == [301, 302, 303, 304])
    finally:
        await harness.stop()


async def test_restart_from_state_no_duplicates_none_missed(log_file: Path, tmp_path: Path) -> None:
    state = tmp_path / "state" / "kmsg.json"
    first = await Harness(log_file, state).start()
    append(log_file, xid(79, 401) + xid(79, 402))
    await first.wait_for(lambda: first.pids() == [401, 402])
    await first.stop()
    saved = json.loads(state.read_text())
    assert saved["kind"] == "file" and saved["offset"] == log_file.stat().st_size

    append(log_file, xid(79, 403) + "noise\n" + xid(79, 404))  # while the agent is down
    second = await Harness(log_file, state).start()
    try:
        append(log_file, xid(79, 405))
        await second.wait_for(lambda: second.pids() == [403, 404, 405])
        await asyncio.sleep(0.1)
        assert second.pids() == [403, 404, 405]
    finally:
        await second.stop()
    ids = [e.id for e in first.events + second.events]
    assert len(set(ids)) == len(ids)


async def test_state_of_a_rotated_file_reads_the_new_file_from_start(log_file: Path, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    first = await Harness(log_file, state).start()
    append(log_file, xid(79, 501))
    await first.wait_for(lambda: first.pids() == [501])
    await first.stop()
    log_file.rename(log_file.with_suffix(".1"))
    log_file.write_text(xid(79, 502))
    second = await Harness(log_file, state).start()
    try:
        await second.wait_for(lambda: second.pids() == [502])
    finally:
        await second.stop()


async def test_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    harness = await Harness(fifo, tmp_path / "state.json").start()
    try:
        for pid in (601, 602):  # two writers in turn: the watcher must survive the first one closing
            fd = os.open(fifo, os.O_WRONLY)
            os.write(fd, ("noise\n" + xid(79, pid)).encode())
            os.close(fd)
            await harness.wait_for(lambda pid=pid: pid in harness.pids())  # type: ignore[misc]
        assert harness.pids() == [601, 602]
        await asyncio.sleep(0.1)
        assert not (tmp_path / "state.json").exists()
    finally:
        await harness.stop()


# --- the real /dev/kmsg ------------------------------------------------------------------------


def _kmsg_writable() -> bool:
    try:
        os.close(os.open("/dev/kmsg", os.O_WRONLY))
        os.close(os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK))
    except OSError:
        return False
    return True


def _write_kmsg(line: str) -> None:
    fd = os.open("/dev/kmsg", os.O_WRONLY)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@pytest.mark.real
async def test_dev_kmsg_follow_and_restart(tmp_path: Path) -> None:
    if not _kmsg_writable():
        if REQUIRE_REAL:
            pytest.fail("FTD_REQUIRE_REAL=1 and /dev/kmsg is not readable and writable", pytrace=False)
        pytest.skip("needs root for /dev/kmsg")
    base = random.randint(10_000_000, 90_000_000)  # our own pids: other writers may share the buffer
    ours = set(range(base, base + 3))
    state = tmp_path / "kmsg.json"
    first = await Harness("/dev/kmsg", state).start()
    _write_kmsg(f"NVRM: Xid (PCI:0000:3b:00): 79, pid={base}, name=ftdtest, GPU has fallen off the bus.\n")
    await first.wait_for(lambda: base in first.pids())
    event = next(e for e in first.events if e.data.get("pid") == base)
    assert isinstance(event.data["seq"], int)
    await first.stop()

    _write_kmsg(f"NVRM: Xid (PCI:0000:3b:00): 13, pid={base + 1}, name=ftdtest, written while down\n")
    second = await Harness("/dev/kmsg", state).start()
    try:
        _write_kmsg(f"NVRM: Xid (PCI:0000:3b:00): 13, pid={base + 2}, name=ftdtest, after restart\n")
        await second.wait_for(lambda: {base + 1, base + 2} <= set(second.pids()))
        assert [p for p in second.pids() if p in ours] == [base + 1, base + 2]
        assert [p for p in first.pids() if p in ours] == [base]
    finally:
        await second.stop()
