"""``ftd bench storm``: 500,000 identical Xid lines on one node -> how many bus messages, counts exact?

Real parts, end to end: a private Mosquitto on loopback, the real :class:`~ftd.agent.app.Agent`
(kmsg watcher with its position file and storm control's checkpoint, storm control with the default
10 s window, durable spool) on an :class:`~ftd.bus.mqtt.MqttBus`, and a subscriber counting every
message on the node's ``xid`` topic and summing the ``count`` fields of the distinct events (no
coordinator sends receipts here, so the agent resends what it published after ``receipt_timeout_s``:
a resent event has the same id and is counted once; ``bus_messages`` counts every message).

The lines are appended to a regular file the agent follows as its kernel log (``kern.log``; the
agent reads it from the start: it is empty when the agent starts). That is the agent's durable
reading path: byte offsets, the position file, the storm checkpoint. The lines are the same Xid 45
record with a moving kernel timestamp, as a storm prints them; the text is built before the clock
starts and written in 1 MiB pieces by a thread (file writes release the GIL), so the figure is the
agent's. ``/dev/kmsg`` itself cannot be benchmarked this way: userspace writes to it are rate-limited.

``agent_read_s`` runs from the first write until the watcher has handled every line. The agent is
then shut down cleanly (storm control publishes its pending summary), and the subscriber waits for
the sum of counts to reach the number of lines (or 20 s). ``count_exact`` is ``sum(count) == lines``.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any

from ftd.agent.app import status_messages
from ftd.agent.wiring import build_agent
from ftd.bench.broker import PrivateMosquitto
from ftd.bus import topics
from ftd.bus.mqtt import MqttBus
from ftd.config import AgentConfig
from ftd.events import Event, decode
from ftd.logs import configure

NODE = "storm-node"
MESSAGE = "NVRM: Xid (PCI:0000:3b:00): 45, pid=4242, name=python, Ch 00000008"
_PIECE = 1 << 20


def storm_text(lines: int) -> bytes:
    """``lines`` kernel-log lines: the same Xid message, the timestamp moving 10 us a line."""
    return "".join(f"[{1234.5 + i / 100_000:12.6f}] {MESSAGE}\n" for i in range(lines)).encode()


def _append(path: Path, data: bytes) -> None:
    with path.open("ab") as handle:
        for start in range(0, len(data), _PIECE):
            handle.write(data[start : start + _PIECE])
            handle.flush()


def bench_storm(lines: int = 500_000) -> dict[str, Any]:
    configure("warning", json=True)
    with PrivateMosquitto() as broker, tempfile.TemporaryDirectory(prefix="ftd-bench-storm-") as work:
        return asyncio.run(_run(broker.port, Path(work), lines))


async def _run(port: int, work: Path, lines: int) -> dict[str, Any]:
    kmsg = work / "kern.log"
    kmsg.touch()
    cfg = AgentConfig(
        node=NODE,
        kmsg_path=str(kmsg),
        kmsg_from_start=True,
        state_dir=str(work / "state"),
        socket_path=str(work / "a.sock"),
    )
    will, birth = status_messages(NODE)
    agent_bus = MqttBus(host="127.0.0.1", port=port, client_id="ftd-agent-storm", will=will, birth=birth)
    sub = MqttBus(host="127.0.0.1", port=port, client_id="ftd-bench-storm-sub", clean_session=True)
    messages = 0
    counts: dict[str, int] = {}  # event id -> count: a resent event (same id) is counted once

    async def count() -> None:
        nonlocal messages
        async for message in sub.messages():
            event = decode(message.payload, Event)
            messages += 1
            counts[event.id] = event.count

    await sub.subscribe(topics.node_event(NODE, "xid"))
    await sub.start()
    await sub.wait_connected(10)
    counter = asyncio.create_task(count())
    agent = build_agent(cfg, bus=agent_bus, node=NODE)
    started = asyncio.Event()
    runner = asyncio.create_task(agent.run(ready=started.set))
    await started.wait()
    await agent_bus.wait_connected(10)
    text = storm_text(lines)
    t0 = time.perf_counter()
    writer = asyncio.create_task(asyncio.to_thread(_append, kmsg, text))
    while agent.kmsg.lines < lines:  # noqa: ASYNC110 (polling a counter the watcher bumps)
        await asyncio.sleep(0.01)
    read_s = time.perf_counter() - t0
    await writer
    runner.cancel()  # clean shutdown: storm control flushes its pending summary, the outbox drains
    with contextlib.suppress(asyncio.CancelledError):
        await runner
    deadline = time.monotonic() + 20
    while sum(counts.values()) < lines and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)  # anything late would still be counted
    counter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await counter
    await sub.stop()
    total = sum(counts.values())
    return {
        "lines": lines,
        "bus_messages": messages,
        "events": len(counts),
        "sum_counts": total,
        "count_exact": total == lines,
        "agent_read_s": round(read_s, 2),
        "lines_per_s": round(lines / read_s),
    }
