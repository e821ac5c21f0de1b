"""``ftd bench chaos``: kill the broker, the coordinator or the agent mid-stream and count what is lost.

Every scenario runs the real parts: a private Mosquitto (persistence on, the default autosave: what
it held only in memory is gone after SIGKILL, as in production), ``ftd coordinator`` and ``ftd
agent`` as separate processes. The agent reads a kernel-log file; each written line is an Xid 43 (no
rule acts on it): a distinct one (a different GPU each time, so storm control folds nothing), or in
``agent_kill_mid_storm`` the same one over and over (a storm: storm control publishes the first and
folds the repeats into summaries whose ``count`` is the number of repeats). ``sent`` is the number of
lines written, ``recorded`` the sum of ``count`` over the distinct events in the coordinator's ledger
at the end (with distinct lines, every event has count 1: the number of events),
``lost = sent - recorded`` (negative: counted twice). ``duplicated_actions`` counts action keys that
ran to completion more than once (the ledger's records of started actions, grouped by key).

Scenarios (each a function of a :class:`Rig`, also run by ``tests/chaos``):

* ``broker_kill_backlog``: the coordinator is away, the broker acknowledged a backlog for its
  session, then the broker is SIGKILLed; broker and coordinator come back.
* ``broker_kill_before_session``: events published before the coordinator ever connected (the
  broker has no session to queue them for), broker SIGKILLed, then the coordinator starts.
* ``coordinator_kill_mid_burst``: SIGKILL of the coordinator while it works through a burst.
* ``coordinator_kill_at_startup``: SIGKILL in the coordinator's first 0.3 s; then a start while the
  broker is still down (it must wait, not exit).
* ``broker_sigstop``: the broker frozen (SIGSTOP) for longer than the keepalive, then SIGCONT.
* ``agent_kill_mid_storm``: Xid storms, and the agent SIGKILLed while repeats are read and counted
  but not yet published (after reading 41 lines; while reading 20,000; right after; once the window
  moved on), restarted each time (storm window 2 s, to keep it short).

Result (``--json``): ``{"events": N, "lost": L, "duplicated_actions": D, "scenarios": [...]}``.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftd.bench.slurm_cluster import free_port


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


class Broker:
    """A Mosquitto that can be SIGKILLed, frozen and started again on the same port and directory."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        if not Path(binary).exists():
            raise RuntimeError(
                "mosquitto not found: install the Debian package `mosquitto` (make real-parts)"
            )
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "mosquitto.conf").write_text(
            "\n".join(
                [
                    f"listener {self.port} 127.0.0.1",
                    "allow_anonymous true",
                    "persistence true",
                    f"persistence_location {workdir}/",
                    "user root",  # started as root it would drop to `mosquitto` and not save its DB
                    "set_tcp_nodelay true",
                    "max_queued_messages 0",
                    "log_dest none",
                ]
            )
            + "\n"
        )

    def start(self) -> None:
        self.proc = subprocess.Popen([self.binary, "-c", str(self.workdir / "mosquitto.conf")])

        def up() -> bool:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return True
            except OSError:
                return False

        _wait(up, 10, "mosquitto to listen")

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                self.proc.wait(10)
                self.proc = None

    def stop(self) -> None:
        self.signal(signal.SIGKILL if self.proc is not None and self.proc.poll() is None else signal.SIGTERM)


