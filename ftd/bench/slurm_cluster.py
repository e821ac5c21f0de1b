"""A private one-host Slurm 22.05 cluster (slurmctld + slurmd on free ports), for benches and tests.

What: :class:`SlurmCluster` writes a private ``slurm.conf`` under a work directory (state, spool,
pid and log files there too; ``SLURM_CONF`` in :attr:`SlurmCluster.env` for every Slurm command),
starts ``slurmctld`` and one ``slurmd`` (node-1; node-2..N exist without a daemon and can still be
drained and resumed), runs Slurm commands, and stops the daemons by the pids in their pid files,
never by name. Requeues are fast (``sched_interval=1``, ``batch_sched_delay=0``, ``JobRequeue=1``,
``AuthInfo=cred_expire=5``: /work/shared/notes/local-services.md). :mod:`ftd.bench.slurm_multinode`
extends it to a cluster whose every node runs jobs. Also :func:`free_port`, :func:`wait_port`,
:func:`find_binary` (raises :class:`PartMissing` naming the Debian package) and
:func:`ensure_munged` (reuses a working munged, else starts the shared one).

Why in the package: ``ftd bench recovery`` runs real Slurm without the test tree; the tests'
``tests/realparts.py`` subclasses this with its skip-or-fail rule for a missing binary
(:meth:`SlurmCluster.require`), so there is one copy of the cluster.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ftd.coordinator.actions.slurm import parse_oneliner

__all__ = [
    "PartMissing",
    "SlurmCluster",
    "ensure_munged",
    "find_binary",
    "free_port",
    "preemption_conf",
    "wait_port",
]

MUNGE_SOCKET = Path("/run/munge/munge.socket.2")


class PartMissing(RuntimeError):
    """A real part's binary is not installed (the message names the Debian package)."""


def find_binary(name: str, *, package: str) -> str:
    """The path of ``name`` (PATH, /usr/sbin, /usr/bin); :class:`PartMissing` when absent."""
    path = shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.path.exists(p)), None
    )
    if path is None:
        raise PartMissing(f"{name} not found (Debian package {package}); `make test` installs it")
    return path


# Ports handed out below the kernel's ephemeral range (ip_local_port_range, 32768-60999 by default):
# a port the kernel picked for bind(0) and that we released is in that range, where every outgoing
# connection (gloo's, MQTT clients') takes its local port, so it could be gone before the daemon or the
# rank told to listen on it binds it (seen: torch's rendezvous failing with EADDRINUSE while another
# test's DDP job ran). Below the range only another free_port() caller can take it: a random pick makes
# that a 1-in-12,000 chance per pair of callers.
_PORTS_FROM, _PORTS_TO = 20000, 32768


def free_port() -> int:
    """A TCP port nothing listens on now, outside the ephemeral range (see above)."""
    for _ in range(200):
        port = random.randrange(_PORTS_FROM, _PORTS_TO)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port in {_PORTS_FROM}-{_PORTS_TO - 1} after 200 tries")


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


def _munge_works() -> bool:
    munge, unmunge = shutil.which("munge"), shutil.which("unmunge")
    if munge is None or unmunge is None or not MUNGE_SOCKET.exists():
        return False
    cred = subprocess.run([munge, "-n"], capture_output=True, timeout=10)
    if cred.returncode != 0:
        return False
    return subprocess.run([unmunge], input=cred.stdout, capture_output=True, timeout=10).returncode == 0


