"""``ftd bench coordinator``: 10,000 simulated nodes storm a real coordinator over a real Mosquitto.

Setup: a private Mosquitto on loopback; the coordinator (:class:`ftd.coordinator.daemon.Coordinator`,
rules loaded as in production, ``scheduler = "none"`` plus an in-process FakeScheduler knowing every
node so drains succeed) in a *separate process* started with ``python -c``, reporting progress and,
at the end, its stats on stdout; and, in this process, several publisher connections, each playing
many nodes.

The storm: every node sends ``events_per_node`` events of mixed kinds, mostly non-actionable
(GPU health, thermal, log patterns, fs fill, agent health, IGNORE-bucket Xids), with ~0.2% Xid 79
(drain_node) among them. Modes:

* ``batch`` (default): a node's events go out as one message on ``ftd/v1/nodes/{node}/events/batch``
  (a JSON list of that node's Events; the coordinator checks every event's node against the topic),
  as an agent flushing its outbox would; ``batch_size`` events per message at most.
* ``single``: one event per message on ``.../events/{kind}``, many publishes in flight per connection.

By default the publishers go as fast as they can (the coordinator's sustained rate is the figure;
``e2e`` then mostly measures the backlog). With ``rate`` the offered load is paced at that many
events/s, so ``e2e`` shows the latency at that load (``ftd bench coordinator`` uses the default).

Measured: ``events_per_s`` = unique events recorded in the ledger / time from the coordinator's first
to its last recorded event (sustained rate at the coordinator); ``decision_p99_ms`` = p99 of
the engine's ``decision`` notifications (receipt by the engine -> verdict recorded); ``e2e_p99_ms`` = p99 of
event creation in the publisher -> verdict, which adds the broker and queueing; ``lost`` = events
published with QoS 1 (PUBACKed) - rows in the coordinator's ledger. The bus is QoS 1 end to end and
the coordinator's session queue in Mosquitto is unbounded here (``max_queued_messages 0``) — with the
default 1000 a coordinator behind a storm would have messages dropped by the broker.

Noise: the publishers, the broker and the coordinator share the machine's cores; on a small shared
machine the figures move by tens of percent between runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ftd.bench.broker import PrivateMosquitto
from ftd.bus import topics
from ftd.bus.mqtt import MqttBus
from ftd.events import SCHEMA_VERSION, Event, Kind, Severity, encode

NODES = 10_000
EVENTS_PER_NODE = 10
PUBLISHERS = 4

# The coordinator process: prints READY, PROGRESS lines, and one STATS line on SIGTERM.
_COORDINATOR = r"""
import asyncio, contextlib, json, signal, sys, time, sqlite3
from ftd.config import parse_config
from ftd.logs import configure
from ftd.bus.factory import make_mqtt_bus
from ftd.coordinator.daemon import Coordinator, tune_collector
from ftd.coordinator.wiring import build, coordinator_will
from ftd.coordinator.actions.scheduler import FakeScheduler
tune_collector()  # as ftd coordinator does

config = parse_config(open(sys.argv[1]).read())
configure("warning", json=True)
nodes = int(sys.argv[2])

