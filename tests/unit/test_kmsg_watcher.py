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

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.agent.follow import FileFollower
from ftd.agent.kmsg_parse import KernelEvent, KmsgParser, Template
from ftd.agent.storm import StormControl, StormState
from ftd.agent.watchers.kmsg import KmsgWatcher
from ftd.agent.watchers.kmsg_checkpoint import KmsgCheckpoint
from ftd.events import Event, Kind
from tests.properties import examples
from tests.realparts import REQUIRE_REAL

pytestmark = pytest.mark.timeout(60)


def xid(code: int, pid: int, bus: str = "3b") -> str:
    return f"[{time.monotonic():12.6f}] NVRM: Xid (PCI:0000:{bus}:00): {code}, pid={pid}, name=python, test\n"


class Harness:
    """Runs one watcher as a task and records what it emits."""

    def __init__(self, path: Path | str, state: Path | None, *, from_start: bool = False) -> None:
        self.events: list[Event] = []
        self.watcher = KmsgWatcher(
            str(path), "node-a", self._emit, checkpoint=KmsgCheckpoint(state), from_start=from_start
        )
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


# --- with storm control: repeats, the checkpoint, kills -----------------------------------------


class Killed(Exception):
    """Stands for SIGKILL at a chosen step: the watcher and storm control are then abandoned."""


class TwoPerLine(KmsgParser):
    """A parser that reads two events from a line saying ``TWO``, the second on a GPU of its own
    (always a first occurrence): no real line does that today, but the position must handle it (a
    checkpoint falls between the two, when the first one was folded)."""

    def feed(self, line: str, lineno: int) -> list[KernelEvent]:
        events = super().feed(line, lineno)
        if "TWO" in line and events:
            events.append(msgspec.structs.replace(events[0], pci=f"0001:{lineno % 256:02x}:00.0"))
        return events

    def cached(self, line: str, lineno: int) -> Template | None:
        return None if "TWO" in line else super().cached(line, lineno)


class Life:
    """One agent life: the watcher with storm control in front of a "spool" (what reached it survives
    a kill) and the checkpoint on disk; ``kill_at`` is the publish or checkpoint write that dies."""

    def __init__(self, path: Path, state: Path, spool: list[Event], kill_at: int, *, cache: bool) -> None:
        self.steps = 0
        self.kill_at = kill_at
        self.spool = spool
        life = self

        class Checkpoint(KmsgCheckpoint):
            def save(self, storm: StormState | None = None) -> None:
                life.step()
                super().save(storm)

        checkpoint = Checkpoint(state)
        self.storm = StormControl(self._publish, window_s=1.0, clock=self.now, checkpoint=checkpoint)
        self.watcher = KmsgWatcher(
            str(path), "node-a", self.storm.process, checkpoint=checkpoint, from_start=True,
            poll_interval=0.001, parser=TwoPerLine(cache_size=1024 if cache else 0), storm=self.storm,
        )  # fmt: skip

    def now(self) -> float:
        """Storm control's clock: 10 ms a line read (windows of 1 s end every 100 lines)."""
        watcher = self.__dict__.get("watcher")  # None while storm control restores its checkpoint
        return watcher.lines * 0.01 if watcher is not None else 0.0

    def step(self) -> None:
        self.steps += 1
        if self.steps == self.kill_at:
            raise Killed

    async def _publish(self, event: Event) -> None:
        self.step()
        self.spool.append(event)

    async def run(self, size: int, state: Path) -> bool:
        """Read until the saved position reaches ``size`` (True) or the life is killed (False)."""
        task = asyncio.create_task(self.watcher.run())
        try:
            while not task.done():
                try:
                    if json.loads(state.read_text()).get("offset") == size:
                        return True
                except (OSError, ValueError):
                    pass
                await asyncio.sleep(0.002)
            if isinstance(task.exception(), Killed):
                return False
            task.result()
            raise AssertionError("the watcher ended")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Killed):
                await task


