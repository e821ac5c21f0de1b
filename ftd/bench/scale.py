"""``ftd bench scale``: N real node sessions on one Mosquitto, an Xid's latency among them, a rack goes dark.

docs/architecture.md §10 targets (2-core machine): 10,000 sessions held with coordinator RSS <= 500 MB;
Xid event -> decision p99 <= 25 ms with 10,000 idle sessions; 1,000 simultaneous Last Wills all decided
within 10 s, 0 lost.

Setup, all real but the scheduler: a private Mosquitto on loopback with the shipped ACL
(``deploy/mosquitto/acl``), ``allow_anonymous false``, ``use_username_as_clientid`` and the shipped
queue limits; one password per node (PBKDF2-SHA512 entries written as ``mosquitto_passwd`` writes them,
:mod:`ftd.bench.mosquitto_auth`). Passwords, not the TLS listener's client certificates, because
TLS would make the load generator, not ftd, what is measured. Measured on the 2-core development VM:
``scripts/make-certs.sh`` takes 65 ms of openssl per node (11 minutes for 10,000 certificates); 1,000
mutual-TLS connections from one Python process, each with its node's own certificate (its own
``SSLContext``), took 11 s to open and 328 KiB of client memory each (3.2 GB for 10,000), against
0.2 s and 4 KiB each for plain TCP with a password. What the coordinator sees is the same either way
(the username is the node name, as the certificate's CN would be).

* the coordinator (:mod:`ftd.bench.scale_coordinator`): production wiring, a fake scheduler that knows
  every node and the bench's jobs, ``offline_grace.last_will_s = grace_s`` (0 by default: the storm's
  decisions are measured, not the grace; with a grace they come that much later, all at once);
* ``nodes`` sessions (:class:`ftd.bench.mqtt_lite.LiteSession`, one process, one event loop): each
  connects with its password and a retained QoS 1 Last Will ``offline`` (``ftd.agent.app.status_messages``),
  subscribes to its directives and receipts, publishes its retained ``online`` status; the nodes of
  ``jobs`` multi-node jobs (``job_size`` nodes each) publish their retained job presence and re-publish
  it every ``beat_s`` with a new step (the rank heartbeats an agent forwards); every session pings at
  the agent's keepalive;
* the probe node (a real :class:`ftd.bus.mqtt.MqttBus`, in its own thread and event loop, as an agent's
  bus) publishes ``samples`` Xid 13 events once all sessions are held; latency = the event's ``ts`` ->
  the engine's decision in the coordinator (one machine, one clock);
* the rack: the first ``wills`` sessions' sockets are closed at once, without DISCONNECT: the broker
  publishes their Last Wills together. The storm's figures count the rack's nodes decided, each once
  (``wills_decided``; a node_offline of a node outside the rack is reported apart,
  ``offline_outside_rack_decided``, and decides nothing of the storm). Half the jobs have a node in
  the rack (one straddles it): each must get exactly one ``checkpoint_restart``, the others none;
  node_death drains nothing, so the blast-radius budget holds when ``drains`` is 0.

Noise: the broker, the load generator and the coordinator share the machine's cores; the load
generator's keepalive pings alone are ``nodes / keepalive_s`` round trips a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import resource
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ftd.agent.app import status_messages
from ftd.bench.broker import PrivateMosquitto
from ftd.bench.coordinator import percentile
from ftd.bench.mosquitto_auth import shipped_acl, write_password_file
from ftd.bench.mqtt_lite import LiteSession, Will
from ftd.bench.scale_coordinator import ScaleCoordinator
from ftd.bus import topics
from ftd.bus.mqtt import MqttBus
from ftd.events import JobPresence, Kind, RankInfo, Severity, encode, make_event

PROBE = "probe-node"
COORDINATOR_USER = "coordinator"


def node_name(i: int) -> str:
    return f"node-{i:05d}"


def password_of(user: str) -> str:
    return f"pw-{user}"  # a bench: one broker on loopback, gone when the bench ends


def layout(nodes: int, wills: int, jobs: int, job_size: int) -> dict[str, Any]:
    """Nodes, the jobs' nodes and the rack. Jobs are laid out around the rack's edge so that about half
    have a node in it (one straddles it); needs ``wills >= jobs * job_size // 2`` and room after it."""
    if not 0 < wills <= nodes:
        raise ValueError("wills must be between 1 and nodes")
    start = max(0, wills - (jobs * job_size) // 2 + job_size // 2)
    if start + jobs * job_size > nodes:
        raise ValueError(
            f"{jobs} jobs of {job_size} nodes do not fit around a rack of {wills} in {nodes} nodes"
        )
    names = [node_name(i) for i in range(nodes)]
    job_nodes = {f"job-{j}": names[start + j * job_size : start + (j + 1) * job_size] for j in range(jobs)}
    rack = set(names[:wills])
    return {
        "nodes": [*names, PROBE],
        "jobs": job_nodes,
        "rack": names[:wills],
        "jobs_in_rack": sorted(job for job, ns in job_nodes.items() if rack & set(ns)),
        "probe": PROBE,
    }


def _config(port: int, work: Path, grace_s: float) -> Path:
    path = work / "coordinator.toml"
    (work / "coordinator.pw").write_text(password_of(COORDINATOR_USER))
    path.write_text(
        f'[bus]\nhost = "127.0.0.1"\nport = {port}\nusername = "{COORDINATOR_USER}"\n'
        f'password_file = "{work}/coordinator.pw"\n\n'
        f'[coordinator]\nledger_path = "{work}/ledger.sqlite"\nscheduler = "none"\n'
        # The probe sends one Xid after another on one node: a real node doing that is a repeat
        # offender, and its drain is not what is measured (as in ftd bench e2e).
        'disabled_rules = ["repeat_offender"]\n'
        f"\n[coordinator.offline_grace]\nlast_will_s = {grace_s}\n"
        '\n[coordinator.api]\nenabled = false\n\n[log]\nlevel = "warning"\njson = true\n'
    )
    return path


def _usage(pid: int) -> tuple[float, float]:
    """(RSS in MB, CPU seconds user + system) of a process, from /proc."""
    rss_kb = 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return rss_kb / 1024, (int(fields[11]) + int(fields[12])) / ticks


def _raise_nofile(needed: int) -> int:
    """Raise this process's open-file limit (inherited by the broker it starts) to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, needed)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < needed:
        raise RuntimeError(f"open-file limit {target} < {needed} needed (raise the hard limit: ulimit -Hn)")
    return target


def _presence(job: str, node: str, rank: int, step: int) -> bytes:
    now = time.time()
    info = RankInfo(rank=rank, local_rank=0, pid=1000 + rank, step=step, last_beat=now)
    return encode(JobPresence(job=job, node=node, ranks=[info], ts=now))


class _Sessions:
    """The load generator: every node's session, held on one event loop (run in its own thread)."""

    def __init__(self, port: int, plan: dict[str, Any], keepalive_s: int, beat_s: float) -> None:
        self.port, self.plan, self.keepalive_s, self.beat_s = port, plan, keepalive_s, beat_s
        self.sessions: dict[str, LiteSession] = {}
        self.failed: list[str] = []
        self.beats = 0
        self._job_of: dict[str, tuple[str, int]] = {
            node: (job, rank) for job, nodes in plan["jobs"].items() for rank, node in enumerate(nodes)
        }

    async def _open(self, node: str, gate: asyncio.Semaphore) -> None:
        async with gate:
            will, birth = status_messages(node)
            session = LiteSession("127.0.0.1", self.port, node, keepalive_s=self.keepalive_s)
            try:
                await session.connect(
                    username=node,
                    password=password_of(node),
                    will=Will(will.topic, will.payload, retain=True),
                )
                await session.subscribe(
                    [
                        topics.node_directives(node),
                        topics.node_job_directives(node),
                        topics.node_receipts(node),
                    ]
                )
                await session.publish(birth.topic, birth.payload, retain=True)
                if node in self._job_of:
                    job, rank = self._job_of[node]
                    await session.publish(
                        topics.node_job(node, job), _presence(job, node, rank, 0), retain=True
                    )
            except (OSError, TimeoutError, RuntimeError) as error:
                self.failed.append(f"{node}: {error}")
                session.cut()
                return
            self.sessions[node] = session

    async def open_all(self, concurrency: int = 256) -> None:
        gate = asyncio.Semaphore(concurrency)
        await asyncio.gather(*(self._open(node, gate) for node in self.plan["nodes"] if node != PROBE))

    async def beat(self, stop: asyncio.Event) -> None:
        """The job nodes re-publish their presence with a new step every ``beat_s``."""
        step = 0
        while not stop.is_set():
            try:
                async with asyncio.timeout(self.beat_s):
                    await stop.wait()
            except TimeoutError:
                pass
            step += 1
            for node, (job, rank) in self._job_of.items():
                session = self.sessions.get(node)
                if session is not None and session.connected:
                    try:
                        await session.publish(
                            topics.node_job(node, job), _presence(job, node, rank, step), retain=True
                        )
                        self.beats += 1
                    except (OSError, TimeoutError, RuntimeError):
                        pass

    def held(self) -> int:
        return sum(1 for s in self.sessions.values() if s.connected)

    def cut(self, nodes: list[str]) -> None:
        for node in nodes:
            session = self.sessions.get(node)
            if session is not None:
                session.cut()


class _Loop:
    """An event loop in a thread, for the sessions (the bench's main thread waits and reads progress)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        """Cancel what still runs on the loop (the sessions' readers and pings), then stop it."""

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            self.run(cancel_all(), timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


async def _probe(port: int, samples: int, interval_s: float) -> int:
    """The probe node's agent-like bus: an Xid 13 every ``interval_s``; returns how many it published."""
    bus = MqttBus(
        host="127.0.0.1",
        port=port,
        client_id=PROBE,
        username=PROBE,
        password=password_of(PROBE),
        clean_session=True,
    )
    await bus.start()
    if not await bus.wait_connected(30):
        raise RuntimeError("the probe could not connect")
    sent = 0
    try:
        for i in range(samples):
            event = make_event(
                PROBE,
                Kind.XID,
                severity=Severity.ERROR,
                source="bench",
                data={"code": 13, "pci": f"0000:{i // 256:02x}:{i % 256:02x}.0"},
            )
            await bus.publish(topics.node_event(PROBE, str(event.kind)), encode(event))
            sent += 1
            await asyncio.sleep(interval_s)
    finally:
        await bus.stop()
    return sent


def _wait(done: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def bench_scale(
    nodes: int = 10_000,
    wills: int = 1_000,
    samples: int = 200,
    jobs: int = 10,
    job_size: int = 4,
    grace_s: float = 0.0,
    keepalive_s: int = 5,
    beat_s: float = 5.0,
    probe_interval_s: float = 0.05,
) -> dict[str, Any]:
    plan = layout(nodes, wills, jobs, job_size)
    nofile = _raise_nofile(nodes + 1024)
    with tempfile.TemporaryDirectory(prefix="ftd-bench-scale-") as tmp:
        work = Path(tmp)
        write_password_file(
            work / "passwd", {user: password_of(user) for user in [*plan["nodes"], COORDINATOR_USER]}
        )
        (work / "acl").write_text(shipped_acl())
        conf = (
            # Started as root, Mosquitto drops to the `mosquitto` user, which cannot read this private
            # directory: it stays who started it.
            f"user {pwd.getpwuid(os.geteuid()).pw_name}",
            f"password_file {work}/passwd",
            f"acl_file {work}/acl",
            "use_username_as_clientid true",
            "max_connections -1",
            "max_queued_messages 100000",
            "max_queued_bytes 268435456",
        )
        with PrivateMosquitto(conf, anonymous=False) as broker:
            coordinator = ScaleCoordinator(_config(broker.port, work, grace_s), plan, work)
            sessions = _Sessions(broker.port, plan, keepalive_s, beat_s)
            loop = _Loop()
            stop_beats = asyncio.Event()
            try:
                if not coordinator.ready.wait(60):
                    raise RuntimeError("the coordinator did not become ready: " + coordinator.log_tail())
                started = time.monotonic()
                loop.run(sessions.open_all())
                connect_s = time.monotonic() - started
                held = sessions.held()
                beats = asyncio.run_coroutine_threadsafe(sessions.beat(stop_beats), loop.loop)
                _wait(lambda: coordinator.progress["online"] >= held, 120)
                tracked = coordinator.progress["online"]
                broker_idle = _usage(broker.pid)
                coord_idle = _usage(coordinator.proc.pid)

                probe_thread_result: list[int] = []
                probe = threading.Thread(
                    target=lambda: probe_thread_result.append(
                        asyncio.run(_probe(broker.port, samples, probe_interval_s))
                    )
                )
                probe_started = time.monotonic()
                probe.start()
                probe.join(samples * probe_interval_s + 120)
                probe_sent = probe_thread_result[0] if probe_thread_result else 0
                _wait(lambda: coordinator.progress["probe_decided"] >= probe_sent, 30)
                probe_s = time.monotonic() - probe_started
                broker_probe, coord_probe = _usage(broker.pid), _usage(coordinator.proc.pid)

                cut_at = time.time()
                loop.loop.call_soon_threadsafe(sessions.cut, plan["rack"])
                decided_all = _wait(lambda: coordinator.progress["offline_decided"] >= wills, 60 + grace_s)
                storm_s = (coordinator.progress["offline_last"] or time.time()) - cut_at
                offline_decided = int(coordinator.progress["offline_decided"])
                online_after = int(coordinator.progress["online"])
                time.sleep(1.0)  # restarts requested by the last decisions reach the ledger
                offline_other = int(coordinator.progress.get("offline_other", 0))
                broker_end, coord_end = _usage(broker.pid), _usage(coordinator.proc.pid)
                loop.loop.call_soon_threadsafe(stop_beats.set)
                beats.result(30)
                stats = coordinator.finish()
            finally:
                coordinator.kill()
                loop.loop.call_soon_threadsafe(sessions.cut, list(sessions.sessions))
                loop.close()
    return _report(
        plan=plan,
        nodes=nodes,
        wills=wills,
        nofile=nofile,
        connect_s=connect_s,
        held=held,
        failed=sessions.failed,
        tracked=tracked,
        usage={
            "idle": (broker_idle, coord_idle),
            "probe": (broker_probe, coord_probe),
            "end": (broker_end, coord_end),
        },
        probe_sent=probe_sent,
        probe_s=probe_s,
        storm=(decided_all, storm_s, offline_decided, offline_other, online_after),
        grace_s=grace_s,
        beats=sessions.beats,
        stats=stats,
    )


def _report(
    *,
    plan: dict[str, Any],
    nodes: int,
    wills: int,
    nofile: int,
    connect_s: float,
    held: int,
    failed: list[str],
    tracked: int,
    usage: dict[str, tuple[tuple[float, float], tuple[float, float]]],
    probe_sent: int,
    probe_s: float,
    storm: tuple[bool, float, int, int, int],
    grace_s: float,
    beats: int,
    stats: dict[str, Any],
) -> dict[str, Any]:
    decided_all, storm_s, offline_decided, offline_other, online_after = storm
    latency = sorted(v * 1000 for v in stats["latency"])
    # A job on several dead nodes is asked for once per node_offline; the policy gate lets the first
    # through and records the others as ``suppressed`` (same key): those are not restarts.
    restarts = Counter(
        target
        for kind, target, state in stats["actions"]
        if kind == "checkpoint_restart" and state != "suppressed"
    )
    in_rack = set(plan["jobs_in_rack"])
    kinds = Counter(kind for kind, _target, _state in stats["actions"])
    (broker_idle, coord_idle), (broker_probe, coord_probe) = usage["idle"], usage["probe"]
    broker_end, coord_end = usage["end"]
    return {
        "nodes": nodes,
        "credentials": "password per node (mosquitto_passwd format), shipped ACL",
        "nofile_limit": nofile,
        "connect_s": round(connect_s, 2),
        "connections_held": held,
        "connect_failures": len(failed),
        "coordinator_tracked_online": tracked,
        "broker_rss_mb": round(broker_idle[0], 1),
        "coordinator_rss_mb": round(coord_idle[0], 1),
        "coordinator_rss_mb_end": round(coord_end[0], 1),
        "broker_cpu_pct_probe": round(100 * (broker_probe[1] - broker_idle[1]) / max(probe_s, 1e-9), 1),
        "coordinator_cpu_pct_probe": round(100 * (coord_probe[1] - coord_idle[1]) / max(probe_s, 1e-9), 1),
        "broker_cpu_s_total": round(broker_end[1], 2),
        "coordinator_cpu_s_total": round(coord_end[1], 2),
        "xid_sent": probe_sent,
        "xid_decided": len(latency),
        "xid_p50_ms": round(statistics.median(latency), 2) if latency else None,
        "xid_p99_ms": round(percentile(latency, 0.99), 2) if latency else None,
        "xid_max_ms": round(latency[-1], 2) if latency else None,
        "wills": wills,
        "offline_grace_s": grace_s,
        # The rack's nodes (the sessions cut), each counted once: a node_offline of any other node is
        # not one of the storm's decisions (issue #31) and is reported apart.
        "wills_decided": offline_decided,
        "wills_recorded": int(stats["offline_recorded"]),
        "wills_lost": wills - offline_decided,
        "offline_outside_rack_decided": offline_other,
        "offline_outside_rack_recorded": int(stats["offline_recorded_other"]),
        "storm_all_decided": decided_all,
        "storm_time_to_decided_s": round(storm_s, 3),
        "storm_after_grace_s": round(storm_s - grace_s, 3),
        "online_after_storm": online_after,
        "jobs": len(plan["jobs"]),
        "jobs_in_rack": len(in_rack),
        "restarts_per_job_in_rack": sorted(Counter(restarts[job] for job in in_rack).items()),
        "jobs_in_rack_restarted_once": sum(1 for job in in_rack if restarts[job] == 1),
        "restarts_outside_rack": sum(n for job, n in restarts.items() if job not in in_rack),
        "drains": kinds.get("drain", 0),
        "actions": dict(sorted(kinds.items())),
        "action_states": dict(
            sorted(Counter(f"{kind}:{state}" for kind, _t, state in stats["actions"]).items())
        ),
        "presence_beats": beats,
        "bad_messages": stats["counters"].get("bad_messages", 0),
        "placement_violations": stats["counters"].get("placement_violations", 0),
        "cpus": os.cpu_count(),
    }
