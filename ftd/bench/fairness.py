"""``ftd bench fairness``: one node floods as fast as the broker accepts; how long do another node's
probes wait?

docs/architecture.md §10 target: during the flood, the other node's event -> decision p99 <= 100 ms.

Setup, all real: a private Mosquitto on loopback with the queue limits of ``deploy/mosquitto``
(``max_queued_messages 100000``, the default ``max_inflight_messages`` of 20), the coordinator
(:class:`ftd.coordinator.daemon.Coordinator`, rules loaded as in production, ``scheduler = "none"``)
in a separate process started with ``python -c``, reporting progress and, at the end, its figures;
and two publishers with node credentials' worth of topics:

* the *flood*: node ``flood-node`` publishes distinct events for ``seconds``. By default
  (``rate=None``, issue #25's scenario) as fast as the broker accepts them: one connection, QoS 1,
  the next event published as soon as one of the 20 in flight is acknowledged (``mode`` single).
  With ``rate``, paced at that many events/s through ``mosquitto_pub -l -q 1`` (C, so the offered
  load really is 10,000/s on a small machine; this process writes the paced lines to its stdin;
  ``mosquitto_pub`` queues what the broker has not acknowledged yet; ``ftd bench fairness --rate
  10000``). ``mode="single"``: one event per message on ``.../events/gpu_health``, as an agent sends
  them; ``mode="batch"``: ``batch_size`` events per message on ``.../events/batch``. ``severity``
  (``--severity``): the flood's events are ``info`` (issue #25's scenario), ``error`` (they may take
  the node's urgent reserve too) or a ``mix`` of info, warning and error.
* the *paced* node ``paced-node`` (an :class:`~ftd.bus.mqtt.MqttBus`, as an agent) publishes
  ``probes / seconds`` events/s (``--probes``, 300 by default: 20/s for a 15 s flood, within the
  node's rate) from one second before the flood until one second after it. Issue #31: with one probe
  every 0.5 s the p99 of 30 probes was the slowest probe; the target is judged over at least 200.

``node_rate`` / ``node_burst`` / ``urgent_reserve`` are the coordinator's per-node limits
(defaults: those of :mod:`ftd.coordinator.intake.fairness`), to measure other settings.

Measured (``--json``): ``other_p50_ms`` / ``other_p99_ms`` / ``other_max_ms`` = event creation at
the paced node -> the engine's verdict on it, for the paced node's events created while the flood
ran (the coordinator observes its engine; publisher and coordinator share the machine's clock);
``other_decided`` of ``other_sent`` (every one must be decided); for the flood: ``flood_sent``
(lines handed to ``mosquitto_pub``), ``flood_accepted`` (stored one by one in the ledger, i.e.
within the node's rate limit), ``flood_summarised`` (folded into the node's ``bad_input`` summary
events: the sum of their ``folded`` counts), ``flood_unaccounted`` = sent - accepted - summarised
(dropped by the broker's queue limit, or not yet handled when the coordinator went quiet), and
``catch_up_s``, how long after the flood's last publish the coordinator had handled it all;
``flood_critical_ms``: the flood slips one Xid 79 (severity critical) in halfway, and this is its
event creation -> decision (issue #25: never fold novelty, decided within 100 ms);
``flood_critical_decided`` counts it (1: decided; 0: folded or lost). As fast as accepted, it goes
on the flood's own connection, behind its events; paced, ``mosquitto_pub`` holds that connection, so
it goes on a second connection of the flood node (connected before the flood starts).

Noise: the broker, both publishers and the coordinator share the machine's cores (two on the
development VM), so the flood's accepted rate is what is left of them. The coordinator keeps up as
long as a folded message costs it less than the broker and the flood's publisher spend on it
(issue #25: paho's messages go straight into the bus's queue, no task per message, and a socket
wake-up reads up to 64 of them); a stall elsewhere on the machine leaves a backlog in the broker
that the probes wait behind, which shows in the p99 (with one probe per 0.5 s, the p99 of a 15 s
flood was its slowest probe; now 300 probes by default).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from ftd.bench.broker import PrivateMosquitto
from ftd.bench.coordinator import CoordinatorProcess, percentile
from ftd.bus import topics
from ftd.bus.mqtt import MqttBus
from ftd.coordinator.intake.fairness import NODE_BURST, NODE_RATE, URGENT_RESERVE
from ftd.events import SCHEMA_VERSION, Event, Kind, Severity, encode

FLOOD_NODE = "flood-node"
PACED_NODE = "paced-node"

# The coordinator process: READY, then PROGRESS {json} lines, then one STATS {json} on SIGTERM.
_COORDINATOR = r"""
import asyncio, contextlib, json, signal, sys, time
from ftd.config import parse_config
from ftd.logs import configure
from ftd.bus.factory import make_mqtt_bus
from ftd.coordinator.daemon import Coordinator
from ftd.coordinator.wiring import build, coordinator_will