def storm_log() -> tuple[str, int]:
    """Two interleaved Xid storms, noise, lone Xids, lines with two events; and how many events."""
    lines, events = [], 0
    for i in range(150):
        lines.append(f"[{i:6d}.000001] NVRM: Xid (PCI:0000:3b:00): 95, pid=7, name=python, Ch 00000008")
        events += 1
        if i % 3 == 0:
            lines.append(f"[{i:6d}.000002] NVRM: Xid (PCI:0000:86:00): 45, pid={i % 2}, name=python, Ch 1")
            events += 1
        if i % 10 == 7:
            lines.append(f"[{i:6d}.000003] NVRM: Xid (PCI:0000:07:00): 43, pid=1, name=x, TWO GPUs")
            events += 2
        lines.append(f"[{i:6d}.000004] usb 1-1: new high-speed USB device number {i} using xhci_hcd")
    return "".join(line + "\n" for line in lines), events


def counted(spool: list[Event]) -> int:
    seen: dict[str, int] = {}
    for event in spool:
        assert seen.setdefault(event.id, event.count) == event.count, f"{event.id} with two counts"
    return sum(seen.values())


@pytest.mark.parametrize("cache", [True, False], ids=["repeats-folded-fast", "every-line-parsed"])
async def test_a_kill_at_any_publish_or_checkpoint_loses_no_count_and_counts_none_twice(
    tmp_path: Path, cache: bool
) -> None:
    text, events = storm_log()
    path = tmp_path / "kern.log"
    path.write_text(text)
    size = path.stat().st_size

    async def lives(kill_at: int) -> tuple[int, int]:
        state = tmp_path / f"kill{kill_at}" / "kmsg.position"
        spool: list[Event] = []
        life = first = Life(path, state, spool, kill_at, cache=cache)
        while True:
            try:
                if await life.run(size, state):
                    await life.storm.close()  # a clean stop at the end (a kill may hit it too)
                    return counted(spool), first.steps
            except Killed:
                pass
            life = Life(path, state, spool, 0, cache=cache)  # restart from what is on disk

    total, steps = await lives(0)
    assert total == events
    assert steps > 20  # first occurrences, summaries, the checkpoints between them: all kill points
    for kill_at in range(1, steps + 1):
        assert (await lives(kill_at))[0] == events, f"killed at step {kill_at}"


async def test_repeats_folded_fast_give_the_events_a_full_parse_gives(tmp_path: Path) -> None:
    text, events = storm_log()
    path = tmp_path / "kern.log"
    path.write_text(text)
    runs = []
    for cache in (True, False):
        spool: list[Event] = []
        life = Life(path, tmp_path / f"{cache}.position", spool, 0, cache=cache)
        assert await life.run(path.stat().st_size, tmp_path / f"{cache}.position")
        await life.storm.close()
        assert counted(spool) == events
        runs.append(
            [(e.id, e.count, e.severity, {k: v for k, v in e.data.items() if k != "first_ts"}) for e in spool]
        )
    assert runs[0] == runs[1]
    assert len(runs[0]) < events // 4  # the storms did fold


