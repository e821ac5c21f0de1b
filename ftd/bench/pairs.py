"""``ftd bench pairs``: pair tests on 16 real agents in network namespaces (docs/architecture.md §10).

What it measures, on a :class:`~ftd.bench.netns_fleet.NetnsFleet` of 16 namespaces (a real
pair-test agent process in each, one bridge):

* ``degraded``: ``runs`` times, one node chosen at random has its egress shaped by ``tc tbf`` to
  20 Mbit/s; a bisection with a budget of 8 pair tests, judged against the fleet's baseline, must
  name that node and no other (``right``, ``wrong``, ``tests_max``, ``seconds_max``).
* ``clean``: ``clean_runs`` bisections on the unshaped fleet: any node or link named is a false
  finding (``false_findings``).
* ``mesh``: every agent probes its 15 peers round-robin, one probe every :data:`MESH_INTERVAL_S`
  (the rate ``coordinator.fabric.mesh_interval_s = 10`` asks of the whole fleet, here asked of
  every agent at once: an upper bound), for ``seconds``; the CPU each agent process used over the
  window (``/proc/PID/stat`` utime + stime, serving its peers' probes included), as a percentage of
  one core (``cpu_pct_max``).
* ``training``: pair tests asked of a node that trains (its server refuses; its client does not
  start): how many moved any data (``ran``, must be 0).

Needs root and iproute2; without them the figures are not measured and ``--check`` fails.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

from ftd.agent.pair_tests.client import PairPeer, run_pair_test
from ftd.agent.pair_tests.server import PairTestServer
from ftd.bench.netns_fleet import PORT, NetnsFleet, available, hunt

__all__ = ["bench_pairs"]

MB = 1024 * 1024
#: Bytes per direction on the rig: veth moves 5-25 Gbit/s, so 8 MiB made 1-2 ms bursts that one
#: context switch halved (a clean direction at 0.18 x the median was measured, a false "slow");
#: 64 MiB bursts of ~20 MiB last 10-30 ms (worst clean direction in 30 runs: 0.33 x the median).
#: The shaped direction stops at its time cap (15 s / 3 / 3 per burst), measured on what arrived.
RIG_BYTES = 64 * MB
#: The pingmesh rate measured: one probe per agent every 10 s (the recommended fleet-wide rate of
#: ``coordinator.fabric.mesh_interval_s``, here asked of every agent at once: an upper bound).
MESH_INTERVAL_S = 10.0


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _degraded(fleet: NetnsFleet, runs: int, rng: random.Random) -> dict[str, Any]:
    right = wrong = 0
    misses: list[dict[str, Any]] = []
    tests: list[int] = []
    seconds: list[float] = []
    for _ in range(runs):
        victim = rng.choice(fleet.nodes)
        fleet.degrade(victim, "20mbit")
        try:
            found = hunt(fleet, budget=8)
        finally:
            fleet.restore(victim)
        tests.append(found.finding.tests)
        seconds.append(found.seconds)
        if found.finding.bad_nodes == (victim,) and not found.finding.bad_links:
            right += 1
        else:
            wrong += 1
            misses.append({"victim": victim, "finding": found.finding.as_dict(), "verdicts": found.verdicts})
    return {
        "runs": runs,
        "right": right,
        "wrong": wrong,
        "tests_max": max(tests, default=None),
        "seconds_max": round(max(seconds, default=0.0), 3),
        "misses": misses[:3],
    }


def _clean(fleet: NetnsFleet, runs: int) -> dict[str, Any]:
    false: list[dict[str, Any]] = []
    dismissed = 0
    tests: list[int] = []
    for _ in range(runs):
        found = hunt(fleet)
        tests.append(found.finding.tests)
        dismissed += sum(1 for r in found.finding.reasons if "not reproduced" in r)
        if not found.finding.clean or found.finding.untested:
            false.append({"finding": found.finding.as_dict(), "verdicts": found.verdicts})
    return {
        "runs": runs,
        "false_findings": len(false),
        "dismissed_once_slow": dismissed,
        "tests_max": max(tests, default=None),
        "false": false[:3],
    }


def _mesh(fleet: NetnsFleet, interval_s: float, seconds: float) -> dict[str, Any]:
    pids = fleet.pids()
    before = {node: _cpu_seconds(pid) for node, pid in pids.items()}
    started = time.monotonic()
    nodes = list(fleet.nodes)
    for i, node in enumerate(nodes):
        # round-robin from the next node on, so the agents' first probes are spread over the fleet
        # (all starting at the same peer would be 15 probes at one server in the same instant)
        order = nodes[i + 1 :] + nodes[:i]
        peers = [[p, fleet.addresses[p], PORT] for p in order]
        fleet.ask(node, {"mesh": peers, "interval": interval_s, "seconds": seconds})
    answers = {node: fleet.answer(node, seconds + 60.0) for node in fleet.nodes}
    window = time.monotonic() - started
    cpu = {node: (_cpu_seconds(pid) - before[node]) / window * 100 for node, pid in pids.items()}
    probes = [p for a in answers.values() for p in a.get("probes", [])]
    failed = [p for p in probes if "rtt_ms" not in p]
    return {
        "interval_s": interval_s,
        "window_s": round(window, 1),
        "probes": len(probes),
        "probes_failed": len(failed),
        "probes_failed_why": sorted({str(p.get("error") or p.get("skipped") or p)[:120] for p in failed})[:5],
        "cpu_pct_max": round(max(cpu.values()), 3),
        "cpu_pct_mean": round(sum(cpu.values()) / len(cpu), 3),
    }


async def _training(attempts: int) -> dict[str, Any]:
    key = os.urandom(32)
    server = PairTestServer(node="trainer", key=key, host="127.0.0.1", busy=lambda: "training: job 1")
    port = await server.start()
    ran = 0
    try:
        peer = PairPeer("trainer", "127.0.0.1", port)
        for _ in range(attempts):
            refused = await run_pair_test(peer, node="idle", key=key, max_bytes=MB)
            started = await run_pair_test(peer, node="trainer2", key=key, busy=lambda: "training: job 2")
            ran += sum(1 for r in (refused, started) if not r.error or r.bytes_moved)
    finally:
        await server.close()
    return {"attempts": 2 * attempts, "ran": ran, "refused_by_server": server.refused}


def bench_pairs(
    runs: int = 10, clean_runs: int = 20, seconds: float = 60.0, nodes: int = 16, seed: int | None = None
) -> dict[str, Any]:
    training = asyncio.run(_training(5))
    why = available()
    if why is not None:
        return {"skipped": why, "training": training}
    rng = random.Random(seed)
    interval = MESH_INTERVAL_S
    started = time.monotonic()
    with NetnsFleet(nodes, max_bytes=RIG_BYTES, timeout_s=15.0) as fleet:
        setup_s = time.monotonic() - started
        degraded = _degraded(fleet, runs, rng)
        clean = _clean(fleet, clean_runs)
        mesh = _mesh(fleet, interval, seconds)
    return {
        "nodes": nodes,
        "setup_s": round(setup_s, 1),
        "degraded": degraded,
        "clean": clean,
        "mesh": mesh,
        "training": training,
    }