config = parse_config(open(sys.argv[1]).read())
configure("warning", json=True)
paced, flood, limits = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])

async def main():
    bus = make_mqtt_bus(config.bus, client_id="ftd-coordinator", will=coordinator_will(), manual_ack=True)
    coord = build(config, bus=bus, scheduler=None, **limits)
    latency = []
    critical = []
    accepted = {paced: 0, flood: 0}
    current = []
    def observe(what, payload):
        if what == "event":
            current[:] = [payload]
            if payload.node in accepted:
                accepted[payload.node] += 1
        elif what == "decision" and current:
            event = current.pop()
            if event.node == paced:
                latency.append((event.ts, time.time() - event.ts))
            elif event.node == flood and event.kind == "xid":
                critical.append(time.time() - event.ts)
    coord.engine.observe(observe)
    ready = asyncio.Event()
    task = asyncio.create_task(coord.run(ready.set))
    await ready.wait()
    print("READY", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    def folded():
        return int(coord.summary().get("folded", 0))
    while not stop.is_set():
        print("PROGRESS", json.dumps({"accepted": accepted, "folded": folded()}), flush=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.1):
                await stop.wait()
    await coord.commit_summaries()
    summaries = [
        json.loads(body)
        for (body,) in coord.ledger.ledger._db.execute(
            "SELECT body FROM events WHERE node = ? AND kind = 'bad_input'", (flood,)
        )
    ]
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    await coord.close()
    stats = {
        "counters": coord.summary(),
        "accepted": accepted,
        "latency": latency,
        "critical": critical,
        "summarised": sum(int(s["data"].get("folded", 0)) for s in summaries),
        "summary_events": len(summaries),
    }
    print("STATS", json.dumps(stats), flush=True)

asyncio.run(main())
"""


class _Coordinator(CoordinatorProcess):
    """The coordinator subprocess of this bench (PROGRESS {json}: decided per node, folded)."""

    def __init__(self, config_path: Path, log_path: Path, limits: dict[str, float]) -> None:
        self.progress: dict[str, Any] = {"accepted": {}, "folded": 0}
        limits_json = json.dumps(limits)
        argv = [sys.executable, "-c", _COORDINATOR, str(config_path), PACED_NODE, FLOOD_NODE, limits_json]
        super().__init__(argv, log_path)

    def on_progress(self, text: str) -> None:
        self.progress = json.loads(text)

    def flood_handled(self) -> int:
        return self.decided(FLOOD_NODE) + int(self.progress["folded"])

    def decided(self, node: str) -> int:
        return int(self.progress["accepted"].get(node, 0))


def _wait_progress(done: Callable[[], bool], progress: Callable[[], int], stall_s: float = 15.0) -> None:
    """Wait until ``done()``, or until ``progress()`` has not moved for ``stall_s`` seconds."""
    last, since = -1, time.monotonic()
    while not done() and time.monotonic() - since < stall_s:
        now = progress()
        if now != last:
            last, since = now, time.monotonic()
        time.sleep(0.02)


#: ``--severity``: what the flood's events say. ``mix`` cycles through info, warning and error (the
#: flood then eats into the node's urgent reserve too, issue #31).
FLOOD_SEVERITIES: dict[str, tuple[Severity, ...]] = {
    "info": (Severity.INFO,),
    "error": (Severity.ERROR,),
    "mix": (Severity.INFO, Severity.WARNING, Severity.ERROR),
}


def flood_severity(severity: str, seq: int) -> Severity:
    """The severity of the flood's event number ``seq`` (see :data:`FLOOD_SEVERITIES`)."""
    cycle = FLOOD_SEVERITIES[severity]
    return cycle[seq % len(cycle)]


def _event(
    node: str,
    seq: int,
    kind: Kind = Kind.GPU_HEALTH,
    data: dict[str, Any] | None = None,
    severity: Severity = Severity.INFO,
) -> Event:
    return Event(
        schema=SCHEMA_VERSION,
        id=f"{node}-{seq}",
        ts=time.time(),
        node=node,
        kind=kind,
        severity=severity,
        source="bench",
        data=data if data is not None else {"gpu": seq % 8, "power_w": 412.5, "util": 97},
    )


def _flood(
    port: int,
    rate: float,
    seconds: float,
    mode: str,
    batch_size: int,
    arrived: Callable[[], bool],
    severity: str = "info",
) -> tuple[int, float, float]:
    """Publish the flood through ``mosquitto_pub -l``; returns (events, first publish, last publish).

    The first message goes alone, and the pacing starts once ``arrived()`` says the coordinator has
    it: lines written while ``mosquitto_pub`` is still connecting would reach the broker as one
    burst, and the flood would start with a spike no agent produces."""
    binary = shutil.which("mosquitto_pub") or "/usr/bin/mosquitto_pub"
    if not Path(binary).exists():
        raise RuntimeError("mosquitto_pub not found: install the Debian package `mosquitto-clients`")
    batch = mode == "batch"
    topic = topics.node_event_batch(FLOOD_NODE) if batch else topics.node_event(FLOOD_NODE, "gpu_health")
    proc = subprocess.Popen(
        [binary, "-h", "127.0.0.1", "-p", str(port), "-q", "1", "-i", "ftd-bench-flood", "-t", topic, "-l"],
        stdin=subprocess.PIPE,
    )
    stdin: IO[bytes] | None = proc.stdin
    assert stdin is not None
    per_line = batch_size if batch else 1
    total = int(rate * seconds)

    def line(seq: int, n: int) -> bytes:
        events = [_event(FLOOD_NODE, seq + k, severity=flood_severity(severity, seq + k)) for k in range(n)]
        return (b"[" + b",".join(encode(e) for e in events) + b"]" if batch else encode(events[0])) + b"\n"

    slipper = _Slipper(port)
    try:
        stdin.write(line(0, per_line))
        stdin.flush()
        sent = per_line
        _wait_progress(arrived, lambda: 0, stall_s=10.0)
        first = time.time()
        start = time.perf_counter() - sent / rate
        slipper.at(time.monotonic() + seconds / 2)
        while sent < total:
            due = min(total, int((time.perf_counter() - start) * rate))
            lines = []
            while sent < total and sent + min(per_line, total - sent) <= due:
                n = min(per_line, total - sent)
                lines.append(line(sent, n))
                sent += n
            if lines:
                stdin.write(b"".join(lines))
                stdin.flush()
            time.sleep(0.001)
        last = time.time()
    finally:
        stdin.close()
        proc.wait(120)
        slipper.close()
    return sent + slipper.published, first, last


class _Slipper:
    """The paced flood's Xid 79: ``mosquitto_pub`` holds the flood node's connection, so the critical
    event goes from a second connection of the same node (an :class:`MqttBus` in its own thread,
    connected before the flood), published at the monotonic time given to :meth:`at`."""

    def __init__(self, port: int) -> None:
        self._when: float | None = None
        self.published = 0  # the Xid 79 went out (counted with the flood's events)
        self._go = threading.Event()  # at() or close()
        self._connected = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run(port)), daemon=True)
        self._thread.start()
        if not self._connected.wait(30):
            raise RuntimeError("the flood's second connection (the slipped Xid 79) could not connect")

    async def _run(self, port: int) -> None:
        bus = MqttBus(host="127.0.0.1", port=port, client_id="ftd-bench-flood-xid", clean_session=True)
        await bus.start()
        try:
            if await bus.wait_connected(10):
                self._connected.set()
            await asyncio.to_thread(self._go.wait)
            if self._when is not None:
                await asyncio.sleep(max(0.0, self._when - time.monotonic()))
                fatal = _event(
                    FLOOD_NODE, -1, Kind.XID, {"code": 79, "pci": "0000:3b:00.0"}, Severity.CRITICAL
                )
                await bus.publish(topics.node_event(FLOOD_NODE, "xid"), encode(fatal))
                self.published = 1
        finally:
            await bus.stop()

    def at(self, when: float) -> None:
        self._when = when
        self._go.set()

    def close(self) -> None:
        self._go.set()
        self._thread.join(30)


