"""The memory watcher with fake /proc text.

A trainer's own memory is ``RssAnon`` of /proc/PID/status; ``VmRSS`` adds file pages it has mapped
(a memory-mapped dataset, shared libraries), which grow as the dataset is read and are not a leak
(issue #31 item 10). The fake status has both, and ``VmRSS`` only where a kernel before 4.5 lacks
``RssAnon``."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.agent.watchers.memory import MemoryWatcher, parse_meminfo, parse_psi_some_avg10, parse_rss_kb
from ftd.config import MemoryConfig
from ftd.events import Event, Kind, Severity
from tests.properties import examples

pytestmark = pytest.mark.timeout(60)

MEMINFO = "MemTotal:       {total} kB\nMemFree:         1000 kB\nMemAvailable:   {avail} kB\nBuffers: 5 kB\n"
PSI = (
    "some avg10={some:.2f} avg60=0.00 avg300=0.00 total=123\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
)
STATUS = (
    "Name:\tpython\nVmPeak:\t 99999999 kB\nVmRSS:\t {vmrss} kB\nRssAnon:\t {anon} kB\n"
    "RssFile:\t {file} kB\nRssShmem:\t 0 kB\nThreads:\t12\n"
)
OLD_KERNEL_STATUS = "Name:\tpython\nVmPeak:\t 99999999 kB\nVmRSS:\t {vmrss} kB\nThreads:\t12\n"


class FakeProc:
    def __init__(self) -> None:
        self.total_kb = 100 * 1024 * 1024  # 100 GiB
        self.avail_kb = 60 * 1024 * 1024
        self.psi: float | None = 0.0
        self.rss_kb: dict[int, int] = {}  # RssAnon: the process's own memory
        self.mapped_kb: dict[int, int] = {}  # RssFile: mapped file pages (a memory-mapped dataset)
        self.old_kernel = False  # no RssAnon line (Linux before 4.5)
        self.now = 0.0
        self.events: list[Event] = []

    def read(self, path: str) -> str:
        if path == "/proc/meminfo":
            return MEMINFO.format(total=self.total_kb, avail=self.avail_kb)
        if path == "/proc/pressure/memory":
            if self.psi is None:
                raise FileNotFoundError(path)
            return PSI.format(some=self.psi)
        pid = int(path.split("/")[2])
        if pid not in self.rss_kb:
            raise FileNotFoundError(path)
        anon, mapped = self.rss_kb[pid], self.mapped_kb.get(pid, 0)
        status = OLD_KERNEL_STATUS if self.old_kernel else STATUS
        return status.format(vmrss=anon + mapped, anon=anon, file=mapped)

    async def emit(self, event: Event) -> None:
        self.events.append(event)


def make(proc: FakeProc, pids: dict[int, tuple[str, int]] | None = None, **cfg: float) -> MemoryWatcher:
    return MemoryWatcher(
        MemoryConfig(**cfg),  # type: ignore[arg-type]
        "node-a",
        proc.emit,
        pids=lambda: dict(pids or {}),
        read_text=proc.read,
        clock=lambda: proc.now,
    )


def test_parsers() -> None:
    assert parse_meminfo(MEMINFO.format(total=10, avail=4))["MemAvailable"] == 4
    assert parse_psi_some_avg10(PSI.format(some=12.5)) == 12.5
    assert parse_rss_kb(STATUS.format(vmrss=1777, anon=777, file=1000)) == (777, "RssAnon")
    assert parse_rss_kb(OLD_KERNEL_STATUS.format(vmrss=1777)) == (1777, "VmRSS")
    assert parse_rss_kb("Name: kthreadd\n") is None
    assert parse_rss_kb("RssAnon:\t garbage kB\nVmRSS:\t 12 kB\n") == (12, "VmRSS")


async def test_host_pressure_levels_and_hysteresis() -> None:
    proc = FakeProc()
    w = make(proc)
    gib = 1024 * 1024
    for avail_gib, psi in ((60, 0), (9, 0), (4, 0), (6, 0), (8, 0), (13, 0), (50, 30), (50, 16), (50, 5)):
        proc.avail_kb, proc.psi = avail_gib * gib, psi
        await w.poll_once()
    got = [(e.data["level"], e.severity) for e in proc.events]
    assert got == [
        ("warning", Severity.WARNING),  # 9% available
        ("critical", Severity.CRITICAL),  # 4%
        ("warning", Severity.WARNING),  # 8%: out of critical (>= 5 + 2)
        ("ok", Severity.INFO),  # 13%
        ("warning", Severity.WARNING),  # PSI 30
        ("ok", Severity.INFO),  # PSI 5 (16 is not calm enough)
    ]
    assert all(e.kind is Kind.MEM_PRESSURE and e.data["leak"] is False for e in proc.events)


async def test_no_psi_file_is_fine() -> None:
    proc = FakeProc()
    proc.psi = None
    w = make(proc)
    await w.poll_once()
    await w.poll_once()
    assert w.psi_available is False and proc.events == []


async def test_slow_leak_detected_once_with_projection() -> None:
    proc = FakeProc()
    proc.avail_kb = 20 * 1024 * 1024  # 20 GiB available
    pids = {101: ("job-1", 0), 102: ("job-1", 1)}
    w = make(proc, pids, leak_min_samples=6, leak_min_growth_mb_per_min=10, leak_horizon_s=3600)
    proc.rss_kb = {101: 4_000_000, 102: 4_000_000}
    for _ in range(20):
        await w.poll_once()
        proc.now += 60
        proc.rss_kb[101] += 500 * 1024  # 500 MB per minute: 20 GiB gone in ~41 min
        proc.rss_kb[102] += 1024  # 1 MB per minute: fine
        proc.avail_kb -= 500 * 1024
    leaks = [e for e in proc.events if e.data.get("leak")]
    assert len(leaks) == 1
    leak = leaks[0]
    assert (leak.data["pid"], leak.data["job"], leak.data["rank"]) == (101, "job-1", 0)
    assert leak.data["growth_mb_per_min"] == pytest.approx(500, rel=0.05)
    assert 0 < leak.data["time_to_exhaustion_s"] < 3600
    assert leak.data["rss_mb"] > 4000


async def test_vanished_pid_is_forgotten() -> None:
    proc = FakeProc()
    w = make(proc, {7: ("j", 3)})
    await w.poll_once()  # pid 7 has no status file: gone between pids() and the read
    assert w.trainers == {} and proc.events == []


async def test_leak_warns_then_escalates_once_if_it_goes_on() -> None:
    proc = FakeProc()
    proc.avail_kb = 30 * 1024 * 1024  # 30 GiB available
    leak_cfg = {"leak_min_samples": 6, "leak_min_growth_mb_per_min": 10, "leak_horizon_s": 3600}
    w = make(proc, {101: ("job-1", 0)}, **leak_cfg)
    proc.rss_kb = {101: 4_000_000}
    for _ in range(60):
        await w.poll_once()
        proc.now += 60
        proc.rss_kb[101] += 512 * 1024  # 512 MB per minute
        proc.avail_kb = max(0, proc.avail_kb - 512 * 1024)
    leaks = [e for e in proc.events if e.data.get("leak")]
    assert [(e.severity, e.data["escalated"]) for e in leaks] == [
        (Severity.WARNING, False),  # first seen with ~55 min left
        (Severity.CRITICAL, True),  # still growing with under 15 min left: stop before the OOM killer
    ]
    assert leaks[0].data["time_to_exhaustion_s"] > 900 >= leaks[1].data["time_to_exhaustion_s"]
    assert all((e.data["job"], e.data["rank"], e.data["pid"]) == ("job-1", 0, 101) for e in leaks)


async def test_one_rss_jump_is_not_a_leak() -> None:
    proc = FakeProc()
    proc.avail_kb = 20 * 1024 * 1024
    leak_cfg = {"leak_min_samples": 6, "leak_min_growth_mb_per_min": 10, "leak_horizon_s": 3600}
    w = make(proc, {101: ("job-1", 0)}, **leak_cfg)
    proc.rss_kb = {101: 4_000_000}
    for i in range(20):
        if i == 10:
            proc.rss_kb[101] += 8 * 1024 * 1024  # a data shard loaded: +8 GiB once
            proc.avail_kb -= 8 * 1024 * 1024
        await w.poll_once()
        proc.now += 60
    assert [e for e in proc.events if e.data.get("leak")] == []


async def test_host_pressure_names_the_jobs_and_the_largest_rank() -> None:
    proc = FakeProc()
    pids = {101: ("job-1", 0), 102: ("job-1", 1), 201: ("job-2", 0)}
    w = make(proc, pids)
    proc.rss_kb = {101: 1_000_000, 102: 9_000_000, 201: 2_000_000}
    proc.avail_kb = 4 * 1024 * 1024  # 4% of 100 GiB: critical
    await w.poll_once()
    (event,) = proc.events
    assert event.severity is Severity.CRITICAL and event.data["leak"] is False
    assert event.data["job"] is None and event.data["rank"] is None
    assert event.data["jobs"] == ["job-1", "job-2"]
    top = {"job": "job-1", "rank": 1, "pid": 102, "rss_mb": round(9_000_000 / 1024, 1)}
    assert event.data["top_rank"] == top


LEAK = {"leak_min_samples": 6, "leak_min_growth_mb_per_min": 10, "leak_horizon_s": 3600}


async def one_rank_for_20_minutes(
    proc: FakeProc, *, own_kb: int, mapped_kb: int, own_per_min: int, mapped_per_min: int = 0
) -> tuple[MemoryWatcher, list[Event]]:
    """Rank 0 of job-1 (pid 101) polled once a minute for 20 minutes with 20 GiB available, its own
    memory (RssAnon) and its mapped file pages (RssFile) growing as given; its leak events."""
    proc.avail_kb = 20 * 1024 * 1024
    w = make(proc, {101: ("job-1", 0)}, **LEAK)
    proc.rss_kb, proc.mapped_kb = {101: own_kb}, {101: mapped_kb}
    for _ in range(20):
        await w.poll_once()
        proc.now += 60
        proc.rss_kb[101] += own_per_min
        proc.mapped_kb[101] += mapped_per_min
    return w, [e for e in proc.events if e.data.get("leak")]


async def test_a_memory_mapped_dataset_read_in_is_not_a_leak() -> None:
    proc = FakeProc()
    # the dataset's pages come in at 500 MB per minute; its own memory barely moves
    w, leaks = await one_rank_for_20_minutes(
        proc, own_kb=4_000_000, mapped_kb=0, own_per_min=100, mapped_per_min=500 * 1024
    )
    assert leaks == []
    assert w.trainers[101].rss_kb == 4_000_000 + 19 * 100  # the 20th increment comes after the last poll


async def test_anonymous_growth_is_a_leak_and_says_what_it_measured() -> None:
    proc = FakeProc()
    _, leaks = await one_rank_for_20_minutes(
        proc, own_kb=4_000_000, mapped_kb=30_000_000, own_per_min=500 * 1024
    )
    assert len(leaks) == 1
    assert leaks[0].data["rss_field"] == "RssAnon"
    assert 4000 < leaks[0].data["rss_mb"] < 30_000  # its own memory, not the 30 GB mapped


async def test_without_rss_anon_the_watcher_falls_back_to_vmrss_and_says_so() -> None:
    proc = FakeProc()
    proc.old_kernel = True
    _, leaks = await one_rank_for_20_minutes(proc, own_kb=4_000_000, mapped_kb=0, own_per_min=500 * 1024)
    assert len(leaks) == 1 and leaks[0].data["rss_field"] == "VmRSS"


@settings(max_examples=examples(300), deadline=None)
@given(
    lines=st.lists(
        st.one_of(
            st.text(max_size=40),
            st.builds(
                "{}:\t{} kB".format,
                st.sampled_from(["RssAnon", "VmRSS", "RssFile", "VmPeak", "Rss"]),
                st.one_of(st.integers(0, 10**12).map(str), st.text(max_size=8)),
            ),
        ),
        max_size=12,
    )
)
def test_the_status_parser_takes_rssanon_first_and_never_raises(lines: list[str]) -> None:
    text = "\n".join(lines)
    got = parse_rss_kb(text)

    def first(field: str) -> int | None:
        for line in text.splitlines():
            name, _, rest = line.partition(":")
            parts = rest.split()
            if name == field and parts and re.fullmatch(r"\d+", parts[0]):
                return int(parts[0])
        return None

    anon, vmrss = first("RssAnon"), first("VmRSS")
    want = (anon, "RssAnon") if anon is not None else (vmrss, "VmRSS") if vmrss is not None else None
    assert got == want


def test_a_digit_that_is_not_decimal_is_no_number() -> None:
    # Hypothesis found this one: '¹'.isdigit() is True, but int('¹') raises.
    assert parse_rss_kb("RssAnon:\t\u00b9 kB\nVmRSS:\t12 kB") == (12, "VmRSS")