@dataclass
class Daemon:
    role: str  # "agent" | "coordinator"
    config: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ftd.cli", self.role, "--config", str(self.config)],
                stdout=out,
                stderr=out,
            )

    def logged(self, needle: str) -> bool:
        return needle in self.log.read_text(errors="replace") if self.log.exists() else False

    def starts(self) -> int:
        """How many runs of the agent logged their start so far (the log is appended to)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text.count('"agent_started"')

    def kill(self, sig: int = signal.SIGKILL) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code, self.proc = self.proc.returncode, None
        return code

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Rig:
    """Broker, coordinator and one agent on private ports and files; ``write`` feeds the kernel log."""

    workdir: Path
    node: str = "chaos-node"
    written: int = 0
    notes: list[str] = field(default_factory=list)
    storm_window_s: float | None = None  # the agent's storm window (None: its default)

    def __post_init__(self) -> None:
        self.broker = Broker(self.workdir / "broker")
        self.kmsg = self.workdir / "kmsg.log"
        self.kmsg.touch()
        self.ledger = self.workdir / "ledger.sqlite"
        bus = (
            f'[bus]\nhost = "127.0.0.1"\nport = {self.broker.port}\nkeepalive_s = 2\nreconnect_max_s = 0.5\n'
        )
        run = Path(tempfile.mkdtemp(prefix="ftd-chaos-", dir="/tmp"))  # unix socket paths must be short
        agent_cfg = self.workdir / "agent.toml"
        storm = "" if self.storm_window_s is None else f"\n[agent.storm]\nwindow_s = {self.storm_window_s}\n"
        agent_cfg.write_text(
            f'{bus}\n[agent]\nnode = "{self.node}"\nkmsg_path = "{self.kmsg}"\nkmsg_from_start = true\n'
            f'state_dir = "{self.workdir / "agent-state"}"\nsocket_path = "{run}/a.sock"\n{storm}'
            '\n[log]\nlevel = "info"\njson = true\n'
        )
        coord_cfg = self.workdir / "coordinator.toml"
        coord_cfg.write_text(
            f'{bus}\n[coordinator]\nledger_path = "{self.ledger}"\nscheduler = "none"\n'
            '\n[coordinator.api]\nenabled = false\n\n[log]\nlevel = "info"\njson = true\n'
        )
        self.agent = Daemon("agent", agent_cfg, self.workdir / "agent.log")
        self.coordinator = Daemon("coordinator", coord_cfg, self.workdir / "coordinator.log")

    # --- inputs and counts -----------------------------------------------------------------------

    def write(self, count: int) -> None:
        """Append ``count`` distinct Xid 43 lines (a distinct GPU each: storm control folds none)."""
        lines = []
        for i in range(self.written, self.written + count):
            bus, dev = 16 + i % 200, (i // 200) % 32
            lines.append(f"NVRM: Xid (PCI:0000:{bus:02x}:{dev:02x}): 43, pid={1000 + i}, name=chaos, n{i}\n")
        with self.kmsg.open("a") as handle:
            handle.write("".join(lines))
        self.written += count

    def write_storm(self, count: int) -> None:
        """Append ``count`` identical Xid 43 lines (one GPU, outside ``write``'s; only the kernel
        timestamp moves): storm control publishes the first and folds the rest into summaries."""
        lines = "".join(
            f"[{1000 + i / 1000:12.6f}] NVRM: Xid (PCI:0000:ee:00): 43, pid=4242, name=chaos, storm\n"
            for i in range(self.written, self.written + count)
        )
        with self.kmsg.open("a") as handle:
            handle.write(lines)
        self.written += count

    def recorded(self) -> int:
        """The summed ``count`` of the Xid events in the ledger (each distinct id once)."""
        if not self.ledger.exists():
            return 0
        try:
            with sqlite3.connect(f"file:{self.ledger}?mode=ro", uri=True, timeout=5) as db:
                row = db.execute(
                    "SELECT coalesce(sum(coalesce(json_extract(body, '$.count'), 1)), 0) FROM events "
                    "WHERE kind = 'xid'"
                ).fetchone()
        except sqlite3.Error:
            return 0
        return int(row[0])

    def agent_read_all(self) -> bool:
        """The agent's saved kernel-log position is at the end of the file: it has read every line."""
        try:
            position = json.loads((self.workdir / "agent-state" / "kmsg.position").read_text())
        except (OSError, ValueError):
            return False
        return isinstance(position, dict) and position.get("offset") == self.kmsg.stat().st_size

    def restart_agent(self, sig: int = signal.SIGKILL) -> None:
        """Kill the agent with ``sig`` and start it again (waiting for this run's start in its log)."""
        self.agent.kill(sig)
        started = self.agent.starts()
        self.agent.start()
        _wait(lambda: self.agent.starts() > started, 30, "the agent to start again")

    def duplicated_actions(self) -> int:
        if not self.ledger.exists():
            return 0
        with sqlite3.connect(f"file:{self.ledger}?mode=ro", uri=True, timeout=5) as db:
            rows = db.execute(
                "SELECT key, count(*) FROM actions "
                "WHERE state IN ('succeeded', 'escalated', 'logged', 'running') "
                "GROUP BY key HAVING count(*) > 1"
            ).fetchall()
        return len(rows)

    def wait_recorded(self, count: int, timeout: float = 60.0) -> None:
        _wait(
            lambda: self.recorded() >= count,
            timeout,
            f"{count} events in the ledger (have {self.recorded()})",
        )

    def wait_ready(self, daemon: Daemon, timeout: float = 30.0) -> None:
        if daemon.role == "agent":
            _wait(lambda: daemon.starts() > 0, timeout, "agent to start")
        else:
            _wait(lambda: daemon.logged("bus_connected"), timeout, "coordinator to start")

    def start_all(self) -> None:
        self.broker.start()
        self.coordinator.start()
        self.wait_ready(self.coordinator)
        self.agent.start()
        self.wait_ready(self.agent)

    def settle(self, timeout: float = 60.0) -> None:
        """Wait until every written event is in the ledger (or the timeout: then it is counted lost)."""
        try:
            self.wait_recorded(self.written, timeout)
        except TimeoutError as exc:
            self.notes.append(str(exc))
        time.sleep(0.5)  # late duplicates must not add anything

    def close(self) -> None:
        self.agent.kill(signal.SIGTERM)
        self.coordinator.kill(signal.SIGTERM)
        self.broker.stop()

    def result(self, name: str, started: float) -> dict[str, Any]:
        recorded = self.recorded()
        return {
            "scenario": name,
            "sent": self.written,
            "recorded": recorded,
            "lost": self.written - recorded,
            "duplicated_actions": self.duplicated_actions(),
            "seconds": round(time.monotonic() - started, 2),
            "notes": self.notes,
        }