async def main():
    sched = FakeScheduler()
    for i in range(nodes):
        sched.add_node(f"node-{i:05d}")
    bus = make_mqtt_bus(config.bus, client_id="ftd-coordinator", will=coordinator_will(), manual_ack=True)
    coord = build(config, bus=bus, scheduler=sched)
    marks = {"first": None, "last": None, "decided": [], "decision": []}
    def observe(what, payload):
        if what == "event":
            now = time.perf_counter()
            if marks["first"] is None:
                marks["first"] = now
            marks["last"] = now
            marks["decided"].append(time.time() - payload.ts)
        elif what == "decision":
            marks["decision"].append(payload)
    coord.engine.observe(observe)
    ready = asyncio.Event()
    task = asyncio.create_task(coord.run(ready.set))
    await ready.wait()
    print("READY", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    while not stop.is_set():
        print("PROGRESS", coord.engine.counters["events"], flush=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.25):
                await stop.wait()
    await coord.engine.wait_idle(10)
    rows = coord.ledger.ledger._db.execute("SELECT count(*) FROM events").fetchone()[0]
    db = coord.ledger.ledger._db
    actions = dict(db.execute("SELECT state, count(*) FROM actions GROUP BY state").fetchall())
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    await coord.close()
    stats = {
        "counters": coord.summary(),
        "rows": rows,
        "actions": actions,
        "decision": marks["decision"],
        "e2e": marks["decided"],
        "span_s": (marks["last"] - marks["first"]) if marks["first"] is not None else 0.0,
    }
    print("STATS", json.dumps(stats), flush=True)

asyncio.run(main())
"""


def _mix(rng: random.Random, node: str, seq: int, now: float) -> Event:
    r = rng.random()
    data: dict[str, Any]
    if r < 0.002:
        kind, sev, data = Kind.XID, Severity.CRITICAL, {"code": 79, "pci": "0000:3b:00.0"}
    elif r < 0.10:
        kind, sev, data = Kind.XID, Severity.WARNING, {"code": 43, "pci": "0000:3b:00.0"}  # IGNORE bucket
    elif r < 0.40:
        kind, sev, data = Kind.GPU_HEALTH, Severity.INFO, {"gpu": seq % 8, "power_w": 412.5, "util": 97}
    elif r < 0.60:
        kind, sev, data = Kind.THERMAL, Severity.INFO, {"gpu": seq % 8, "temp_c": 71, "throttle": []}
    elif r < 0.80:
        kind, sev, data = Kind.LOG_PATTERN, Severity.INFO, {"pattern": "nccl_info", "line": "NCCL INFO ok"}
    elif r < 0.90:
        kind, sev, data = Kind.FS_FILL, Severity.INFO, {"mount": "/scratch", "pct": 41.0}
    else:
        kind, sev, data = Kind.AGENT_HEALTH, Severity.INFO, {"watchers": 6, "rss_mb": 38}
    return Event(
        schema=SCHEMA_VERSION,
        id=f"{node}-b-{seq}",
        ts=now,
        node=node,
        kind=kind,
        severity=sev,
        source="bench",
        data=data,
    )


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank, no interpolation); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class CoordinatorProcess:
    """A coordinator subprocess a bench drives: started with ``argv`` (its stderr to ``log_path``),
    its stdout read by a thread: ``READY`` sets :attr:`ready`, ``PROGRESS <text>`` goes to
    :meth:`on_progress`, ``STATS {json}`` fills :attr:`stats`; :meth:`finish` ends and collects it."""

    def __init__(self, argv: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self._log: IO[bytes] = log_path.open("wb")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._log)
        self.ready = threading.Event()
        self.stats: dict[str, Any] | None = None
        self._done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def on_progress(self, text: str) -> None:
        """One ``PROGRESS`` line's text (what the bench's coordinator script prints)."""

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode().strip()
            if line == "READY":
                self.ready.set()
            elif line.startswith("PROGRESS "):
                self.on_progress(line[9:])
            elif line.startswith("STATS "):
                self.stats = json.loads(line[6:])
        self._done.set()

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]

    def finish(self, timeout: float = 60) -> dict[str, Any]:
        self.proc.terminate()
        self._done.wait(timeout)
        self.proc.wait(10)
        self._log.close()
        if self.stats is None:
            raise RuntimeError("the coordinator process ended without stats (see its log)")
        return self.stats

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class _Coordinator(CoordinatorProcess):
    """The coordinator subprocess of this bench (PROGRESS n: events decided so far)."""

    def __init__(self, config_path: Path, nodes: int, log_path: Path) -> None:
        self.events = 0
        super().__init__([sys.executable, "-c", _COORDINATOR, str(config_path), str(nodes)], log_path)

    def on_progress(self, text: str) -> None:
        self.events = int(text.split()[0])


def _chunks(items: list[Event], size: int) -> Iterator[list[Event]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


async def _publish_all(
    port: int,
    nodes: int,
    per_node: int,
    mode: str,
    batch_size: int,
    publishers: int,
    inflight: int,
    rate: float | None,
) -> tuple[int, int, float]:
    buses = [
        MqttBus(host="127.0.0.1", port=port, client_id=f"ftd-bench-pub-{i}", clean_session=True)
        for i in range(publishers)
    ]
    for bus in buses:
        await bus.start()
    for bus in buses:
        if not await bus.wait_connected(10):
            raise RuntimeError("publisher could not connect")
    rng = random.Random(7)
    published = messages = 0

    async def worker(idx: int) -> None:
        nonlocal published, messages
        bus = buses[idx]
        window = asyncio.Semaphore(inflight)
        pending: set[asyncio.Task[None]] = set()

        async def send(topic: str, payload: bytes, n: int) -> None:
            nonlocal published, messages
            try:
                await bus.publish(topic, payload)
            finally:
                window.release()
            published += n
            messages += 1

        seq = 0
        loop = asyncio.get_running_loop()
        start, queued = loop.time(), 0
        per_publisher = rate / publishers if rate else None
        for i in range(idx, nodes, publishers):  # this connection plays every publishers-th node
            node = f"node-{i:05d}"
            now = time.time()
            events = [_mix(rng, node, seq + k, now) for k in range(per_node)]
            seq += per_node
            if mode == "batch":
                parts = [
                    (topics.node_event_batch(node), b"[" + b",".join(encode(e) for e in c) + b"]", len(c))
                    for c in _chunks(events, batch_size)
                ]
            else:
                parts = [(topics.node_event(node, str(e.kind)), encode(e), 1) for e in events]
            for topic, payload, n in parts:
                if per_publisher is not None:  # paced: hold the offered load at `rate` events/s
                    queued += n
                    ahead = start + queued / per_publisher - loop.time()
                    if ahead > 0:
                        await asyncio.sleep(ahead)
                await window.acquire()
                task = asyncio.create_task(send(topic, payload, n))
                pending.add(task)
                task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(worker(i) for i in range(publishers)))
    finally:
        for bus in buses:
            await bus.stop()
    return published, messages, time.perf_counter() - t0


def bench_coordinator(
    nodes: int = NODES,
    events_per_node: int = EVENTS_PER_NODE,
    mode: str = "batch",
    batch_size: int = 50,
    publishers: int = PUBLISHERS,
    inflight: int = 8,
    rate: float | None = None,
) -> dict[str, Any]:
    if mode not in ("batch", "single"):
        raise ValueError("mode is 'batch' or 'single'")
    with tempfile.TemporaryDirectory(prefix="ftd-bench-coord-") as tmp, _unbounded_mosquitto() as broker:
        work = Path(tmp)
        config = work / "coordinator.toml"
        config.write_text(
            f'[bus]\nhost = "127.0.0.1"\nport = {broker.port}\n\n'
            f'[coordinator]\nledger_path = "{work}/ledger.sqlite"\nscheduler = "none"\n'
            'save_deadline_s = 5\nstop_deadline_s = 5\n\n[log]\nlevel = "warning"\njson = true\n'
        )
        coordinator = _Coordinator(config, nodes, work / "coordinator.log")
        try:
            if not coordinator.ready.wait(60):
                raise RuntimeError(
                    "the coordinator did not become ready: " + (work / "coordinator.log").read_text()[-2000:]
                )
            published, messages, publish_s = asyncio.run(
                _publish_all(
                    broker.port, nodes, events_per_node, mode, batch_size, publishers, inflight, rate
                )
            )
            last, stalled_since = -1, time.monotonic()
            while coordinator.events < published and time.monotonic() - stalled_since < 20:
                if coordinator.events != last:
                    last, stalled_since = coordinator.events, time.monotonic()
                time.sleep(0.1)
            stats = coordinator.finish()
        finally:
            coordinator.kill()
    decision = [s * 1000 for s in stats["decision"]]
    e2e = [s * 1000 for s in stats["e2e"]]
    recorded = int(stats["rows"])
    span = float(stats["span_s"]) or float("nan")
    return {
        "mode": mode,
        "offered_rate": rate,
        "nodes": nodes,
        "events": published,
        "messages": messages,
        "publishers": publishers,
        "publish_s": round(publish_s, 2),
        "recorded": recorded,
        "lost": published - recorded,
        "duplicates": stats["counters"].get("duplicates", 0),
        "bad_messages": stats["counters"].get("bad_messages", 0),
        "actions": stats["actions"],
        "events_per_s": round(recorded / span, 1),
        "decision_p50_ms": round(statistics.median(decision), 3) if decision else None,
        "decision_p99_ms": round(percentile(decision, 0.99), 3),
        "decision_max_ms": round(max(decision), 3) if decision else None,
        "e2e_p50_ms": round(statistics.median(e2e), 1) if e2e else None,
        "e2e_p99_ms": round(percentile(e2e, 0.99), 1),
        "cpus": os.cpu_count(),
    }


def _unbounded_mosquitto() -> PrivateMosquitto:
    """A private Mosquitto with an unbounded per-client QoS 1 queue (see the module docstring)."""
    return PrivateMosquitto(extra_conf=("max_queued_messages 0", "max_inflight_messages 100"))
