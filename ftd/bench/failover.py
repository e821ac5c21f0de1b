"""``ftd bench failover``: two coordinators on a real PostgreSQL and Mosquitto; kill and freeze the leader.

Real parts: a private PostgreSQL (:mod:`ftd.bench.postgres`) holding the ledger and the lease, a
private Mosquitto, and two coordinator *processes* (``python -m ftd.bench.failover coordinator``,
i.e. :class:`~ftd.coordinator.ha.runner.HaRunner` as ``ftd coordinator`` runs it with ``coordinator.ha.ledger
= "postgresql"``; lease TTL 5 s, renewal every 1 s). Simulated: the nodes and their trainers (one MQTT
client in this process speaking the agents' protocol: retained job presence, events, acks of save
and stop directives, and -- as the agent does -- every event not yet receipted sent again when the
coordinator's ``online`` status arrives) and the scheduler (each coordinator process records its calls
instead of running ``scontrol``). Every side effect a coordinator performs -- each scheduler call and
each bus publish that passed its lease guard -- is appended by that process to one shared file with
its pid, so who did what, and when, is counted from outside the coordinators.

Workload: ``jobs`` jobs, each on its own node; a steady stream of non-actionable events (Xid 43) from
every node; one actionable event per job (Xid 13: the job is saved, stopped and requeued, a
``checkpoint_restart``), one job every ``gap_s``.

1. **SIGKILL**: when the trainer of job ``kill_job`` receives its ``save`` directive (the action is
   mid ``checkpoint_restart``), the leader is SIGKILLed. ``takeover_s`` is the time from the kill
   until the lease row in PostgreSQL names the standby (a new epoch); ``resume_s`` until the new
   leader has re-sent that action's directive (it resumed the unfinished action). The killed
   process is started again (it becomes the standby).
2. **SIGSTOP**: on job ``stop_job``'s ``save`` directive the (new) leader is frozen; once the standby
   has taken over and finished every action, the frozen one is woken (SIGCONT) and watched for
   ``fence_watch_s``: ``fenced_side_effects`` counts what it performed after it was frozen (target 0),
   ``stale_writes_rejected`` the ledger writes PostgreSQL refused from a stale epoch.

At the end: ``lost_events`` = events sent that are not in the ledger; ``actions_done_twice`` = jobs
requeued more than once plus action keys the ledger shows run to completion more than once;
``actions_missing`` = jobs never requeued.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ftd.bench.chaos import Broker
from ftd.bench.postgres import LocalPostgres
from ftd.bus import topics
from ftd.bus.base import Bus, ForwardingBus, Message
from ftd.events import (
    Ack,
    CoordinatorStatus,
    DecodeError,
    Directive,
    Event,
    JobPresence,
    Kind,
    RankInfo,
    Receipt,
    Severity,
    decode,
    encode,
)

TTL_S = 5.0
RENEW_S = 1.0


# --- the coordinator process's recording scheduler and bus ------------------------------------------


class _Effects:
    """Appends one JSON line per side effect to the shared file (O_APPEND: lines never interleave)."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(self, what: str, target: str, **extra: Any) -> None:
        line = json.dumps({"pid": os.getpid(), "t": time.time(), "what": what, "target": target, **extra})
        os.write(self.fd, (line + "\n").encode())


class RecordingScheduler:
    """The scheduler a bench coordinator acts on: every job and node exists; calls are recorded."""

    name = "bench"

    def __init__(self, effects: _Effects) -> None:
        self.effects = effects

    async def drain(self, node: str, reason: str) -> None:
        self.effects.record("drain", node)

    async def resume(self, node: str) -> None:
        self.effects.record("resume", node)

    async def requeue(self, job: str, exclude: Sequence[str] = ()) -> None:
        self.effects.record("requeue", job, exclude=list(exclude))

    async def reboot(self, node: str, reason: str, nextstate: str = "RESUME") -> None:
        self.effects.record("reboot", node)

    async def node_info(self, node: str) -> Any:
        from ftd.coordinator.actions.scheduler import NodeInfo

        return NodeInfo(node, "IDLE", ("IDLE",), False, None)

    async def job_info(self, job: str) -> Any:
        from ftd.coordinator.actions.scheduler import JobInfo

        return JobInfo(job, "RUNNING", (), (), 0)

    async def list_nodes(self) -> list[Any]:
        return []

    async def job_nodes(self, job: str) -> tuple[str, ...]:
        return ()


class RecordingBus(ForwardingBus):
    """The MQTT bus with each publish recorded (it sits *inside* the lease guard: only what passed)."""

    def __init__(self, inner: Bus, effects: _Effects) -> None:
        super().__init__(inner)
        self.effects = effects

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self.effects.record("publish", topic)
        await self.inner.publish(topic, payload, retain=retain)