# --- scenarios ---------------------------------------------------------------------------------


def broker_kill_backlog(rig: Rig, events: int = 300) -> None:
    rig.start_all()
    rig.write(20)
    rig.wait_recorded(20)
    rig.coordinator.kill(signal.SIGTERM)  # clean stop: its persistent session waits in the broker
    rig.write(events)
    time.sleep(2.0)  # the agent publishes the backlog; the broker acknowledges and queues it
    rig.broker.signal(signal.SIGKILL)  # ... and loses it: nothing was autosaved
    rig.broker.start()
    rig.coordinator.start()


def broker_kill_before_session(rig: Rig, events: int = 300) -> None:
    rig.broker.start()
    rig.agent.start()
    rig.wait_ready(rig.agent)
    rig.write(events)  # no coordinator has ever subscribed: the broker queues nothing
    time.sleep(2.0)
    rig.broker.signal(signal.SIGKILL)
    rig.broker.start()
    rig.coordinator.start()


def coordinator_kill_mid_burst(rig: Rig, events: int = 600) -> None:
    rig.start_all()
    rig.write(events)
    _wait(lambda: rig.recorded() >= events // 4, 60, "a quarter of the burst in the ledger")
    rig.coordinator.kill(signal.SIGKILL)
    rig.write(events // 3)  # more while it is down
    rig.coordinator.start()


def coordinator_kill_at_startup(rig: Rig, events: int = 100) -> None:
    rig.broker.start()
    rig.agent.start()
    rig.wait_ready(rig.agent)
    rig.write(events)
    rig.coordinator.start()
    time.sleep(0.3)
    rig.coordinator.kill(signal.SIGKILL)
    rig.broker.signal(signal.SIGTERM)  # the next start finds no broker ...
    rig.coordinator.start()
    time.sleep(1.5)
    if not rig.coordinator.alive:
        rig.notes.append("coordinator exited while the broker was down")
    rig.broker.start()  # ... until it comes back
    rig.write(events)


def broker_sigstop(rig: Rig, events: int = 200) -> None:
    rig.start_all()
    rig.write(events)
    rig.broker.signal(signal.SIGSTOP)
    rig.write(events)
    time.sleep(5.0)  # past the 2 s keepalive: both clients give up on the frozen broker
    rig.broker.signal(signal.SIGCONT)


def agent_kill_mid_storm(rig: Rig, lines: int = 20_000) -> None:
    rig.start_all()
    rig.write_storm(41)
    rig.wait_recorded(1)  # the first occurrence went out at once ...
    _wait(rig.agent_read_all, 30, "the agent to read the storm")
    rig.restart_agent()  # ... the 40 repeats were read and counted, not yet published
    for count, kill_after_s in ((lines, 0.0), (lines, 0.05), (5, 0.3), (3, 2.5)):
        rig.write_storm(count)
        time.sleep(kill_after_s)  # while reading, right after, repeats pending, the window moved on
        rig.restart_agent()


SCENARIOS: dict[str, Callable[[Rig], None]] = {
    "broker_kill_backlog": broker_kill_backlog,
    "broker_kill_before_session": broker_kill_before_session,
    "coordinator_kill_mid_burst": coordinator_kill_mid_burst,
    "coordinator_kill_at_startup": coordinator_kill_at_startup,
    "broker_sigstop": broker_sigstop,
    "agent_kill_mid_storm": agent_kill_mid_storm,
}
_RIG_OPTIONS: dict[str, dict[str, Any]] = {"agent_kill_mid_storm": {"storm_window_s": 2.0}}


def run_scenario(name: str, workdir: Path) -> dict[str, Any]:
    rig = Rig(workdir, **_RIG_OPTIONS.get(name, {}))
    started = time.monotonic()
    try:
        SCENARIOS[name](rig)
        rig.settle()
        if not rig.coordinator.alive:
            rig.notes.append("coordinator not running at the end")
        return rig.result(name, started)
    finally:
        rig.close()


def bench_chaos(scenarios: list[str] | None = None) -> dict[str, Any]:
    names = scenarios or list(SCENARIOS)
    results = []
    with tempfile.TemporaryDirectory(prefix="ftd-bench-chaos-") as tmp:
        for name in names:
            results.append(run_scenario(name, Path(tmp) / name))
    return {
        "events": sum(r["sent"] for r in results),
        "lost": sum(r["lost"] for r in results),
        "duplicated_actions": sum(r["duplicated_actions"] for r in results),
        "scenarios": results,
    }
