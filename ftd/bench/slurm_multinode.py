"""A private one-host Slurm 22.05 cluster in which every node really runs jobs: one ``slurmd -N node-i``
per node (:class:`ftd.bench.slurm_cluster.SlurmCluster` runs node-1 only).

What: :class:`MultiNodeSlurm`, a :class:`~ftd.bench.slurm_cluster.SlurmCluster` whose ``slurm.conf``
gives each node its own ``Port=`` and ``%n`` spool, pid and log files
(/work/shared/notes/local-services.md), one partition with every node, ``CPUs`` and ``Weight`` per
node (Slurm fills the lowest weight first: a job with no node list lands on the node the caller
means). It is started and stopped as a whole, daemons by the pids in their pid files. Why apart:
multi-node jobs (DDP with one rank per node, hot spares), requeues "elsewhere" and per-node agents
need more than one slurmd (``ftd bench recovery``, the operator-day and recovery tests).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ftd.bench.slurm_cluster import SlurmCluster, ensure_munged, free_port, wait_port

__all__ = ["MultiNodeSlurm"]


@dataclass
class MultiNodeSlurm(SlurmCluster):
    cpus: dict[str, int] = field(default_factory=dict)  # node -> CPUs (default 1)
    weights: dict[str, int] = field(default_factory=dict)  # node -> Weight (default 10)
    node_ports: dict[str, int] = field(default_factory=dict)

    def _node_pid_file(self, node: str) -> Path:
        return self.workdir / f"slurmd-{node}.pid"

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
        slurmctld = self.require("slurmctld", package="slurmctld")
        slurmd = self.require("slurmd", package="slurmd")
        for tool in ("scontrol", "sinfo", "sbatch", "squeue", "scancel", "srun"):
            self.require(tool, package="slurm-client")
        ensure_munged(self.require)
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

    def reset(self, timeout: float = 30.0) -> None:
        """Between runs: cancel every job, resume every drained node, wait until every node is idle."""
        self.cancel_all()
        self.resume_all()
        deadline = time.monotonic() + timeout
        for name in self.node_names:
            self.wait_node_state(name, "IDLE", max(1.0, deadline - time.monotonic()))

    def _daemon_pid_files(self) -> dict[str, Path]:
        files = {f"slurmd-{n}": self._node_pid_file(n) for n in self.node_names}
        return {**files, "slurmctld": self._pid_file("slurmctld")}
