"""The coordinator process ``ftd bench scale`` drives, and the bench's side of reading it.

The process is the production coordinator (:func:`ftd.coordinator.wiring.build`, rules as shipped,
MQTT with the ``coordinator`` password and the shipped ACL) with a :class:`FakeScheduler` that knows
the bench's nodes and jobs (so placement checks pass as on a real cluster). It prints ``READY``, then
``PROGRESS {json}`` every 0.2 s (nodes known and online; the rack's nodes whose node_offline was
decided, each counted once, and the wall time of the last; node_offline decisions of nodes outside
the rack, which the storm must not cause), and on SIGTERM one ``STATS {json}``: the probe node's
event -> decision latencies, and the actions in the ledger (kind, target, state).

It runs as ``python -c`` (not ``ftd coordinator``) only to observe the engine: the event -> decision
time is taken inside the process, with the wall clock the publisher stamped the event with.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ftd.bench.coordinator import CoordinatorProcess

_SCRIPT = r"""
import asyncio, contextlib, json, signal, sys, time
from ftd.config import parse_config
from ftd.logs import configure
from ftd.bus.factory import make_mqtt_bus
from ftd.coordinator.wiring import build, coordinator_will
from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.bench.scale_coordinator import RackTally

config = parse_config(open(sys.argv[1]).read())
layout = json.loads(open(sys.argv[2]).read())
configure("warning", json=True)

async def main():
    sched = FakeScheduler()
    for node in layout["nodes"]:
        sched.add_node(node)
    for job, nodes in layout["jobs"].items():
        sched.add_job(job, nodes)
    bus = make_mqtt_bus(config.bus, client_id="ftd-coordinator", will=coordinator_will(), manual_ack=True)
    coord = build(config, bus=bus, scheduler=sched)
    probe = layout["probe"]
    tally = RackTally(layout["rack"])
    marks = {"latency": []}
    current = []
    def observe(what, payload):
        if what == "event":
            current[:] = [payload]
        elif what == "decision" and current:
            event = current.pop()
            if event.kind == "node_offline":
                tally.decided(event.node, time.time())
            elif event.node == probe:
                marks["latency"].append(time.time() - event.ts)
    coord.engine.observe(observe)
    ready = asyncio.Event()
    task = asyncio.create_task(coord.run(ready.set))
    await ready.wait()
    print("READY", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    while not stop.is_set():
        nodes = coord.state.nodes
        progress = {
            "known": len(nodes),
            "online": sum(1 for n in nodes.values() if n.online),
            "offline_decided": len(tally.rack_decided),
            "offline_other": tally.others,
            "offline_last": tally.last,
            "probe_decided": len(marks["latency"]),
        }
        print("PROGRESS", json.dumps(progress), flush=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.2):
                await stop.wait()
    db = coord.ledger.ledger._db
    actions = [list(row) for row in db.execute("SELECT kind, target, state FROM actions")]
    offline_nodes = {node for (node,) in db.execute("SELECT node FROM events WHERE kind = 'node_offline'")}
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    await coord.close()
    stats = {
        "counters": coord.summary(),
        "latency": marks["latency"],
        "actions": actions,
        "offline_recorded": len(offline_nodes & tally.rack),
        "offline_recorded_other": len(offline_nodes - tally.rack),
    }
    print("STATS", json.dumps(stats), flush=True)

asyncio.run(main())
"""


class RackTally:
    """The storm's node_offline decisions: the rack's nodes decided, each counted once however many
    times it was decided, and the wall time of the last; a decision for any other node is counted
    apart (``others``), never as one of the rack's (issue #31: it used to count any node's)."""

    def __init__(self, rack: Iterable[str]) -> None:
        self.rack = frozenset(rack)
        self.rack_decided: set[str] = set()
        self.others = 0
        self.last = 0.0

    def decided(self, node: str, at: float) -> None:
        if node in self.rack:
            self.rack_decided.add(node)
            self.last = at
        else:
            self.others += 1


class ScaleCoordinator(CoordinatorProcess):
    """The coordinator subprocess of this bench (PROGRESS {json}: nodes known and online, offline
    nodes decided and when the last was, probes decided)."""

    def __init__(self, config_path: Path, layout: dict[str, Any], work: Path) -> None:
        layout_path = work / "layout.json"
        layout_path.write_text(json.dumps(layout))
        self.progress: dict[str, Any] = {
            "known": 0,
            "online": 0,
            "offline_decided": 0,
            "offline_other": 0,
            "offline_last": 0.0,
            "probe_decided": 0,
        }
        argv = [sys.executable, "-c", _SCRIPT, str(config_path), str(layout_path)]
        super().__init__(argv, work / "coordinator.log")

    def on_progress(self, text: str) -> None:
        self.progress = json.loads(text)