async def _flood_accepted(
    port: int, seconds: float, arrived: Callable[[], bool], severity: str = "info"
) -> tuple[int, float, float]:
    """The flood as fast as the broker accepts it: distinct events on one connection, the next one
    published as soon as one of :data:`FLOOD_WINDOW` in flight is acknowledged (QoS 1), for
    ``seconds``; returns (events, first publish, last publish)."""
    bus = MqttBus(host="127.0.0.1", port=port, client_id="ftd-bench-flood", clean_session=True)
    await bus.start()
    if not await bus.wait_connected(10):
        raise RuntimeError("the flood publisher could not connect")
    topic = topics.node_event(FLOOD_NODE, "gpu_health")
    sent = 0
    slip_at: float | None = None  # halfway through the flood: one Xid 79 among its events

    async def one() -> None:
        nonlocal sent, slip_at
        sent += 1
        if slip_at is not None and asyncio.get_running_loop().time() >= slip_at:
            slip_at = None
            fatal = _event(FLOOD_NODE, sent, Kind.XID, {"code": 79, "pci": "0000:3b:00.0"}, Severity.CRITICAL)
            await bus.publish(topics.node_event(FLOOD_NODE, "xid"), encode(fatal))
            return
        await bus.publish(topic, encode(_event(FLOOD_NODE, sent, severity=flood_severity(severity, sent))))

    try:
        await one()
        while not arrived():  # noqa: ASYNC110 -- the coordinator's progress, read from its pipe by a thread
            await asyncio.sleep(0.01)
        first = time.time()
        end = asyncio.get_running_loop().time() + seconds
        slip_at = end - seconds / 2

        async def worker() -> None:
            while asyncio.get_running_loop().time() < end:
                await one()

        await asyncio.gather(*(worker() for _ in range(FLOOD_WINDOW)))
        return sent, first, time.time()
    finally:
        await bus.stop()


