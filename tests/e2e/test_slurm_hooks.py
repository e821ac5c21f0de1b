"""Slurm's own hooks drive ftd (issue #12), on a real one-host Slurm whose slurm.conf runs the shipped
``deploy/slurm`` scripts: ``Prolog``/``Epilog`` (``PrologFlags=Alloc``) and ``HealthCheckProgram``
(every 2 s), with a real Mosquitto, ``ftd agent`` (node-1) and ``ftd coordinator`` processes.

- A job that does not use ``ftd.client`` is in ``ftd status`` (Prolog -> agent -> retained presence
  with the allocation -> coordinator) while it runs, and gone after its Epilog.
- The Epilog finds a process the job left behind (double-forked out of the job's process tree; a
  fake ``nvidia-smi`` says it holds a GPU): a ``job_leftover`` event in the ledger naming it, and the
  node's health check fails while it lives.
- With the coordinator stopped, an Xid 79 in the node's kernel log makes slurmd's own health check
  (``ftd health --slurm``) drain node-1 with ftd's reason; the coordinator, started again, counts
  node-1 among ftd's drains. With the agent down the check warns and leaves the node alone.

The shipped scripts read their settings from ``FTD_SLURM_DEFAULTS``: the wrappers slurm.conf names
set it to a file each test rewrites (the current agent's socket, the ``ftd`` executable, SLURM_CONF).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.daemons import REPO
from tests.e2e.stack import XID79, Stack, make_stack, wait_until
from tests.realparts import Mosquitto, SlurmCluster, free_port

pytestmark = [pytest.mark.real, pytest.mark.slow]

FTD_BIN = Path(sys.executable).parent / "ftd"
HOOKS = ("prolog", "epilog", "healthcheck")


class Hooked:
    """The hooked cluster and the settings file its hook wrappers read."""

    def __init__(self, slurm: SlurmCluster, defaults: Path, workdir: Path) -> None:
        self.slurm, self.defaults, self.workdir = slurm, defaults, workdir
        self.fake_smi = workdir / "nvidia-smi"

    def configure(self, socket_path: str, gpu_pid_file: Path | None = None) -> None:
        lines = [
            f"FTD_BIN={FTD_BIN}",
            f"FTD_PYTHON={sys.executable}",  # the health check's fast path
            f"FTD_SOCKET={socket_path}",
            "export FTD_SOCKET",
            f"SLURM_CONF={self.slurm.conf_path}",
            "export SLURM_CONF",
            f"FTD_STATE_DIR={self.workdir}",  # where a missed Epilog notes the job's end
            "export FTD_STATE_DIR",
            "FTD_HOOK_TIMEOUT=2",
        ]
        if gpu_pid_file is not None:
            # nvidia-smi as the Epilog asks it: the leftover process holds GPU 0.
            self.fake_smi.write_text(
                f'#!/bin/sh\n[ -s {gpu_pid_file} ] && echo "$(cat {gpu_pid_file}), GPU-fake-0000"\nexit 0\n'
            )
            self.fake_smi.chmod(0o755)
            lines += [f"FTD_NVIDIA_SMI={self.fake_smi}", "export FTD_NVIDIA_SMI"]
        self.defaults.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def hooked_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hooked]:
    work = tmp_path_factory.mktemp("slurm-hooks")
    defaults = work / "ftd-slurm.env"
    defaults.write_text(
        f"FTD_BIN={FTD_BIN}\nFTD_SOCKET=/nonexistent/agent.sock\nexport FTD_SOCKET\n"
        f"FTD_STATE_DIR={work}\nexport FTD_STATE_DIR\n"
    )
    wrappers = {}
    for hook in HOOKS:
        wrapper = work / f"{hook}-wrapper.sh"
        wrapper.write_text(
            f"#!/bin/sh\nexport FTD_SLURM_DEFAULTS={defaults}\nexec {REPO}/deploy/slurm/{hook}.sh\n"
        )
        wrapper.chmod(0o755)
        wrappers[hook] = wrapper
    cluster = SlurmCluster(
        work / "slurm",
        extra_conf=[
            f"Prolog={wrappers['prolog']}",
            f"Epilog={wrappers['epilog']}",
            "PrologFlags=Alloc",
            f"HealthCheckProgram={wrappers['healthcheck']}",
            "HealthCheckInterval=2",
        ],
    ).start()
    try:
        yield Hooked(cluster, defaults, work)
    finally:
        cluster.stop()


@pytest.fixture
def hooked(hooked_cluster: Hooked) -> Iterator[Hooked]:
    hooked_cluster.slurm.reset()
    try:
        yield hooked_cluster
    finally:
        hooked_cluster.configure("/nonexistent/agent.sock")
        hooked_cluster.slurm.reset()


@contextlib.contextmanager
def hooked_stack(
    hooked: Hooked, mosquitto: Mosquitto, tmp_path: Path, coordinator_extra: str = "", **kw: Any
) -> Iterator[tuple[Stack, int]]:
    port = free_port()
    with make_stack(
        hooked.slurm,
        mosquitto,
        tmp_path,
        coordinator_extra=f"\n[coordinator.api]\nport = {port}\n{coordinator_extra}",
        **kw,
    ) as stack:
        stack.agent.wait_log("local_api_listening")
        yield stack, port


def status(port: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "ftd.cli", "status", "--url", f"http://127.0.0.1:{port}", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def job_of(port: int, job: str) -> dict[str, Any] | None:
    return next((j for j in status(port)["jobs"] if j["id"] == job), None)


def health(
    socket_path: str, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FTD_BIN), "health", "--socket", socket_path, *extra],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )


def test_prolog_and_epilog_make_a_job_without_the_client_visible(
    hooked: Hooked, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    with hooked_stack(hooked, mosquitto, tmp_path) as (stack, port):
        hooked.configure(stack.socket)
        job = hooked.slurm.sbatch(None, "-w", "node-1", "--job-name=no-client", wrap="sleep 60")
        wait_until(lambda: job_of(port, job) is not None, 30, f"job {job} in ftd status")
        seen = job_of(port, job)
        assert seen is not None
        assert seen["nodes"] == ["node-1"]
        assert seen["ranks"] == []
        assert seen["allocations"]["node-1"]["user"] == "root"
        assert seen["allocations"]["node-1"]["source"] == "prolog"
        assert job in next(n for n in status(port)["nodes"] if n["name"] == "node-1")["jobs"]
        table = subprocess.run(
            [sys.executable, "-m", "ftd.cli", "status", "--url", f"http://127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=REPO,
        ).stdout
        row = next(line for line in table.splitlines() if line.startswith(job + " "))
        assert "no (prolog)" in row and "root" in row
        hooked.slurm.run("scancel", job)
        wait_until(lambda: job_of(port, job) is None, 30, f"job {job} gone from ftd status after its Epilog")
        assert "job_ended_here" in stack.agent.log()


def test_epilog_reports_a_leftover_gpu_process(hooked: Hooked, mosquitto: Mosquitto, tmp_path: Path) -> None:
    pid_file = tmp_path / "leftover.pid"
    with hooked_stack(hooked, mosquitto, tmp_path) as (stack, _port):
        hooked.configure(stack.socket, gpu_pid_file=pid_file)
        # The job double-forks a sleeper out of its process tree and ends: Slurm cannot kill it.
        script = f"#!/bin/bash\n( setsid sleep 300 & echo $! > {pid_file} )\nsleep 1\n"
        job = hooked.slurm.sbatch(script, "-w", "node-1", "--job-name=leaves-one")
        leftover = 0
        try:
            wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), 30, "the sleeper's pid")
            leftover = int(pid_file.read_text())
            wait_until(lambda: stack.ledger_events("job_leftover"), 30, "a job_leftover event")
            (event,) = stack.ledger_events("job_leftover")
            data = event["data"]
            assert isinstance(data, dict)
            assert data["job"] == job
            assert data["pids"] == [leftover]
            assert data["gpu_pids"] == [leftover]
            assert event["severity"] == "error"
            checked = health(stack.socket)
            assert checked.returncode == 1, checked.stdout
            assert f"job {job} left GPU processes {leftover}" in checked.stdout
        finally:
            if leftover:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(leftover, signal.SIGKILL)
        wait_until(lambda: health(stack.socket).returncode == 0, 10, "health back once the process is gone")


def test_healthcheck_drains_the_node_while_the_coordinator_is_stopped(
    hooked: Hooked, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    with hooked_stack(hooked, mosquitto, tmp_path) as (stack, port):
        stack.coordinator.stop()
        hooked.configure(stack.socket)
        assert health(stack.socket).returncode == 0  # healthy: NHC-style, nothing printed
        assert hooked.slurm.node("node-1")["State"].split("+")[0] in ("IDLE", "ALLOCATED", "MIXED")
        stack.append_kernel_line(XID79)
        stack.agent.wait_log("condition_active")
        # slurmd runs the HealthCheckProgram itself (every 2 s): nobody calls it here.
        info = hooked.slurm.wait_node_state("node-1", "IDLE+DRAIN", 30)
        assert info["Reason"].startswith("ftd: health: xid 79 on 0000:3b:00")
        checked = health(stack.socket)
        assert checked.returncode == 1
        assert checked.stdout.startswith("ERROR:  ftd:  Health check failed:  xid 79 on 0000:3b:00")
        # The coordinator, back, receives the spooled Xid and counts node-1 as drained by ftd (its own
        # drain_node of the Xid, or the health check's drain adopted: the reason starts with "ftd:").
        stack.coordinator.start()

        def ftd_drain() -> list[tuple[str, str]]:
            with sqlite3.connect(stack.ledger) as db:
                return list(db.execute("SELECT node, origin FROM drains"))

        wait_until(lambda: ftd_drain() == [("node-1", "ftd")], 30, "node-1 in the coordinator's drains")
        assert "DRAIN" in hooked.slurm.node("node-1")["State"]
        # and shows what the agent sees (its retained conditions/ftd), as `ftd health` does on the node
        stack.coordinator.wait_log("http_api_listening")
        node1 = next(n for n in status(port)["nodes"] if n["name"] == "node-1")
        assert node1["conditions"] == ["xid 79 on 0000:3b:00.0"]


def test_healthcheck_with_the_agent_down_warns_and_leaves_the_node(hooked: Hooked, tmp_path: Path) -> None:
    env = {**os.environ, "SLURM_CONF": str(hooked.slurm.conf_path)}
    checked = health(str(tmp_path / "no-agent.sock"), "--slurm", "--node", "node-1", env=env)
    assert checked.returncode == 0
    assert checked.stdout.startswith("WARNING:  ftd:  agent not reachable at")
    assert "DRAIN" not in hooked.slurm.node("node-1")["State"]
    strict = health(str(tmp_path / "no-agent.sock"), "--slurm", "--strict", env=env)
    assert strict.returncode == 1