def coordinator_main(config_path: str, effects_path: str) -> int:
    """One bench coordinator replica (run as ``python -m ftd.bench.failover coordinator CONFIG FILE``)."""
    from ftd.bus.factory import make_mqtt_bus
    from ftd.config import load_config
    from ftd.coordinator.ha.runner import HaRunner
    from ftd.coordinator.wiring import coordinator_will
    from ftd.logs import configure

    config = load_config(config_path)
    configure(config.log.level, json=True)
    effects = _Effects(Path(effects_path))

    def make_bus() -> Bus:
        bus = make_mqtt_bus(config.bus, client_id="ftd-coordinator", will=coordinator_will(), manual_ack=True)
        return RecordingBus(bus, effects)

    async def main() -> None:
        def view_bus(client_id: str) -> Bus:
            return make_mqtt_bus(config.bus, client_id=client_id, clean_session=True)

        runner = HaRunner(
            config, make_bus=make_bus, scheduler=RecordingScheduler(effects), make_view_bus=view_bus
        )
        task = asyncio.create_task(runner.run())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    return 0


# --- the simulated nodes and trainers ----------------------------------------------------------


class Nodes:
    """``jobs`` nodes (``node-{i}``) each running ``job-{i}`` with one rank, over one MQTT client."""

    def __init__(self, bus: Bus, jobs: int) -> None:
        self.bus = bus
        self.jobs = jobs
        self.seq = 0
        self.unreceipted: dict[str, tuple[str, bytes]] = {}  # event id -> (topic, payload)
        self.sent: set[str] = set()
        self.resends = 0
        self.saves: dict[str, list[float]] = {}  # job -> times its save directives arrived
        self.directives: dict[str, list[float]] = {}  # job -> times any of its directives arrived
        self.on_save: dict[str, asyncio.Event] = {}
        self.online_seen = 0

    async def start(self) -> None:
        for pattern in (
            "ftd/v1/nodes/+/directives/jobs",
            "ftd/v1/nodes/+/receipts",
            topics.COORDINATOR_STATUS,
        ):
            await self.bus.subscribe(pattern)
        await self.bus.start()
        await self.bus.wait_connected(10)
        for i in range(self.jobs):
            presence = JobPresence(
                job=f"job-{i}", node=f"node-{i}", ranks=[RankInfo(rank=0, step=100)], ts=time.time()
            )
            await self.bus.publish(topics.node_job(f"node-{i}", f"job-{i}"), encode(presence), retain=True)

    async def event(self, i: int, code: int, severity: Severity) -> None:
        node = f"node-{i}"
        self.seq += 1
        event = Event(
            id=f"{node}-bench-{self.seq}",
            ts=time.time(),
            node=node,
            kind=Kind.XID,
            severity=severity,
            source="kmsg",
            data={"code": code, "pci": "0000:17:00.0", "jobs": [f"job-{i}"]},
        )
        topic, payload = topics.node_event(node, str(Kind.XID)), encode(event)
        self.unreceipted[event.id] = (topic, payload)
        self.sent.add(event.id)
        await self.bus.publish(topic, payload)

    async def pump(self) -> None:
        async for message in self.bus.messages():
            try:
                await self._handle(message)
            except DecodeError:
                continue

    async def _handle(self, message: Message) -> None:
        if message.topic == topics.COORDINATOR_STATUS:
            if message.payload and decode(message.payload, CoordinatorStatus).state == "online":
                self.online_seen += 1
                for topic, payload in list(self.unreceipted.values()):  # what the agents do
                    self.resends += 1
                    await self.bus.publish(topic, payload)
            return
        levels = message.topic.split("/")
        node = levels[3]
        if levels[4] == "receipts":
            receipt = decode(message.payload, Receipt)
            for event_id in [*receipt.ids, *receipt.rejected]:
                self.unreceipted.pop(event_id, None)
            return
        directive = decode(message.payload, Directive)
        job = directive.job or ""
        self.directives.setdefault(job, []).append(time.monotonic())
        if directive.action == "save":
            self.saves.setdefault(job, []).append(time.monotonic())
            waiter = self.on_save.get(job)
            if waiter is not None:
                waiter.set()
        step = directive.params.get("save_at_step")
        ack = Ack(directive_id=directive.id, job=job, rank=0, node=node, ok=True, step=step, ts=time.time())
        await self.bus.publish(topics.node_acks(node), encode(ack))
        if directive.action == "stop":
            gone = JobPresence(job=job, node=node, ranks=[], ts=time.time())
            await self.bus.publish(topics.node_job(node, job), encode(gone), retain=True)


# --- the rig -------------------------------------------------------------------------------------


