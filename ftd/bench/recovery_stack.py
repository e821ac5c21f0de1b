"""The real-parts stack of ``ftd bench recovery`` and the recovery tests: per-node agents, a
coordinator with the Slurm scheduler, and the ``ftd run`` DDP job with hot spares.

What: :func:`recovery_stack` (a context manager) starts, on a running Mosquitto (its port) and a
running :class:`~ftd.bench.slurm_multinode.MultiNodeSlurm`, one ``ftd agent`` per Slurm node (each
reads its own kernel-log file, from the start, and listens at ``<run_dir>/<node>/agent.sock``: every
node's ``agent.socket_path`` is the same pattern, so the job finds its node's agent from
``$SLURMD_NODENAME``) and ``ftd coordinator`` (``scheduler = "slurm"``, sqlite ledger, API on a
free loopback port), and yields a :class:`RecoveryStack`: what the bench and tests do (a kernel-log
line on a node, ``sbatch`` of :mod:`ftd.bench.recovery_trainer` under ``ftd run`` with spares, a
coordinator SIGKILL and restart, ``ftd status``) and read (the trainers' JSON lines, the ledger's
actions and events). On exit every daemon is stopped and the job cancelled.

Why in the package: ``ftd bench recovery`` runs it without the test tree; the e2e test drives the
same stack (one copy of how the parts are wired).
"""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftd.bench import recovery_trainer
from ftd.bench.daemon import Daemon
from ftd.bench.slurm_cluster import free_port
from ftd.bench.slurm_multinode import MultiNodeSlurm

__all__ = ["JobSpec", "RecoveryStack", "recovery_stack", "wait_for"]

FTD = [sys.executable, "-m", "ftd.cli"]
#: torchrun's restarts need this (pytorch/pytorch#135712): by default the workers share the
#: rendezvous' TCPStore, and a restarted round read the killed round's gloo addresses from it (every
#: worker failed connecting to dead ports and restarted again, until --max-restarts ran out; torch
#: 2.13 here, reproduced with three plain torchrun processes on one host, no Slurm). Users of
#: --max-restarts set it; the peer is measured as it works, not as it hangs.
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
#: The peers' launchers (JobSpec.launcher -> the module run with ``python -m``).
ELASTIC_LAUNCHERS = {
    "torchrun": "torch.distributed.run",
    "ft_launcher": "nvidia_resiliency_ext.fault_tolerance.launcher",
}
#: The spares' check: ``ftd preflight`` as installed, passing on a node without GPUs (every GPU check
#: is unchecked there, allowed); the two checks that only import torch to find no CUDA are skipped.
PREFLIGHT = shlex.join(
    [*FTD, "preflight", "--allow-unchecked", "--skip", "gpu_compute", "--skip", "nccl_allreduce"]
)