FLOOD_WINDOW = 20  # the flood's publishes in flight (Mosquitto's default max_inflight_messages)


async def _paced(port: int, rate: float, stop: threading.Event) -> int:
    """The well-behaved node: one event every 1/rate s until ``stop``; returns how many it published."""
    bus = MqttBus(host="127.0.0.1", port=port, client_id="ftd-bench-paced", clean_session=True)
    await bus.start()
    if not await bus.wait_connected(10):
        raise RuntimeError("the paced publisher could not connect")
    loop = asyncio.get_running_loop()
    start, seq = loop.time(), 0
    try:
        while not stop.is_set():
            if seq % 10 == 9:
                event = _event(PACED_NODE, seq, Kind.XID, {"code": 43, "pci": "0000:3b:00.0"})
            else:
                event = _event(PACED_NODE, seq)
            await bus.publish(topics.node_event(PACED_NODE, str(event.kind)), encode(event))
            seq += 1
            await asyncio.sleep(max(0.0, start + seq / rate - loop.time()))
    finally:
        await bus.stop()
    return seq


#: Probes the paced node sends while the flood runs (by default): enough that the p99 is not the
#: slowest probe (issue #31: 30 probes made one stall the verdict).
PROBES = 300


def bench_fairness(
    rate: float | None = None,
    seconds: float = 15.0,
    probes: int = PROBES,
    severity: str = "info",
    mode: str = "single",
    batch_size: int = 500,
    node_rate: float = NODE_RATE,
    node_burst: float = NODE_BURST,
    urgent_reserve: float = URGENT_RESERVE,
) -> dict[str, Any]:
    if mode not in ("single", "batch"):
        raise ValueError("mode is 'single' or 'batch'")
    if severity not in FLOOD_SEVERITIES:
        raise ValueError(f"severity is one of {', '.join(FLOOD_SEVERITIES)}")
    if probes < 1 or seconds <= 0 or (rate is not None and rate <= 0):
        raise ValueError("probes, seconds and rate must be positive")
    paced_rate = probes / seconds
    limits = {"node_rate": node_rate, "node_burst": node_burst, "urgent_reserve": urgent_reserve}
    conf = ("max_queued_messages 100000", "max_queued_bytes 268435456")  # as deploy/mosquitto
    with tempfile.TemporaryDirectory(prefix="ftd-bench-fair-") as tmp, PrivateMosquitto(conf) as broker:
        work = Path(tmp)
        config = work / "coordinator.toml"
        config.write_text(
            f'[bus]\nhost = "127.0.0.1"\nport = {broker.port}\n\n'
            f'[coordinator]\nledger_path = "{work}/ledger.sqlite"\nscheduler = "none"\n\n'
            '[coordinator.api]\nenabled = false\n\n[log]\nlevel = "warning"\njson = true\n'
        )
        coordinator = _Coordinator(config, work / "coordinator.log", limits)
        try:
            if not coordinator.ready.wait(60):
                raise RuntimeError(
                    "the coordinator did not become ready: " + (work / "coordinator.log").read_text()[-2000:]
                )
            stop = threading.Event()
            paced_result: list[int] = []
            paced = threading.Thread(
                target=lambda: paced_result.append(asyncio.run(_paced(broker.port, paced_rate, stop)))
            )
            paced.start()
            time.sleep(1.0)
            if rate is None:
                flood_sent, flood_first, flood_last = asyncio.run(
                    _flood_accepted(broker.port, seconds, lambda: coordinator.flood_handled() > 0, severity)
                )
            else:
                flood_sent, flood_first, flood_last = _flood(
                    broker.port,
                    rate,
                    seconds,
                    mode,
                    batch_size,
                    lambda: coordinator.flood_handled() > 0,
                    severity,
                )
            _wait_progress(lambda: coordinator.flood_handled() >= flood_sent, coordinator.flood_handled)
            catch_up_s = time.time() - flood_last
            time.sleep(max(0.0, flood_last + 1.0 - time.time()))
            stop.set()
            paced.join(30)
            other_sent = paced_result[0] if paced_result else 0
            _wait_progress(
                lambda: coordinator.decided(PACED_NODE) >= other_sent, lambda: coordinator.decided(PACED_NODE)
            )
            stats = coordinator.finish()
        finally:
            coordinator.kill()
    during = [lat * 1000 for ts, lat in stats["latency"] if flood_first <= ts <= flood_last]
    accepted = int(stats["accepted"].get(FLOOD_NODE, 0))
    summarised = int(stats["summarised"])
    return {
        "mode": mode,
        "flood_severity": severity,
        "probes_per_s": round(paced_rate, 2),
        "node_limits": limits,
        "flood_rate": rate if rate is not None else "as fast as the broker accepts",
        "flood_seconds": seconds,
        "flood_offered_per_s": round(flood_sent / max(1e-9, flood_last - flood_first), 1),
        "flood_sent": flood_sent,
        "flood_accepted": accepted,
        "flood_summarised": summarised,
        "flood_unaccounted": flood_sent - accepted - summarised,
        "summary_events": stats["summary_events"],
        "catch_up_s": round(catch_up_s, 2),
        "other_sent": other_sent,
        "other_decided": int(stats["accepted"].get(PACED_NODE, 0)),
        "other_samples_during_flood": len(during),
        "other_p50_ms": round(statistics.median(during), 2) if during else None,
        "other_p99_ms": round(percentile(during, 0.99), 2) if during else None,
        "other_max_ms": round(max(during), 2) if during else None,
        # the Xid 79 slipped into the flood (as-fast-as-accepted mode): creation -> decision
        "flood_critical_decided": len(stats["critical"]),
        "flood_critical_ms": [round(s * 1000, 2) for s in stats["critical"]],
        "bad_messages": stats["counters"].get("bad_messages", 0),
        "cpus": os.cpu_count(),
    }