class Replica:
    def __init__(self, name: str, workdir: Path, config: Path, effects: Path) -> None:
        self.name, self.config, self.effects = name, config, effects
        self.log = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            argv = [sys.executable, "-m", "ftd.bench.failover", "coordinator"]
            argv += [str(self.config), str(self.effects)]
            self.proc = subprocess.Popen(argv, stdout=out, stderr=out)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def count(self, needle: str) -> int:
        return self.log.read_text(errors="replace").count(needle) if self.log.exists() else 0


def _config(path: Path, identity: str, broker_port: int, dsn: str) -> None:
    path.write_text(
        f'[bus]\nhost = "127.0.0.1"\nport = {broker_port}\nkeepalive_s = 2\nreconnect_max_s = 0.5\n\n'
        '[coordinator]\nscheduler = "none"\nsave_deadline_s = 30.0\nstop_deadline_s = 30.0\n'
        # the simulated ranks never start again: no resume watch (it would wait for them)
        "reconcile_interval_s = 3600.0\nresume_deadline_s = 0\n\n"
        "[coordinator.api]\nenabled = false\n\n"
        "[coordinator.placement]\nenforce = false\n\n"
        f'[coordinator.ha]\nledger = "postgresql"\ndsn = "{dsn}"\nlease_ttl_s = {TTL_S}\n'
        f'renew_interval_s = {RENEW_S}\npoll_interval_s = 0.1\nidentity = "{identity}"\n\n'
        '[log]\nlevel = "info"\njson = true\n'
    )


class _Db:
    """The bench's own reads of the ledger and the lease (a plain connection, never fenced)."""

    def __init__(self, dsn: str) -> None:
        import psycopg

        self.conn = psycopg.connect(dsn, autocommit=True)

    def lease(self) -> tuple[str | None, int]:
        try:
            sql = "SELECT holder, epoch FROM ftd_lease WHERE name = 'coordinator'"
            row = self.conn.execute(sql).fetchone()
        except Exception:
            return None, 0
        return (row[0], int(row[1])) if row else (None, 0)

    def event_ids(self) -> set[str]:
        return {row[0] for row in self.conn.execute("SELECT id FROM events").fetchall()}

    def duplicate_keys(self) -> int:
        rows = self.conn.execute(
            "SELECT key, count(*) FROM actions "
            "WHERE state IN ('succeeded', 'escalated', 'logged', 'running') "
            "GROUP BY key HAVING count(*) > 1"
        ).fetchall()
        return len(rows)

    def unfinished(self) -> int:
        sql = "SELECT count(*) FROM actions WHERE state IN ('pending', 'running')"
        row = self.conn.execute(sql).fetchone()
        return int(row[0]) if row else 0


