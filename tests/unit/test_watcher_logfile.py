"""The training-log watcher: globs, rotation, truncation, patterns, rate limits, staleness, junk."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ftd.agent.watchers.logfile import LogWatcher
from ftd.catalog.log_patterns import load_patterns, parse_patterns
from ftd.config import LogsConfig
from ftd.events import Event, Kind, Severity

pytestmark = pytest.mark.timeout(60)


class Harness:
    def __init__(self, paths: list[str], *, inotify: bool = True, **cfg: object) -> None:
        self.events: list[Event] = []
        self.now = 0.0
        config = LogsConfig(paths=paths, **{"rescan_s": 0.1, "rate_limit_s": 10.0, **cfg})  # type: ignore[arg-type]
        self.watcher = LogWatcher(config, "node-a", self.emit, clock=lambda: self.now, use_inotify=inotify)
        self.task: asyncio.Task[None] | None = None

    async def emit(self, event: Event) -> None:
        self.events.append(event)

    async def start(self) -> Harness:
        self.task = asyncio.create_task(self.watcher.run())
        await asyncio.sleep(0.2)
        return self

    async def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    def patterns(self) -> list[str]:
        return [e.data["pattern"] for e in self.events if e.kind is Kind.LOG_PATTERN]

    async def wait_for(self, predicate: Callable[[], bool], within_s: float = 10.0) -> None:
        deadline = time.monotonic() + within_s
        while not predicate():
            if self.task is not None and self.task.done():
                self.task.result()
            assert time.monotonic() < deadline, f"timed out; events={self.events}"
            await asyncio.sleep(0.02)


def append(path: Path, data: str | bytes) -> None:
    with path.open("ab") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)


def test_builtin_patterns_match_the_classics() -> None:
    table = load_patterns()

    def first(line: str) -> str | None:
        return next((p.name for p in table if p.regex.search(line)), None)

    assert first("node3:1234:1250 [0] NCCL WARN Call to ibv_create_cq failed") == "nccl_warn"
    assert first("RuntimeError: NCCL error: unhandled system error, NCCL version 2.21.5") == (
        "nccl_unhandled_system_error"
    )
    assert first("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)") == (
        "nccl_watchdog_timeout"
    )
    assert first("torch.distributed.DistBackendError: ncclInternalError: Internal check failed") == (
        "nccl_internal_error"
    )
    assert first("RuntimeError: CUDA error: an illegal memory access was encountered") == (
        "cuda_illegal_memory_access"
    )
    assert first("RuntimeError: CUDA error: uncorrectable ECC error encountered") == "cuda_uncorrectable_ecc"
    assert first("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB") == "cuda_oom"
    assert first("Fatal Python error: Segmentation fault") == "segfault"
    assert first("step 100 loss 2.31") is None


def test_bad_pattern_tables_are_refused_with_the_entry_named() -> None:
    with pytest.raises(ValueError, match=r"pattern\[0\] \(x\): bad regex"):
        parse_patterns('[[pattern]]\nname = "x"\nregex = "("\n')
    with pytest.raises(ValueError, match="duplicate"):
        parse_patterns('[[pattern]]\nname = "x"\nregex = "a"\n[[pattern]]\nname = "x"\nregex = "b"\n')
    with pytest.raises(ValueError, match=r"severity|not a valid"):
        parse_patterns('[[pattern]]\nname = "x"\nregex = "a"\nseverity = "loud"\n')


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "polling"])
async def test_follows_appends_glob_rotation_truncation(tmp_path: Path, inotify: bool) -> None:
    log0 = tmp_path / "rank0.log"
    log0.write_text("old: NCCL WARN before the agent started\n" * 3)
    h = await Harness([str(tmp_path / "rank*.log")], inotify=inotify, rate_limit_s=0).start()
    try:
        append(log0, "step 1\nRuntimeError: CUDA error: an illegal memory access was encountered\n")
        await h.wait_for(lambda: len(h.events) == 1)
        event = h.events[0]
        assert event.data["pattern"] == "cuda_illegal_memory_access" and event.severity is Severity.ERROR
        assert event.data["file"] == str(log0) and event.data["line"] == 5  # counted from the file's start
        # a new file matching the glob is read from its start
        log1 = tmp_path / "rank1.log"
        log1.write_text("Fatal Python error: Segmentation fault\n")
        await h.wait_for(lambda: "segfault" in h.patterns())
        assert h.events[-1].data["line"] == 1
        # rotation: rename + new file
        append(log0, "last line of the old file: NCCL WARN x\n")
        os.rename(log0, tmp_path / "rank0.log.1")
        log0.write_text("Watchdog caught collective operation timeout: WorkNCCL\n")
        await h.wait_for(lambda: "nccl_watchdog_timeout" in h.patterns())
        assert "nccl_warn" in h.patterns()
        # truncation (copytruncate)
        log1.write_text("")
        append(log1, "CUDA out of memory\n")
        await h.wait_for(lambda: "cuda_oom" in h.patterns())
        assert h.events[-1].data["line"] == 1
        assert h.watcher.stats["rotations"] >= 1 and h.watcher.stats["truncations"] >= 1
        if inotify:
            assert h.watcher.inotify_active
    finally:
        await h.stop()


async def test_rate_limit_per_pattern_and_file(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text("")
    h = await Harness([str(path)], rate_limit_s=10.0).start()
    try:
        append(path, "NCCL WARN a\n" * 50 + "Segmentation fault\n")
        await h.wait_for(lambda: h.watcher.stats["lines"] >= 51)
        assert sorted(h.patterns()) == ["nccl_warn", "segfault"]
        h.now += 11
        append(path, "NCCL WARN b\n")
        await h.wait_for(lambda: len(h.events) == 3)
        assert h.events[-1].data["suppressed"] == 49
    finally:
        await h.stop()


async def test_stale_once_per_episode_rearmed_on_growth(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text("step 1\n")
    h = await Harness([str(path)], stale_after_s=30.0).start()
    try:
        h.now += 31
        await h.wait_for(lambda: any(e.kind is Kind.LOG_STALE for e in h.events))
        h.now += 100
        await asyncio.sleep(0.4)
        assert sum(e.kind is Kind.LOG_STALE for e in h.events) == 1
        stale = next(e for e in h.events if e.kind is Kind.LOG_STALE)
        assert stale.data["file"] == str(path) and stale.data["idle_s"] >= 30
        append(path, "step 2\n")
        await h.wait_for(lambda: h.watcher.stats["lines"] >= 1)
        h.now += 31
        await h.wait_for(lambda: sum(e.kind is Kind.LOG_STALE for e in h.events) == 2)
    finally:
        await h.stop()


async def test_binary_junk_partial_and_huge_lines_survive(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text("")
    h = await Harness([str(path)], max_line_bytes=4096, rate_limit_s=0).start()
    try:
        append(path, bytes(b for b in range(256) if b != 10) * 40 + b"\n")  # NULs, invalid UTF-8
        append(path, b"x" * (1 << 20) + b" Segmentation fault at the end of a 1 MB line\n")
        append(path, b"\xff\xfe CUDA error: an illegal memory access\n")
        append(path, b"Segmentation fault, half a line")  # no newline yet
        await h.wait_for(lambda: h.watcher.stats["lines"] >= 3)
        await asyncio.sleep(0.2)
        assert h.patterns() == ["cuda_illegal_memory_access"]  # the match beyond the cap is not seen
        assert h.watcher.stats["binary_lines"] == 1 and h.watcher.stats["long_lines"] >= 1
        follower = next(iter(h.watcher.followers.values()))
        assert len(follower.file.partial) <= 4096
        append(path, " completed\n")
        await h.wait_for(lambda: h.patterns()[-1:] == ["segfault"])
        assert h.events[-1].data["line"] == 4
        assert len(h.events[-1].data["text"]) <= 512
    finally:
        await h.stop()
