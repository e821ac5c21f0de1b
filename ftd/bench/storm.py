"""``ftd bench storm``: 500,000 identical Xid lines on one node -> how many bus messages, counts exact?

Real parts: a private Mosquitto on loopback, the real :class:`~ftd.agent.app.Agent` (kmsg watcher,
storm control with the default 10 s window, durable spool) on an :class:`~ftd.bus.mqtt.MqttBus`, and a
subscriber counting every message on the node's ``xid`` topic and summing their ``count`` fields.
The lines are written to a FIFO the agent reads (as it reads ``/dev/kmsg``: ``add_reader``; a regular
file would also work, but the kmsg watcher saves its position after every line with an event, which
dominates at 500,000 lines). Once the agent has read every line it is
shut down cleanly (storm control publishes its pending summary), and the subscriber waits for the sum
of counts to reach the number of lines (or 20 s). ``count_exact`` is ``sum(count) == lines``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from ftd.agent.app import Agent, status_messages
from ftd.bench.broker import PrivateMosquitto
from ftd.bus import topics
from ftd.bus.mqtt import MqttBus
from ftd.config import AgentConfig
from ftd.events import Event, decode
from ftd.logs import configure

NODE = "storm-node"
LINE = "[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 45, pid=4242, name=python, Ch 00000008\n"


def _write_lines(fifo: Path, lines: int) -> None:
    with fifo.open("w") as handle:  # blocks while the agent's pipe buffer is full: it paces the writer
        chunk = LINE * 1000
        for _ in range(lines // 1000):
            handle.write(chunk)
        handle.write(LINE * (lines % 1000))


def bench_storm(lines: int = 500_000) -> dict[str, Any]:
    configure("warning", json=True)
    with PrivateMosquitto() as broker, tempfile.TemporaryDirectory(prefix="ftd-bench-storm-") as work:
        return asyncio.run(_run(broker.port, Path(work), lines))


async def _run(port: int, work: Path, lines: int) -> dict[str, Any]:
    kmsg = work / "kmsg.fifo"
    os.mkfifo(kmsg)
    cfg = AgentConfig(
        node=NODE, kmsg_path=str(kmsg), state_dir=str(work / "state"), socket_path=str(work / "a.sock")
    )
    will, birth = status_messages(NODE)
    agent_bus = MqttBus(host="127.0.0.1", port=port, client_id="ftd-agent-storm", will=will, birth=birth)
    sub = MqttBus(host="127.0.0.1", port=port, client_id="ftd-bench-storm-sub", clean_session=True)
    messages = 0
    total = 0

    async def count() -> None:
        nonlocal messages, total
        async for message in sub.messages():
            event = decode(message.payload, Event)
            messages += 1
            total += event.count

    await sub.subscribe(topics.node_event(NODE, "xid"))
    await sub.start()
    await sub.wait_connected(10)
    counter = asyncio.create_task(count())
    agent = Agent(cfg, bus=agent_bus, node=NODE)
    started = asyncio.Event()
    runner = asyncio.create_task(agent.run(ready=started.set))
    await started.wait()
    await agent_bus.wait_connected(10)
    t0 = time.perf_counter()
    await asyncio.to_thread(_write_lines, kmsg, lines)
    while agent.kmsg.lines < lines:  # noqa: ASYNC110 (polling a counter the watcher bumps)
        await asyncio.sleep(0.05)
    read_s = time.perf_counter() - t0
    runner.cancel()  # clean shutdown: storm control flushes its pending summary, the outbox drains
    with contextlib.suppress(asyncio.CancelledError):
        await runner
    deadline = time.monotonic() + 20
    while total < lines and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)  # anything late would still be counted
    counter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await counter
    await sub.stop()
    return {
        "lines": lines,
        "bus_messages": messages,
        "sum_counts": total,
        "count_exact": total == lines,
        "agent_read_s": round(read_s, 2),
        "lines_per_s": round(lines / read_s),
    }