def _effects(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def _resumed(nodes: Nodes, effects: Path, job: str, since: float, pid: int) -> bool:
    """The new leader has gone on with ``job``'s action: a directive of it arrived after ``since``
    (when the new leader took the lease: the old one is dead or frozen by then) -- the save again, or
    the stop when the save had been done -- or the new leader requeued it."""
    if any(t > since for t in nodes.directives.get(job, [])):
        return True
    return any(e["what"] == "requeue" and e["target"] == job and e["pid"] == pid for e in _effects(effects))


async def _until(predicate: Any, timeout: float, what: str, step: float = 0.02) -> float:
    """Wait for ``predicate()``; the monotonic time it became true. TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(step)
    return time.monotonic()


async def _scenario(
    work: Path, jobs: int, gap_s: float, stream_hz: float, fence_watch_s: float
) -> dict[str, Any]:
    from ftd.bus.mqtt import MqttBus

    kill_job, stop_job = jobs // 3, (2 * jobs) // 3
    pg = LocalPostgres(work / "pg").start()
    broker = Broker(work / "broker")
    broker.start()
    effects_path = work / "effects.jsonl"
    replicas = []
    for name in ("coord-a", "coord-b"):
        config = work / f"{name}.toml"
        _config(config, name, broker.port, pg.dsn)
        replicas.append(Replica(name, work, config, effects_path))
    db: _Db | None = None
    bus = MqttBus(host="127.0.0.1", port=broker.port, client_id="bench-nodes", clean_session=True)
    nodes = Nodes(bus, jobs)
    notes: list[str] = []
    result: dict[str, Any] = {}
    pump: asyncio.Task[None] | None = None
    stream: asyncio.Task[None] | None = None
    try:
        a, b = replicas
        a.start()
        db = _Db(pg.dsn) if await _wait_db(pg.dsn) else None
        assert db is not None
        await _until(lambda: db.lease()[0] == "coord-a", 60, "coord-a to lead")
        b.start()
        await _until(lambda: b.count('"ha_standby"') > 0, 60, "coord-b to stand by")
        await _until(lambda: a.count('"bus_connected"') > 0, 60, "coord-a on the bus")
        await nodes.start()
        pump = asyncio.create_task(nodes.pump())
        await asyncio.sleep(1.0)  # the leader has the presence of every job

        async def background() -> None:
            i = 0
            while True:
                await nodes.event(i % jobs, 43, Severity.ERROR)
                i += 1
                await asyncio.sleep(1 / stream_hz)

        stream = asyncio.create_task(background())
        by_name = {r.name: r for r in replicas}
        takeovers: list[dict[str, Any]] = []
        fenced_pid: int | None = None
        frozen_at = 0.0
        for i in range(jobs):
            job = f"job-{i}"
            if i in (kill_job, stop_job):
                nodes.on_save[job] = asyncio.Event()
            await nodes.event(i, 13, Severity.ERROR)
            if i in (kill_job, stop_job):
                async with asyncio.timeout(30):
                    await nodes.on_save[job].wait()
                holder, epoch = db.lease()
                leader = by_name[str(holder)]
                standby = b if leader is a else a
                t0 = time.monotonic()
                if i == kill_job:
                    leader.kill()
                else:
                    leader.signal(signal.SIGSTOP)
                    fenced_pid, frozen_at = leader.pid, time.time()
                t_lease = await _until(
                    lambda e=epoch: db.lease()[1] > e, 4 * TTL_S, "the standby to take over", 0.01
                )
                t_resume = await _until(
                    lambda j=job, s=t_lease, p=standby.pid: _resumed(nodes, effects_path, j, s, p),
                    30,
                    "the resumed action",
                    0.01,
                )
                takeovers.append(
                    {
                        "how": "SIGKILL" if i == kill_job else "SIGSTOP",
                        "takeover_s": round(t_lease - t0, 3),
                        "resume_s": round(t_resume - t0, 3),
                        "new_leader": standby.name,
                    }
                )
                if i == kill_job:
                    leader.start()  # back as the standby
            await asyncio.sleep(gap_s)
        stream.cancel()
        # every job requeued once, then wake the frozen one and watch it
        await _until(
            lambda: len({e["target"] for e in _effects(effects_path) if e["what"] == "requeue"}) >= jobs,
            120,
            "every job requeued",
            0.2,
        )
        await _until(lambda: not nodes.unreceipted, 60, "every event receipted", 0.1)
        frozen = next((r for r in replicas if fenced_pid is not None and r.pid == fenced_pid), None)
        if frozen is not None:
            frozen.signal(signal.SIGCONT)
            await asyncio.sleep(fence_watch_s)
        await asyncio.sleep(0.5)
        records = _effects(effects_path)
        requeues = Counter(e["target"] for e in records if e["what"] == "requeue")
        fenced = [e for e in records if e["pid"] == fenced_pid and e["t"] >= frozen_at]
        lost = nodes.sent - db.event_ids()
        result = {
            "takeover_s": max(t["takeover_s"] for t in takeovers),
            "resume_s": max(t["resume_s"] for t in takeovers),
            "lost_events": len(lost),
            "actions_done_twice": sum(1 for n in requeues.values() if n > 1) + db.duplicate_keys(),
            "actions_missing": jobs - len(requeues),
            "fenced_side_effects": len(fenced),
            "stale_writes_rejected": sum(r.count('"ledger_write_fenced"') for r in replicas),
            "events_sent": len(nodes.sent),
            "events_resent": nodes.resends,
            "jobs": jobs,
            "lease_ttl_s": TTL_S,
            "takeovers": takeovers,
            "unfinished_actions": db.unfinished(),
            "notes": notes,
        }
    finally:
        for task in (stream, pump):
            if task is not None:
                task.cancel()
        with contextlib.suppress(Exception):
            await bus.stop()
        for replica in replicas:
            replica.stop()
        broker.stop()
        if db is not None:
            db.conn.close()
        pg.remove()
    return result


async def _wait_db(dsn: str) -> bool:
    import psycopg

    for _ in range(100):
        try:
            psycopg.connect(dsn).close()
            return True
        except psycopg.Error:
            await asyncio.sleep(0.1)
    return False


def bench_failover(
    jobs: int = 9, gap_s: float = 0.5, stream_hz: float = 50.0, fence_watch_s: float = 3.0
) -> dict[str, Any]:
    keep = os.environ.get("FTD_BENCH_KEEP")  # a directory to leave the logs in (debugging)
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        return asyncio.run(_scenario(Path(keep), jobs, gap_s, stream_hz, fence_watch_s))
    with tempfile.TemporaryDirectory(prefix="ftd-bench-failover-") as tmp:
        return asyncio.run(_scenario(Path(tmp), jobs, gap_s, stream_hz, fence_watch_s))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "coordinator":
        sys.exit(coordinator_main(sys.argv[2], sys.argv[3]))
    print(json.dumps(bench_failover(), sort_keys=True))
