"""``ftd demo``: a self-contained cluster on an embedded broker, a scripted fault, a readable timeline.

Scenarios:

* ``xid79`` (default) — "GPU has fallen off the bus" on a node running half of a 2-node job: the
  trainers save at the same step and ack, stop, the node is drained, and the job is restarted on a
  healthy node from the saved step.
* ``xid13`` — an application fault (RESTART_APP): checkpoint-and-restart in place, nothing drained.
* ``xid43`` — a non-fatal, ignorable Xid: recorded, nothing else happens.

With ``--json`` the last line printed is one JSON object: ``{"scenario", "detect_ms", "acks",
"actions": [{"kind", "target", "state"}, ...], ...}``.

With ``--serve`` the cluster stays up after the scenario: the coordinator's API and dashboard answer
at the URL printed (``--port``, default 8788, on 127.0.0.1) until Ctrl-C or SIGTERM; ``ftd status
--url`` reads it like a real one.

The first 4 nodes run real agents (the job's two, the spare it restarts on, one more); with more
``--nodes`` the others are seeded into the coordinator's state as online nodes in racks of 32, with no
process or connection each, so ``--nodes 10000`` shows the dashboard at scale in seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

XID_LINES = {
    "xid79": "[ 8123.456789] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, "
    "GPU has fallen off the bus.",
    "xid13": "[ 8123.456789] NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python, "
    "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
    "xid43": "[ 8123.456789] NVRM: Xid (PCI:0000:3b:00): 43, pid=4242, name=python, Ch 00000008",
}


@dataclass(frozen=True)
class Scenario:
    name: str
    line: str
    expect_drain: bool
    expect_restart: bool


SCENARIOS = {
    "xid79": Scenario("xid79", XID_LINES["xid79"], expect_drain=True, expect_restart=True),
    "xid13": Scenario("xid13", XID_LINES["xid13"], expect_drain=False, expect_restart=True),
    "xid43": Scenario("xid43", XID_LINES["xid43"], expect_drain=False, expect_restart=False),
}
AGENTS = 4  # nodes that run a real agent; the others are seeded (ftd.sim.seed)


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "demo",
        help="run a self-contained demo cluster",
        description=plain(__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="xid79")
    parser.add_argument(
        "--nodes",
        type=int,
        default=4,
        help=f"simulated nodes (>= 3); the first {AGENTS} run real agents, the others are seeded",
    )
    parser.add_argument("--json", action="store_true", help="end with one JSON summary line")
    parser.add_argument(
        "--serve",
        action="store_true",
        help="keep the cluster, its API and dashboard up after the scenario (until Ctrl-C)",
    )
    parser.add_argument("--port", type=int, default=8788, help="API and dashboard port with --serve")
    parser.set_defaults(handler=_run)


def plain(text: str) -> str:
    """reStructuredText of a docstring as a terminal shows it: no ``literal`` quotes, no roles."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text)
    return text.replace("``", "").replace("\n* ", "\n- ")


