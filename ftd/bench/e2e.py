"""``ftd bench e2e``: an Xid line written to the kernel-log source -> the trainer client sees ``save``.

Everything real except the GPU: a private Mosquitto on loopback, ``ftd agent`` and
``ftd coordinator`` as separate processes with config files, and a real :class:`ftd.client.Client`
in this process. The agent reads a FIFO, which it watches with ``add_reader`` exactly as it watches
the ``/dev/kmsg`` character device.

One sample: a new job registers (a fresh job id each time, so dedupe and cooldown never apply);
once its presence is on the bus, an Xid 13 line (RESTART_APP: checkpoint-and-restart, no drain) is
written to the FIFO, and the latency is the time until the client's I/O thread has the ``save``
directive (both ends use ``time.perf_counter_ns`` in this process). The client then acks, gets
``stop``, and leaves; the next sample starts when the coordinator has seen it go.

``during_collection=True`` (``ftd bench culprit``'s "collection never blocks the coordinator's event
loop", issue #33) measures the same while hang-evidence collections run: a second agent
(``bench-hung``, 1 s heartbeat timeout) on the same broker and coordinator gets a new hung job every
``HUNG_EVERY_S`` (a real process whose client beats once and then sleeps), so the coordinator keeps
starting ``diagnose_hang`` actions (its agent py-spies the process, the coordinator fuses the verdict,
the hang rule restarts the job, which never answers) throughout the samples; ``diagnoses`` counts them.

``pin=True`` splits this host's cores in two, as two hosts would be: the measured stack (this process's
client, the broker, the coordinator and the measured agent) on the first half, the hung node (its
agent, the py-spy it runs, its hung ranks) on the second, so the ratio says what a collection costs the
coordinator's event loop, not what the hung node's CPU work costs a co-located stack (on two cores the
hung ranks' starts alone raised p99 by a fifth). ``cores`` in the result says the split.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ftd.bench.broker import PrivateMosquitto
from ftd.bus import topics
from ftd.bus.mqtt import MqttBus
from ftd.client import Client

NODE = "bench-node"
HUNG_NODE = "bench-hung"
HUNG_EVERY_S = 0.5
#: A hung rank: registers, beats once, then sleeps in the main thread (its client's I/O thread lives on).
HUNG_RANK = (
    "import sys, time\n"
    "from ftd.client import Client\n"
    "c = Client(job=sys.argv[1], rank=0, socket_path=sys.argv[2])\n"
    "deadline = time.monotonic() + 30\n"
    "while not c.connected and time.monotonic() < deadline:\n"
    "    time.sleep(0.05)\n"
    "c.heartbeat(1)\n"
    "time.sleep(3600)\n"
)


def _config(port: int, work: Path, fifo: Path) -> tuple[str, str]:
    common = f'[bus]\nhost = "127.0.0.1"\nport = {port}\n\n[log]\nlevel = "warning"\njson = true\n'
    agent = common + (
        f'\n[agent]\nnode = "{NODE}"\nkmsg_path = "{fifo}"\nstate_dir = "{work}/agent"\n'
        f'socket_path = "{work}/agent.sock"\n'
    )
    coordinator = common + (
        f'\n[coordinator]\nledger_path = "{work}/ledger.sqlite"\nscheduler = "none"\n'
        "save_deadline_s = 5\nstop_deadline_s = 5\n"
        # Every sample is an independent incident on the one simulated node; on a real node the
        # second would (rightly) make it a repeat offender and add a drain to the path measured.
        'disabled_rules = ["repeat_offender"]\n'
        "\n[coordinator.api]\nenabled = false\n"
    )
    return agent, coordinator


def _hung_agent_config(port: int, work: Path) -> str:
    return (
        f'[bus]\nhost = "127.0.0.1"\nport = {port}\n\n[log]\nlevel = "warning"\njson = true\n'
        f'\n[agent]\nnode = "{HUNG_NODE}"\nkmsg_path = "{work}/hung-kmsg"\nstate_dir = "{work}/hung-agent"\n'
        f'socket_path = "{work}/hung.sock"\n'
        "\n[agent.heartbeat]\ntimeout_s = 1.0\ncheck_interval_s = 0.25\n"
    )


def _cores(pin: bool) -> tuple[set[int], set[int]] | None:
    """(the measured stack's cores, the hung node's cores) when ``pin`` and this host has two cores or
    more to split (module docstring); None: nothing is pinned."""
    if not pin or not hasattr(os, "sched_getaffinity"):
        return None
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        return None
    half = max(1, len(mine) // 2)
    return set(mine[:half]), set(mine[half:])


def _pin(pid: int, cores: set[int] | None) -> None:
    if cores is not None:
        with contextlib.suppress(OSError):  # a process already gone keeps its place
            os.sched_setaffinity(pid, cores)


class _Hangs:
    """Starts a new hung rank on ``bench-hung`` every ``HUNG_EVERY_S`` until stopped (module docstring)."""

    def __init__(self, work: Path, cores: set[int] | None = None) -> None:
        self.work = work
        self.cores = cores
        self.procs: list[subprocess.Popen[bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ftd-bench-hangs", daemon=True)

    def __enter__(self) -> _Hangs:
        self._thread.start()
        return self

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            argv = [sys.executable, "-c", HUNG_RANK, f"hung-{i}", str(self.work / "hung.sock")]
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _pin(proc.pid, self.cores)
            self.procs.append(proc)
            i += 1
            self._stop.wait(HUNG_EVERY_S)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait(10)


def _collections(ledger: Path, since: float, until: float) -> list[tuple[float, float]]:
    """The diagnose_hang actions the coordinator ran between ``since`` and ``until`` (wall clock):
    each one's (created, updated)."""
    with contextlib.closing(sqlite3.connect(ledger, timeout=10)) as db:
        rows = db.execute(
            "SELECT created, updated FROM actions WHERE kind = 'diagnose_hang' AND created BETWEEN ? AND ?",
            (since, until),
        ).fetchall()
    return [(float(a), float(b)) for a, b in rows]


