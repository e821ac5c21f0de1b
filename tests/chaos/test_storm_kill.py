"""SIGKILL of a real ``ftd agent`` during an Xid storm: the summed counts still equal the lines written.

Storm control publishes the first of a run of identical Xid lines at once and folds the repeats into
one summary per window (``count`` = the repeats it folds). The agent is killed with SIGKILL while
repeats are pending (read, counted, not yet published), restarted, killed again at arbitrary moments
of later storms, and restarted again. A subscriber on a real Mosquitto keeps every distinct event id
once (the agent resends spooled events, and a restarted agent may publish an event it had already
published: same id) and sums ``count``: it must equal the number of lines written, exactly: no repeat
lost, none counted twice.

Before the storm checkpoint (the agent saved its kernel-log position past lines whose counts lived
only in memory) the first phase ended with 1 of 41 counted: the 40 pending repeats were lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ftd.bus import topics
from ftd.bus.mqtt import MqttBus
from ftd.events import Event, decode
from tests.e2e.daemons import Daemon
from tests.realparts import Mosquitto

NODE = "storm-kill-node"
WINDOW_S = 1.0


def storm_lines(start: int, count: int) -> str:
    """``count`` identical Xid 45 lines (only the kernel timestamp moves), numbered from ``start``."""
    return "".join(
        f"[{1000 + i / 1000:12.6f}] NVRM: Xid (PCI:0000:3b:00): 45, pid=4242, name=python, Ch 00000008\n"
        for i in range(start, start + count)
    )


def saved_offset(state: Path) -> int:
    try:
        return int(json.loads((state / "kmsg.position").read_text())["offset"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1


async def wait_for(predicate: Callable[[], bool], timeout: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what()}")
        await asyncio.sleep(0.02)


def sigkill(agent: Daemon) -> None:
    assert agent.proc is not None and agent.proc.poll() is None, agent.log()[-3000:]
    agent.proc.send_signal(signal.SIGKILL)
    agent.proc.wait(10)


def starts(agent: Daemon) -> int:
    """How many runs of the agent logged their start (its log is appended to across runs)."""
    text = agent.log()
    return text.count('"agent_started"')


async def start(agent: Daemon) -> None:
    """Start the agent and wait for this run's start in its log."""
    before = starts(agent)
    agent.start()
    await wait_for(lambda: starts(agent) > before, 20, lambda: f"agent start: {agent.log()[-2000:]}")


@pytest.mark.real
@pytest.mark.slow
async def test_sigkill_mid_storm_loses_no_repeat_count_and_counts_none_twice(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    kmsg = tmp_path / "kmsg.log"
    kmsg.touch()
    state = tmp_path / "state"
    config = (
        f'[bus]\nhost = "127.0.0.1"\nport = {mosquitto.port}\nreconnect_max_s = 0.3\n\n'
        f'[agent]\nnode = "{NODE}"\nkmsg_path = "{kmsg}"\nstate_dir = "{state}"\n'
        f'kmsg_from_start = true\nsocket_path = "{tmp_path}/a.sock"\n\n'
        f"[agent.storm]\nwindow_s = {WINDOW_S}\n"
    )
    agent = Daemon("agent", config, tmp_path / "agent")
    sub = MqttBus(host="127.0.0.1", port=mosquitto.port, client_id="storm-kill-sub", clean_session=True)
    counts: dict[str, int] = {}  # event id -> count (a duplicate of an id is the same event)

    async def collect() -> None:
        async for message in sub.messages():
            event = decode(message.payload, Event)
            counts[event.id] = event.count

    written = 0

    def write(count: int) -> None:
        nonlocal written
        with kmsg.open("a") as handle:
            handle.write(storm_lines(written, count))
        written += count

    def summed() -> int:
        return sum(counts.values())

    def progress() -> str:
        return f"summed count {summed()} of {written} lines ({len(counts)} events: {counts})"

    collector = asyncio.create_task(collect())
    try:
        await sub.subscribe(topics.node_event(NODE, "xid"))
        await sub.start()
        assert await sub.wait_connected(10)
        await start(agent)

        # Phase 1: 41 identical lines; the first goes out at once, 40 repeats wait for the window.
        write(41)
        size = kmsg.stat().st_size
        await wait_for(lambda: len(counts) >= 1 and saved_offset(state) == size, 10, progress)
        sigkill(agent)  # the 40 repeats are read and pending: only the agent knows them
        await start(agent)
        await wait_for(lambda: summed() >= written, 15, progress)
        assert summed() == written, progress()

        # Phase 2: bigger storms, each killed at an arbitrary moment: while reading, right after,
        # or once the window has moved on. Whatever was read before a kill is counted once.
        for count, kill_after_s in ((20_000, 0.0), (20_000, 0.05), (5_000, 0.3), (3, 0.6), (30_000, 0.15)):
            write(count)
            await asyncio.sleep(kill_after_s)
            sigkill(agent)
            await start(agent)
        await wait_for(lambda: summed() >= written, 30, progress)
        await asyncio.sleep(3 * WINDOW_S)  # anything counted twice would arrive by now
        assert summed() == written, progress()
    finally:
        collector.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await collector
        agent.stop()
        with contextlib.suppress(Exception):
            await sub.stop()