async def test_a_restart_skips_the_events_of_a_line_already_handled(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text("noise\n" + xid(43, 1).replace("test", "TWO GPUs"))
    state = tmp_path / "kmsg.position"
    inode = path.stat().st_ino
    state.write_text(json.dumps({"kind": "file", "inode": inode, "offset": 6, "done": 1}))
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    watcher = KmsgWatcher(str(path), "node-a", emit, checkpoint=KmsgCheckpoint(state), parser=TwoPerLine())
    task = asyncio.create_task(watcher.run())
    try:
        deadline = time.monotonic() + 5
        while json.loads(state.read_text()).get("offset") != path.stat().st_size:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert [(e.id, e.data["pci"]) for e in events] == [
        (f"node-a-kmsg-{inode}-{path.stat().st_size}-1", "0001:01:00.0")  # line 1 of this run
    ]


# --- the follower's line splitting (the kmsg file path reads a storm through it) -----------------


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=30),
    st.booleans(),
    st.integers(1, 64),
    st.one_of(st.none(), st.integers(1, 12)),
)
def test_follower_lines_and_offsets_whatever_the_chunking(
    tmp_path_factory: pytest.TempPathFactory, lines: list[bytes], tail: bool, chunk: int, max_line: int | None
) -> None:
    """Whole lines, cut at ``max_line``, each with the offset past its newline, an incomplete last line
    held back: the same whatever the read size (the fast split must agree with the byte-by-byte one)."""
    data = b"".join(line + b"\n" for line in lines) + (b"incomplete" if tail else b"")
    path = tmp_path_factory.mktemp("follow") / "k.log"
    path.write_bytes(data)
    follower = FileFollower(str(path), chunk=chunk, max_line=max_line)
    follower.open()
    try:
        got: list[tuple[bytes, int]] = []
        while (batch := follower.read()) is not None:
            got.extend(batch)
    finally:
        follower.close()
    ends = [sum(len(line) + 1 for line in lines[: i + 1]) for i in range(len(lines))]
    cut = [line if max_line is None else line[:max_line] for line in lines]
    assert got == list(zip(cut, ends, strict=True))
    assert follower.offset == (ends[-1] if ends else 0) and follower.position == len(data)
    too_long = [
        line for line in lines + ([b"incomplete"] if tail else []) if max_line and len(line) > max_line
    ]
    assert follower.cut_lines == len(too_long)


@pytest.mark.real
async def test_dev_kmsg_storm_counts_survive_a_kill(tmp_path: Path) -> None:
    """The device path with storm control: repeats (records) fold, a kill keeps their count."""
    if not _kmsg_writable():
        if REQUIRE_REAL:
            pytest.fail("FTD_REQUIRE_REAL=1 and /dev/kmsg is not readable and writable", pytrace=False)
        pytest.skip("needs root for /dev/kmsg")
    # A GPU address of our own: other writers (other tests) share the ring buffer. Five lines in all:
    # userspace writes to /dev/kmsg are rate-limited (10 per 5 s).
    domain, bus = random.randint(0x100, 0xFFFF), random.randint(0x10, 0xFF)
    line = f"NVRM: Xid (PCI:{domain:04x}:{bus:02x}:00): 45, pid=1, name=ftdtest, storm\n"
    pci = f"{domain:04x}:{bus:02x}:00.0"
    state = tmp_path / "kmsg.position"
    spool: list[Event] = []

    async def publish(event: Event) -> None:
        spool.append(event)

    def ours() -> list[Event]:
        return [e for e in spool if e.data.get("pci") == pci]

    storm = StormControl(publish, checkpoint=(checkpoint := KmsgCheckpoint(state)))
    first = KmsgWatcher("/dev/kmsg", "node-a", storm.process, checkpoint=checkpoint, storm=storm)
    task = asyncio.create_task(first.run())
    await asyncio.sleep(0.1)
    for _ in range(3):
        _write_kmsg(line)
    deadline = time.monotonic() + 5
    while storm.pending < 2:  # the first went out, two repeats are counted
        assert time.monotonic() < deadline, ours()
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # the drain's checkpoint
    task.cancel()  # a kill: storm control is abandoned with its two repeats pending
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert [e.count for e in ours()] == [1]

    for _ in range(2):
        _write_kmsg(line)  # while the agent is down
    storm = StormControl(publish, checkpoint=(checkpoint := KmsgCheckpoint(state)))
    second = KmsgWatcher("/dev/kmsg", "node-a", storm.process, checkpoint=checkpoint, storm=storm)
    task = asyncio.create_task(second.run())
    try:
        deadline = time.monotonic() + 5
        while storm.pending < 4:  # two restored, two read after the restart
            assert time.monotonic() < deadline, ours()
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await storm.close()
    assert [e.count for e in ours()] == [1, 4]