def _run(args: argparse.Namespace) -> int:
    if args.nodes < 3:
        print("ftd demo: --nodes must be at least 3 (a 2-node job plus a spare)", file=sys.stderr)
        return 2
    from ftd.logs import configure

    if args.serve and not 1 <= args.port <= 65535:
        print("ftd demo: --port must be 1..65535", file=sys.stderr)
        return 2
    configure("warning", json=True)  # the timeline is the demo's output; logs only for trouble
    serve_port = args.port if args.serve else None
    from ftd.sim.cluster import SimStartError

    try:
        summary = asyncio.run(run_demo(SCENARIOS[args.scenario], args.nodes, serve_port=serve_port))
    except SimStartError as exc:
        print(f"ftd demo: the simulated cluster did not come up: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    return 0 if summary["ok"] else 1


async def run_demo(
    scenario: Scenario, nodes: int, out: Any = None, serve_port: int | None = None
) -> dict[str, Any]:
    from ftd.events import Event
    from ftd.plugin.actions import ActionRecord, ActionState
    from ftd.sim.cluster import SimCluster

    out = out or sys.stdout
    t0 = time.perf_counter()

    lock = threading.Lock()  # trainer ranks report from their own threads: one whole line at a time

    def say(who: str, what: str) -> None:
        line = f"{(time.perf_counter() - t0) * 1000:9.1f} ms  {who:<16} {what}\n"
        with lock:
            out.write(line)
            out.flush()

    cluster = SimCluster(nodes=nodes, timeline=say, api_port=serve_port, agents=AGENTS)
    detected_at: dict[str, float] = {}
    actions: dict[str, ActionRecord] = {}

    def observe(what: str, payload: Any) -> None:
        if what == "event" and isinstance(payload, Event):
            detected_at.setdefault(payload.kind, time.perf_counter())
            code = payload.data.get("code")
            say(
                "coordinator",
                f"event {payload.kind}{f' {code}' if code else ''} from {payload.node} "
                f"(severity {payload.severity})",
            )
        elif what == "action" and isinstance(payload, ActionRecord):
            actions[payload.id] = payload
            note = payload.detail.get("policy") or payload.detail.get("error") or ""
            say(
                "coordinator",
                f"{payload.request.kind} {payload.request.target}: {payload.state}"
                f"{' — ' + note if note else ''}",
            )

    job, job_nodes = "1001", cluster.node_names[:2]
    faulty = job_nodes[1]
    try:
        seeded = cluster.seeded_nodes
        say("demo", f"starting embedded broker, coordinator and {len(cluster.agent_nodes)} agents")
        await cluster.start()
        if seeded:
            say("demo", f"{len(seeded)} more nodes seeded online, no agent each ({seeded[0]}..{seeded[-1]})")
        assert cluster.coordinator is not None
        cluster.coordinator.engine.observe(observe)
        say("demo", f"job {job} running: rank 0 on {job_nodes[0]}, rank 1 on {faulty}")
        await cluster.launch_job(job, job_nodes)
        await asyncio.sleep(0.2)
        say("kernel", f"{faulty}: {scenario.line.split('] ', 1)[1]}")
        written = cluster.write_kernel_line(faulty, scenario.line)
        await cluster.wait_for(lambda: "xid" in detected_at, 10, "the Xid to reach the coordinator")
        await asyncio.sleep(0.3)  # let the rules' actions get going
        await cluster.coordinator.engine.wait_idle(30)

        restarted_on: list[str] = []
        requeued = cluster.scheduler.jobs[job].state == "PENDING"
        if requeued:
            excluded = set(cluster.scheduler.jobs[job].excluded)
            drained = {n for n, info in cluster.scheduler.nodes.items() if info.drained}
            healthy = [n for n in cluster.node_names if n not in excluded | drained]
            restarted_on = healthy[: len(job_nodes)]
            steps = [step for rank in cluster.ranks for step, _ in rank.saved]
            resume = max(steps) if steps else 0
            say(
                "scheduler",
                f"job {job} requeued; starting again on {', '.join(restarted_on)} from step {resume}",
            )
            await cluster.launch_job(job, restarted_on, start_step=resume)
            say("demo", f"job {job} training again on {', '.join(restarted_on)}")
        acks = sum(len(rank.saved) for rank in cluster.ranks)
        seen = [r.save_seen_ns for r in cluster.ranks if r.save_seen_ns is not None]
        violations = cluster.coordinator.placement.violations  # the restarted ranks are believed
        if serve_port is not None:
            if cluster.coordinator.api is None:  # start_api logged why (port in use)
                say("demo", f"the dashboard could not listen on 127.0.0.1:{serve_port}: try --port")
            else:
                say("demo", f"dashboard and API: http://127.0.0.1:{serve_port}/  (Ctrl-C stops the demo)")
                await _until_stopped()
    finally:
        await cluster.stop()

    drained_nodes = sorted(n for n, info in cluster.scheduler.nodes.items() if info.drained)
    summary: dict[str, Any] = {
        "scenario": scenario.name,
        "nodes": nodes,
        "detect_ms": round((detected_at["xid"] - written) * 1000, 2) if "xid" in detected_at else None,
        "save_seen_ms": round((min(seen) / 1e9 - written) * 1000, 2) if seen else None,
        "acks": acks,
        "actions": [
            {"kind": r.request.kind, "target": r.request.target, "state": str(r.state)}
            for r in sorted(actions.values(), key=lambda r: r.created)
        ],
        "drained": drained_nodes,
        "restarted_on": restarted_on,
        "placement_violations": violations,
    }
    did_restart = any(
        a["kind"] == "checkpoint_restart" and a["state"] == ActionState.SUCCEEDED for a in summary["actions"]
    )
    summary["ok"] = (
        bool(drained_nodes) == scenario.expect_drain
        and did_restart == scenario.expect_restart
        and violations == 0
    )
    say("demo", "done: " + ("as expected" if summary["ok"] else "NOT as expected"))
    return summary


async def _until_stopped() -> None:
    """Wait for SIGINT or SIGTERM (``--serve``), then return so the cluster stops cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
