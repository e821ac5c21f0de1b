"""A private one-host Slurm 22.05 cluster in which every node really runs jobs: one ``slurmd -N node-i``
per node (tests/realparts.py's :class:`SlurmCluster` runs node-1 only).

What: :class:`MultiNodeSlurm`, a :class:`SlurmCluster` whose ``slurm.conf`` gives each node its own
``Port=`` and ``%n`` spool, pid and log files (/work/shared/notes/local-services.md), one partition
with every node, ``CPUs`` and ``Weight`` per node (Slurm fills the lowest weight first: a job with no
node list lands on the node the test means). It is started and stopped as a whole, daemons by the
pids in their pid files. Why apart: multi-node jobs (DDP with one rank per node), requeues "elsewhere"
and per-node agents need more than one slurmd; the session fixture's cluster stays single-node.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass, field

from tests.realparts import SlurmCluster, ensure_munged, free_port, require_binary, wait_port


@dataclass
class MultiNodeSlurm(SlurmCluster):
    cpus: dict[str, int] = field(default_factory=dict)  # node -> CPUs (default 1)
    weights: dict[str, int] = field(default_factory=dict)  # node -> Weight (default 10)
    node_ports: dict[str, int] = field(default_factory=dict)

    def _node_pid_file(self, node: str) -> str:
        return str(self.workdir / f"slurmd-{node}.pid")

    def write_conf(self) -> None:
        super().write_conf()
        w = self.workdir
        lines = []
        for line in self.conf_path.read_text().splitlines():
            if line.startswith(("NodeName=", "PartitionName=", "SlurmdPort=")):
                continue
            if line.startswith("SlurmdPidFile="):
                line = f"SlurmdPidFile={w}/slurmd-%n.pid"
            elif line.startswith("SlurmdLogFile="):
                line = f"SlurmdLogFile={w}/slurmd-%n.log"
            lines.append(line)
        for name in self.node_names:
            lines.append(
                f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={self.node_ports[name]} "
                f"CPUs={self.cpus.get(name, 1)} RealMemory=100 Weight={self.weights.get(name, 10)} "
                "State=UNKNOWN"
            )
        lines.append(f"PartitionName=debug Nodes=node-[1-{self.nodes}] Default=YES MaxTime=INFINITE State=UP")
        self.conf_path.write_text("\n".join(lines) + "\n")

    def start(self, timeout: float = 60.0) -> MultiNodeSlurm:
        slurmctld = require_binary("slurmctld", package="slurmctld")
        slurmd = require_binary("slurmd", package="slurmd")
        for tool in ("scontrol", "sinfo", "sbatch", "squeue", "scancel", "srun"):
            require_binary(tool, package="slurm-client")
        ensure_munged()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ctld_port = self.ctld_port or free_port()
        self.slurmd_port = self.slurmd_port or free_port()
        for name in self.node_names:
            self.node_ports.setdefault(name, free_port())
        self.write_conf()
        try:
            self._spawn("slurmctld", [slurmctld, "-D", "-c", "-f", str(self.conf_path)])
            wait_port(self.ctld_port, timeout)
            for name in self.node_names:
                self._spawn(f"slurmd-{name}", [slurmd, "-D", "-N", name, "-f", str(self.conf_path)])
            for name in self.node_names:
                self.wait_node_state(name, "IDLE", timeout)
        except Exception:
            logs = self.logs()
            self.stop()
            raise RuntimeError(f"slurm did not start:\n{logs}") from None
        return self

    def logs(self, tail: int = 3000) -> str:
        parts = []
        for path in sorted(self.workdir.glob("slurm*.log")) + sorted(self.workdir.glob("slurm*.stdout")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel jobs (so each slurmd sees its steps end), then stop every daemon by its pid."""
        ctld = self.procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            ids = self.run("squeue", "-h", "-o", "%i", check=False, timeout=10).stdout.split()
            if ids:
                self.run("scancel", *ids, check=False, timeout=10)
        names = [f"slurmd-{n}" for n in self.node_names] + ["slurmctld"]
        for name in names:
            proc = self.procs.pop(name, None)
            pid_file = (
                self._node_pid_file(name.removeprefix("slurmd-"))
                if name.startswith("slurmd-")
                else str(self._pid_file("slurmctld"))
            )
            pids: set[int] = set()
            with contextlib.suppress(OSError, ValueError, IndexError), open(pid_file) as f:
                pids.add(int(f.read().split()[0]))
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