def ensure_munged(require: Callable[..., str] = find_binary) -> None:
    """Reuse a running munged; otherwise start one (it daemonizes and is left running: it is shared)."""
    if _munge_works():
        return
    munged = require("munged", package="munge")
    run_dir = MUNGE_SOCKET.parent
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.chown(run_dir, "munge", "munge")
    subprocess.run([munged, "--force"], check=True, capture_output=True, timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if _munge_works():
            return
        time.sleep(0.1)
    raise RuntimeError("munged started but munge -n | unmunge still fails")


def preemption_conf(grace_s: int = 20) -> list[str]:
    """slurm.conf lines (a :class:`SlurmCluster`'s ``extra_conf``, not the default) for real
    preemption on node-1: partition ``low`` (PriorityTier 1, requeued after ``grace_s`` of GraceTime)
    is preempted by partition ``high`` (PriorityTier 10). Checked on Slurm 22.05: the preempted job
    stays RUNNING with ``PreemptTime`` set and ``EndTime`` = PreemptTime + GraceTime."""
    return [
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        f"PartitionName=low Nodes=node-1 PriorityTier=1 PreemptMode=REQUEUE GraceTime={grace_s} "
        "MaxTime=INFINITE State=UP",
        "PartitionName=high Nodes=node-1 PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP",
    ]


@dataclass
class SlurmCluster:
    """A private one-host Slurm 22.05 cluster: node-1 runs jobs; node-2..N exist without a daemon.

    Everything (config, state, spool, logs, pids) lives under ``workdir``; the daemons listen on free
    ports, so several clusters (or a system one) do not collide. Every Slurm command must run with
    :attr:`env` (``SLURM_CONF`` points at the private config).
    """

    workdir: Path
    nodes: int = 4
    ctld_port: int = 0
    slurmd_port: int = 0
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    extra_conf: list[str] = field(default_factory=list)  # lines appended to slurm.conf (Prolog=...)

    def require(self, name: str, *, package: str) -> str:
        """The path of a Slurm binary (tests override this: skip locally, fail in CI)."""
        return find_binary(name, package=package)

    @property
    def conf_path(self) -> Path:
        return self.workdir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf_path)}

    @property
    def node_names(self) -> list[str]:
        return [f"node-{i}" for i in range(1, self.nodes + 1)]

    def _pid_file(self, daemon: str) -> Path:
        return self.workdir / f"{daemon}.pid"

    def _log_file(self, daemon: str) -> Path:
        return self.workdir / f"{daemon}.log"

    def write_conf(self) -> None:
        w = self.workdir
        for sub in ("state", "spool", "jobs"):
            (w / sub).mkdir(parents=True, exist_ok=True)
        host = socket.gethostname().split(".")[0]
        lines = [
            # one name per cluster on this host: job ids are per cluster, and tests run several
            f"ClusterName=ftd{self.ctld_port}",
            f"SlurmctldHost={host}(127.0.0.1)",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "AuthType=auth/munge",
            # A requeued job may start again only after the credential lifetime (default 120 s).
            "AuthInfo=cred_expire=5",
            "CryptoType=crypto/munge",
            f"StateSaveLocation={w}/state",
            f"SlurmdSpoolDir={w}/spool/%n",
            f"SlurmctldPidFile={self._pid_file('slurmctld')}",
            f"SlurmdPidFile={self._pid_file('slurmd')}",
            f"SlurmctldLogFile={self._log_file('slurmctld')}",
            f"SlurmdLogFile={self._log_file('slurmd')}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin",
            # Consider pending (requeued) jobs quickly instead of at the default 60 s cadence.
            "SchedulerParameters=sched_interval=1,sched_min_interval=100000,batch_sched_delay=0",
            "ReturnToService=2",
            "MinJobAge=3600",
            "KillWait=2",
            "InactiveLimit=0",
            "SlurmdTimeout=300",
            "SlurmctldTimeout=60",
            "Waittime=0",
            "JobRequeue=1",
            f"NodeName=node-[1-{self.nodes}] NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=1 "
            "RealMemory=100 State=UNKNOWN",
            # Only node-1 has a slurmd. The others answer pings through it (same address and port),
            # so they may look idle: keep them out of the default partition or a job excluded from
            # node-1 would "start" on them. They can still be drained and resumed.
            "PartitionName=debug Nodes=node-1 Default=YES MaxTime=INFINITE State=UP",
        ]
        if self.nodes > 1:
            lines.append(f"PartitionName=spare Nodes=node-[2-{self.nodes}] MaxTime=INFINITE State=UP")
        lines.extend(self.extra_conf)
        self.conf_path.write_text("\n".join(lines) + "\n")

    def start(self, timeout: float = 30.0) -> SlurmCluster:
        slurmctld = self.require("slurmctld", package="slurmctld")
        slurmd = self.require("slurmd", package="slurmd")
        for tool in ("scontrol", "sinfo", "sbatch", "squeue", "scancel"):
            self.require(tool, package="slurm-client")
        ensure_munged(self.require)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ctld_port = self.ctld_port or free_port()
        self.slurmd_port = self.slurmd_port or free_port()
        self.write_conf()
        try:
            self._spawn("slurmctld", [slurmctld, "-D", "-c", "-f", str(self.conf_path)])
            wait_port(self.ctld_port, timeout)
            self._spawn("slurmd", [slurmd, "-D", "-N", "node-1", "-f", str(self.conf_path)])
            self.wait_node_state("node-1", "IDLE", timeout)
        except Exception:
            logs = self.logs()
            self.stop()
            raise RuntimeError(f"slurm did not start:\n{logs}") from None
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.workdir / f"{name}.stdout").open("ab")
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )

    def logs(self, tail: int = 3000) -> str:
        parts = []
        for name in ("slurmctld", "slurmd"):
            for path in (self._log_file(name), self.workdir / f"{name}.stdout"):
                if path.exists():
                    parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    # -- commands ---------------------------------------------------------------------------------

    def run(self, *args: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{args!r} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def sbatch(self, script: str | None = None, *extra: str, wrap: str | None = None) -> str:
        """Submit a batch job (script text, or ``wrap=`` a command line); return its job id."""
        argv = [
            "sbatch",
            "--parsable",
            f"--chdir={self.workdir / 'jobs'}",
            f"--output={self.workdir / 'jobs'}/%j.out",
            *extra,
        ]
        if wrap is not None:
            argv += ["--wrap", wrap]
            proc = self.run(*argv)
        else:
            if script is None:
                raise ValueError("give a script or wrap=")
            proc = subprocess.run(
                argv, env=self.env, input=script, capture_output=True, text=True, timeout=30
            )
            if proc.returncode != 0:
                raise RuntimeError(f"sbatch exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        return parse_oneliner(self.run("scontrol", "show", "job", "-o", job_id).stdout)

    def node(self, name: str) -> dict[str, str]:
        return parse_oneliner(self.run("scontrol", "show", "node", "-o", name).stdout)

    def wait_node_state(self, name: str, state: str, timeout: float = 30.0) -> dict[str, str]:
        """Wait until ``State`` of the node starts with ``state`` (e.g. ``IDLE``, ``IDLE+DRAIN``)."""
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            for daemon, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{daemon} exited with {proc.returncode}")
            got = self.run("scontrol", "show", "node", "-o", name, check=False)
            if got.returncode == 0:
                info = parse_oneliner(got.stdout)
                if info.get("State", "").split("+")[0] == state or info.get("State") == state:
                    return info
            time.sleep(0.1)
        raise TimeoutError(f"{name} not {state} after {timeout}s: {info.get('State')}")

    def wait_job_state(self, job_id: str, state: str, timeout: float = 90.0) -> dict[str, str]:
        # 90 s: a fresh cluster's slurmd registering and the first schedule took over 30 s at load 9
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") == state:
                return info
            time.sleep(0.1)
        raise TimeoutError(f"job {job_id} not {state} after {timeout}s: {info.get('JobState')}")

    def job_ids(self) -> list[str]:
        return self.run("squeue", "-h", "-o", "%i", check=False, timeout=10).stdout.split()

    def cancel_all(self, timeout: float = 15.0) -> None:
        """Cancel every job and wait (up to ``timeout``) until squeue lists none."""
        ids = self.job_ids()
        if not ids:
            return
        self.run("scancel", *ids, check=False, timeout=10)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.job_ids():
            time.sleep(0.1)

    def resume_all(self) -> None:
        """Resume every node drained or failed (by ftd or a test)."""
        for name in self.node_names:
            state = self.node(name).get("State", "")
            if "DRAIN" in state or "FAIL" in state:
                self.run("scontrol", "update", f"nodename={name}", "state=resume", check=False)

    def reset(self) -> None:
        """Between tests: cancel every job, resume every node ftd-style tests may have drained."""
        self.cancel_all()
        self.resume_all()
        self.wait_node_state("node-1", "IDLE", 15)

    def _daemon_pid_files(self) -> dict[str, Path]:
        """Each daemon this cluster started -> its pid file, the order to stop them in."""
        return {"slurmd": self._pid_file("slurmd"), "slurmctld": self._pid_file("slurmctld")}

    def stop(self) -> None:
        """Cancel jobs (so slurmd sees its steps end: no orphaned slurmstepd), then stop every daemon
        by the pid in its pid file (and the one this object spawned)."""
        ctld = self.procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            self.cancel_all()
        for name, pid_file in self._daemon_pid_files().items():
            proc = self.procs.pop(name, None)
            pids: set[int] = set()
            with contextlib.suppress(OSError, ValueError, IndexError):
                pids.add(int(pid_file.read_text().split()[0]))
            if proc is not None and proc.poll() is None:
                pids.add(proc.pid)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            if proc is not None:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