def wait_for(predicate: Callable[[], object], timeout: float, what: str, poll: float = 0.1) -> None:
    """Until ``predicate()`` is truthy; TimeoutError naming ``what`` after ``timeout`` seconds.
    An exception inside the predicate counts as not yet (files being written, a daemon restarting)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            if predicate():
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


@dataclass(frozen=True)
class JobSpec:
    """One ``sbatch -N nodes+spares`` of the trainer under ``ftd run`` (see :meth:`RecoveryStack.submit`)."""

    name: str = "ftd-recovery"
    nodes: int = 3
    spares: int = 1
    preflight: str = PREFLIGHT
    # The trainer's imports; torch._dynamo too: the first optimizer built imports it (0.8 s here).
    warm: str = "torch,torch.distributed,torch.nn.parallel,torch._dynamo"
    step_s: float = 0.1
    stop_grace_s: float = 5.0
    exit_grace_s: float = 120.0
    # srun --wait (None: not given, the documented recipe): with it, srun ends the step's other tasks
    # this long after the first one ended -- a killed supervisor would end the recovered job too.
    srun_wait_s: int | None = None
    env: dict[str, str] = field(default_factory=dict)  # more variables for every node's supervisor
    # "ftd": every node runs ``ftd run`` (spares, warm interpreters: the fields above); "torchrun":
    # the restart most users have today instead, ``torchrun --max-restarts`` on every training node
    # (c10d rendezvous on node-1's loopback, no ftd in the job: its ranks have no agent socket);
    # "ft_launcher": nvidia-resiliency-ext's launcher (torchrun's options, its own restart logic).
    launcher: str = "ftd"
    max_restarts: int = 3
    time_limit_min: int | None = None  # sbatch --time (None: the partition's, unlimited here)


@dataclass
class RecoveryStack:
    slurm: MultiNodeSlurm
    broker_port: int
    workdir: Path
    run_dir: Path  # <run_dir>/<node>/agent.sock: every node's agent.socket_path (short: unix sockets)
    agents: dict[str, Daemon]
    coordinator: Daemon
    kmsg: dict[str, Path]
    ledger: Path
    api_port: int
    out: Path  # the trainers' JSON lines and checkpoints ($FTD_RECOVERY_DIR)

    # -- what is done --------------------------------------------------------------------------

    def kernel(self, node: str, line: str) -> float:
        """Append a kernel-log line on ``node``; the wall-clock time it was written."""
        with self.kmsg[node].open("a") as f:
            at = time.time()
            f.write(line + "\n")
        return at

    def submit(self, spec: JobSpec) -> str:
        """``sbatch --requeue -N nodes+spares``: one ``ftd run`` per node (``srun
        --kill-on-bad-exit=0``, operators.md's recipe) with the trainer as its command, or one
        ``torchrun`` per node (``spec.launcher``); returns the job id."""
        if spec.launcher not in ("ftd", *ELASTIC_LAUNCHERS):
            raise ValueError(f"unknown launcher {spec.launcher!r}: ftd, {', '.join(ELASTIC_LAUNCHERS)}")
        total = spec.nodes + spec.spares
        launch = self._ftd_run(spec) if spec.launcher == "ftd" else self._torchrun(spec)
        node_script = self.workdir / f"node-{spec.name}-{time.monotonic_ns()}.sh"
        socket = (
            f"{self.run_dir}/$SLURMD_NODENAME/agent.sock"
            if spec.launcher == "ftd"
            else f"{self.run_dir}/none.sock"
        )
        node_script.write_text(
            "#!/bin/bash\n"
            # Every node's agent listens at the same agent.socket_path (here: one directory per node).
            f'export FTD_SOCKET="{socket}"\n'
            f"exec {shlex.join(launch)}\n"
        )
        exports = {
            "FTD_RECOVERY_DIR": str(self.out),
            "FTD_RECOVERY_STEP_S": str(spec.step_s),
            "OMP_NUM_THREADS": "1",
            **(TORCHRUN_ENV if spec.launcher != "ftd" else {}),
            **spec.env,
        }
        wait = f"--wait={spec.srun_wait_s} " if spec.srun_wait_s is not None else ""
        script = "\n".join(
            [
                "#!/bin/bash",
                *(f"export {k}={shlex.quote(v)}" for k, v in exports.items()),
                f"srun {wait}--kill-on-bad-exit=0 --ntasks-per-node=1 bash {node_script}",
                "",
            ]
        )
        limit = [f"--time={spec.time_limit_min}"] if spec.time_limit_min is not None else []
        return self.slurm.sbatch(
            script, "--requeue", f"--nodes={total}", "--ntasks-per-node=1", f"--job-name={spec.name}", *limit
        )

    def _torchrun(self, spec: JobSpec) -> list[str]:
        """Each node's ``torchrun`` (or nvidia-resiliency-ext's launcher, which takes the same
        options): ``spec.nodes`` nodes of one rank, ``--max-restarts``, c10d rendezvous (every node
        is this host: the first to bind the endpoint serves it)."""
        return [
            sys.executable, "-m", ELASTIC_LAUNCHERS[spec.launcher],
            "--nnodes", str(spec.nodes),
            "--nproc-per-node", "1",
            "--max-restarts", str(spec.max_restarts),
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
            "--rdzv-id", f"{spec.name}-{time.monotonic_ns()}",
            "--local-addr", "127.0.0.1",
            recovery_trainer.__file__,
        ]  # fmt: skip

    def _ftd_run(self, spec: JobSpec) -> list[str]:
        ftd_run = [
            *FTD,
            "run",
            "--nodes", str(spec.nodes),
            "--spares", str(spec.spares),
            "--master-addr", "127.0.0.1",
            "--addr", "127.0.0.1",
            "--master-port", str(free_port()),
            "--preflight", spec.preflight,
            "--stop-grace", str(spec.stop_grace_s),
            "--exit-grace", str(spec.exit_grace_s),
        ]  # fmt: skip
        if spec.warm:
            ftd_run += ["--warm", spec.warm]
        return [*ftd_run, "--", sys.executable, recovery_trainer.__file__]

    def restart_coordinator(self, sig: int = signal.SIGKILL) -> None:
        """Kill the coordinator (SIGKILL: a crash) and start it again on the same ledger."""
        self.coordinator.stop(sig)
        mark = len(self.coordinator.log())
        self.coordinator.start()
        self.coordinator.wait_log("bus_connected", 60, after=mark)

    def ftd(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """An ``ftd`` command against this coordinator's API (``--url`` added for status/actions)."""
        argv = [*FTD, *args]
        if args and args[0] in ("status", "actions"):
            argv += ["--url", f"http://127.0.0.1:{self.api_port}"]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self.slurm.env)

    # -- what is read --------------------------------------------------------------------------

    def api(self, path: str) -> Any:
        """GET ``path`` (``/v1/jobs``...) from the coordinator's API, decoded."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}{path}", timeout=10) as answer:
            return json.loads(answer.read())

    def coordinator_job(self, job: str) -> dict[str, Any] | None:
        """The job as the coordinator's API shows it (``/v1/jobs``), or None."""
        return next((j for j in self.api("/v1/jobs") if j.get("id") == job), None)

    def records(self, job: str, what: str | None = None) -> list[dict[str, Any]]:
        """The trainers' JSON lines of ``job`` (every process), in time order."""
        out: list[dict[str, Any]] = []
        for path in (self.out / "log").glob(f"{job}-g*.jsonl"):
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if what is None or record.get("what") == what:
                        out.append(record)
        return sorted(out, key=lambda r: float(r["t"]))

    def restart_action(self, job: str) -> dict[str, Any]:
        """The job's one checkpoint_restart that ran (a later duplicate a rule asked for is suppressed);
        ValueError while there is none, or more than one."""
        ran = [
            a
            for a in self.actions()
            if a["kind"] == "checkpoint_restart" and a["target"] == job and a["state"] != "suppressed"
        ]
        if len(ran) != 1:
            raise ValueError(f"{len(ran)} checkpoint_restart actions of job {job}: {ran}")
        return ran[0]

    def actions(self) -> list[dict[str, Any]]:
        """Every action in the ledger (kind, target, state, request, detail, created, updated)."""
        with contextlib.closing(sqlite3.connect(self.ledger, timeout=10)) as db:
            rows = db.execute(
                "SELECT id, kind, target, state, request, detail, created, updated FROM actions "
                "ORDER BY created"
            ).fetchall()
        return [
            {
                "id": id_,
                "kind": kind,
                "target": target,
                "state": state,
                "request": json.loads(request),
                "detail": json.loads(detail) if detail else {},
                "created": created,
                "updated": updated,
            }
            for id_, kind, target, state, request, detail, created, updated in rows
        ]

    def action(self, kind: str, target: str) -> dict[str, Any] | None:
        """The newest action of ``kind`` on ``target``, or None."""
        found = [a for a in self.actions() if a["kind"] == kind and a["target"] == target]
        return found[-1] if found else None

    def events(self, kind: str) -> list[dict[str, Any]]:
        with contextlib.closing(sqlite3.connect(self.ledger, timeout=10)) as db:
            rows = db.execute("SELECT body FROM events WHERE kind = ? ORDER BY ts", (kind,)).fetchall()
        return [json.loads(body) for (body,) in rows]

    def logs(self, tail: int = 6000) -> str:
        parts = [
            f"----- {d.name} log (tail)\n{d.log()[-tail:]}" for d in (self.coordinator, *self.agents.values())
        ]
        for path in sorted((self.slurm.workdir / "jobs").glob("*.out")):
            parts.append(f"----- {path.name} (tail)\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)


def _agent_config(
    port: int, node: str, kmsg: Path, state: Path, socket: Path, extra: str = "", keys: str = ""
) -> str:
    return f"""[bus]
host = "127.0.0.1"
port = {port}
keepalive_s = 2
reconnect_max_s = 1.0

[agent]
node = "{node}"
kmsg_path = "{kmsg}"
kmsg_from_start = true
state_dir = "{state}"
socket_path = "{socket}"
{keys}

[log]
level = "info"
json = true
{extra}
"""


def _coordinator_config(
    port: int, ledger: Path, slurm_conf: Path, api_port: int, keys: dict[str, Any], extra: str
) -> str:
    own = "\n".join(f"{k} = {json.dumps(v)}" for k, v in keys.items())
    return f"""[bus]
host = "127.0.0.1"
port = {port}
keepalive_s = 2
reconnect_max_s = 1.0

[coordinator]
ledger_path = "{ledger}"
scheduler = "slurm"
{own}

[coordinator.slurm]
slurm_conf = "{slurm_conf}"

[coordinator.api]
host = "127.0.0.1"
port = {api_port}

[log]
level = "info"
json = true
{extra}
"""


@contextlib.contextmanager
def recovery_stack(
    slurm: MultiNodeSlurm,
    broker_port: int,
    workdir: Path,
    *,
    coordinator_keys: dict[str, Any] | None = None,
    coordinator_extra: str = "",
    agent_extra: str = "",
    agent_keys: Callable[[str], str] | None = None,
    start_timeout_s: float = 60.0,
) -> Iterator[RecoveryStack]:
    """Agents on every node of ``slurm`` and a coordinator, on the broker at ``broker_port``.
    ``coordinator_keys``: keys of ``[coordinator]`` (save/stop deadlines...); ``coordinator_extra``:
    more TOML tables at the end of its config; ``agent_extra``: the same for every agent's;
    ``agent_keys``: more keys of one node's ``[agent]`` table (TOML lines), by node."""
    keys = {"save_deadline_s": 30.0, "stop_deadline_s": 30.0, **(coordinator_keys or {})}
    workdir.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="ftd-rec-", dir="/tmp"))  # unix socket paths must be short
    daemons: list[Daemon] = []
    try:
        ledger = workdir / "ledger.sqlite"
        api_port = free_port()
        coordinator = Daemon(
            "coordinator",
            _coordinator_config(broker_port, ledger, slurm.conf_path, api_port, keys, coordinator_extra),
            workdir,
            env={"SLURM_CONF": str(slurm.conf_path)},
        )
        agents: dict[str, Daemon] = {}
        kmsg: dict[str, Path] = {}
        for node in slurm.node_names:
            kmsg[node] = workdir / f"kmsg-{node}"
            kmsg[node].touch()
            (run_dir / node).mkdir()
            agents[node] = Daemon(
                f"agent-{node}",
                _agent_config(
                    broker_port,
                    node,
                    kmsg[node],
                    workdir / f"state-{node}",
                    run_dir / node / "agent.sock",
                    agent_extra,
                    agent_keys(node) if agent_keys is not None else "",
                ),
                workdir,
            )
        out = workdir / "trainer"
        out.mkdir(exist_ok=True)
        stack = RecoveryStack(
            slurm, broker_port, workdir, run_dir, agents, coordinator, kmsg, ledger, api_port, out
        )
        daemons.append(coordinator)
        coordinator.start()
        for agent in agents.values():
            daemons.append(agent)
            agent.start()
        coordinator.wait_log("bus_connected", start_timeout_s)
        for agent in agents.values():
            agent.wait_log("bus_connected", start_timeout_s)
        try:
            yield stack
        finally:
            with contextlib.suppress(Exception):
                slurm.cancel_all()
    finally:
        for daemon in daemons:
            daemon.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