def _spawn(role: str, config_text: str, work: Path, name: str = "") -> subprocess.Popen[bytes]:
    path = work / f"{name or role}.toml"
    path.write_text(config_text)
    log = (work / f"{name or role}.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "ftd.cli", role, "--config", str(path)], stdout=log, stderr=log
    )


def open_fifo_writer(fifo: Path, timeout: float = 60.0) -> int:
    """Open the FIFO for writing once the agent has it open for reading."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no reader yet
            if time.monotonic() > deadline:
                raise RuntimeError("the agent never opened its kernel-log FIFO") from None
            time.sleep(0.05)


class _PresenceWatch:
    """Follows the node's retained job presence so a sample starts only when the coordinator can act."""

    def __init__(self, port: int) -> None:
        self.bus = MqttBus(host="127.0.0.1", port=port, client_id="ftd-bench-watch", clean_session=True)
        self.jobs: set[str] = set()
        self.coordinator_online = False
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.bus.subscribe(topics.COORDINATOR_STATUS)
        await self.bus.subscribe(f"{topics.PREFIX}/nodes/{NODE}/jobs/+")
        await self.bus.start()
        self._task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        async for message in self.bus.messages():
            if message.topic == topics.COORDINATOR_STATUS:
                self.coordinator_online = b'"online"' in message.payload
                self._changed.set()
                continue
            job = message.topic.rsplit("/", 1)[1]
            (self.jobs.add if message.payload else self.jobs.discard)(job)
            self._changed.set()

    async def wait_coordinator(self, timeout: float = 20.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.coordinator_online:
            if loop.time() > deadline:
                raise TimeoutError("the coordinator never came online")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await self._changed.wait()

    async def wait(self, job: str, present: bool, timeout: float = 10.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (job in self.jobs) != present:
            self._changed.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"job {job} {'never appeared' if present else 'never left'}")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._changed.wait()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.bus.stop()


async def _measure(
    port: int,
    work: Path,
    fifo_fd: int,
    samples: int,
    warmup: int,
    spans: list[tuple[float, float]] | None = None,
) -> list[float]:
    watch = _PresenceWatch(port)
    await watch.start()
    await watch.wait_coordinator()
    latencies: list[float] = []
    try:
        for i in range(samples + warmup):
            job = f"bench-{i}"
            client = Client(job=job, rank=0, socket_path=str(work / "agent.sock"))
            await watch.wait(job, present=True)
            await asyncio.sleep(0.02)  # the coordinator received the same retained message
            client.heartbeat(1)
            line = (
                # A different GPU each sample: the same Xid on the same GPU within the storm window is a
                # repeat, which the agent (rightly) folds into a later summary instead of sending at once.
                f"[ {1000 + i}.000001] NVRM: Xid (PCI:{i // 256:04x}:{i % 256:02x}:00): 13, pid={10000 + i}, "
                "name=python, "
                "Graphics Exception\n"
            )
            started = time.perf_counter_ns()
            os.write(fifo_fd, line.encode())
            got = await asyncio.to_thread(client.wait, 10)
            directive = client.pending_directive
            if got != "save" or directive is None:
                raise RuntimeError(f"sample {i}: expected a save directive, got {got!r}; see {work}/*.log")
            if i >= warmup:
                latencies.append((directive.received_ns - started) / 1e6)
                if spans is not None:  # the sample's wall-clock span, to match with the collections
                    spans.append((time.time() - latencies[-1] / 1e3, time.time()))
            client.ack_saved(1, None)
            await asyncio.to_thread(client.wait, 10)  # the stop
            client.close()
            await watch.wait(job, present=False)
    finally:
        await watch.stop()
    return latencies


def _percentile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def bench_e2e(
    samples: int = 200, warmup: int = 10, during_collection: bool = False, pin: bool = False
) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    cores = _cores(pin)
    own = os.sched_getaffinity(0) if cores is not None else None
    if cores is not None:
        extra["cores"] = {"measured": sorted(cores[0]), "hung_node": sorted(cores[1])}
        _pin(0, cores[0])  # the measuring client, and the broker and daemons it starts, inherit it
    with tempfile.TemporaryDirectory(prefix="ftd-bench-", dir="/tmp") as tmp, PrivateMosquitto() as broker:
        work = Path(tmp)
        fifo = work / "kmsg.fifo"
        os.mkfifo(fifo)
        agent_conf, coordinator_conf = _config(broker.port, work, fifo)
        procs = [_spawn("coordinator", coordinator_conf, work), _spawn("agent", agent_conf, work)]
        if during_collection:
            (work / "hung-kmsg").touch()
            procs.append(_spawn("agent", _hung_agent_config(broker.port, work), work, "hung-agent"))
            _pin(procs[-1].pid, cores[1] if cores is not None else None)  # its py-spy runs there too
        fd = -1
        try:
            fd = open_fifo_writer(fifo)
            if during_collection:
                with _Hangs(work, cores[1] if cores is not None else None):
                    time.sleep(HUNG_EVERY_S * 2)  # the first collections are under way before sampling
                    since = time.time()
                    spans: list[tuple[float, float]] = []
                    latencies = asyncio.run(_measure(broker.port, work, fd, samples, warmup, spans))
                    ran = _collections(work / "ledger.sqlite", since, time.time())
                    extra["diagnoses"] = len(ran)
                    extra["samples_during_collection"] = sum(
                        1 for a, b in spans if any(a <= end and b >= start for start, end in ran)
                    )
                    extra["hung_every_s"] = HUNG_EVERY_S
            else:
                latencies = asyncio.run(_measure(broker.port, work, fd, samples, warmup))
        finally:
            if fd >= 0:
                os.close(fd)
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
            if own is not None:
                _pin(0, own)
    latencies.sort()
    return {
        "p50_ms": round(statistics.median(latencies), 3),
        "p99_ms": round(_percentile(latencies, 0.99), 3),
        "max_ms": round(latencies[-1], 3),
        "mean_ms": round(statistics.fmean(latencies), 3),
        "samples": len(latencies),
        "broker": "mosquitto (loopback)",
        **extra,
    }
