"""Issue #11, done-when: a trainer running as an unprivileged user in a Slurm job saves and acks
through the agent; a process of that user outside the job cannot speak for it.

Real parts: Mosquitto, a private Slurm cluster (munged + slurmctld + slurmd, :class:`SlurmCluster`),
``ftd agent`` with ``agent.socket_group`` and ``ftd coordinator`` as subprocesses. The job is
submitted by the user ``ftd-trainer`` itself (``runuser -u ftd-trainer -- sbatch``) and runs
tests/e2e/trainer_job.py under the system Python. The cluster gets its own world-traversable work
directory (the session cluster's lies under pytest's 0700 temporary root, which a job running as
another user cannot enter).

Which identity path the agent took is read from its log and printed: with the fixture's
``ProctrackType=proctrack/linuxproc`` there is no ``job_<id>`` cgroup, so the agent must find the
job through the root-owned ``slurmstepd: [<id>.batch]`` ancestor; with ``proctrack/cgroup`` it
would be the cgroup. The environment fallback is not needed here (tests/unit/test_peer.py and
tests/security/test_trainer_socket.py cover it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.daemons import Daemon
from tests.e2e.stack import XID79, trainer_records, wait_until
from tests.realparts import Mosquitto, SlurmCluster
from tests.security.test_trainer_socket import RAW
from tests.security.unprivileged import GROUP, PYTHON, REPO, User, run_as, trainer_users

pytestmark = [pytest.mark.real, pytest.mark.slow]


@pytest.fixture(scope="module")
def open_slurm() -> Iterator[SlurmCluster]:
    workdir = Path(tempfile.mkdtemp(prefix="ftd-slurm-", dir="/tmp"))
    os.chmod(workdir, 0o755)
    cluster = SlurmCluster(workdir / "cluster", nodes=1)
    cluster.workdir.mkdir(mode=0o755)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _registrations(agent: Daemon) -> list[dict[str, Any]]:
    out = []
    for line in agent.log().splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if entry.get("event") in ("local_api_rank_registered", "registration_refused"):
                out.append(entry)
    return out


def _sbatch_as(user: User, cluster: SlurmCluster, script: str, shared: Path) -> str:
    argv = user.argv("sbatch", "--parsable", "--requeue", f"--chdir={shared}", f"--output={shared}/%j.out")
    env = {"PATH": "/usr/bin:/bin", "SLURM_CONF": str(cluster.conf_path)}
    done = subprocess.run(argv, input=script, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def test_an_unprivileged_users_slurm_job_saves_and_acks_and_no_one_else_speaks_for_it(
    open_slurm: SlurmCluster, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    trainer, _, _ = trainer_users()
    cluster = open_slurm
    shared = Path(tempfile.mkdtemp(prefix="ftd-job-", dir="/tmp"))
    os.chmod(shared, 0o777)  # the job (as ftd-trainer) writes its log and checkpoints here
    run_dir = Path(tempfile.mkdtemp(prefix="ftd-run-", dir="/tmp"))
    os.chmod(run_dir, 0o755)  # RuntimeDirectoryMode=0755: the socket's mode and group decide
    socket_path = str(run_dir / "agent.sock")
    kmsg, ledger = tmp_path / "kmsg", tmp_path / "ledger.sqlite"
    kmsg.touch()
    bus = f'[bus]\nhost = "127.0.0.1"\nport = {mosquitto.port}\nkeepalive_s = 2\nreconnect_max_s = 1.0\n'
    log = '\n[log]\nlevel = "info"\njson = true\n'
    agent = Daemon(
        "agent-node-1",
        f"""{bus}
[agent]
node = "node-1"
kmsg_path = "{kmsg}"
kmsg_from_start = true
state_dir = "{tmp_path / "agent-state"}"
socket_path = "{socket_path}"
socket_group = "{GROUP}"
socket_mode = 0o660
{log}""",
        tmp_path,
    )
    coordinator = Daemon(
        "coordinator",
        f"""{bus}
[coordinator]
ledger_path = "{ledger}"
save_deadline_s = 30
stop_deadline_s = 30
scheduler = "slurm"

[coordinator.slurm]
slurm_conf = "{cluster.conf_path}"

[coordinator.api]
enabled = false
{log}""",
        tmp_path,
    )
    coordinator.start()
    agent.start()
    try:
        coordinator.wait_log("node_status")
        agent.wait_log("bus_connected")
        trainer_log = shared / "trainer.jsonl"
        script = f"""#!/bin/bash
export FTD_SOCKET={socket_path}
export FTD_TEST_LOG={trainer_log}
export FTD_TEST_CKPT={shared}
export FTD_TEST_MAX_S=90
export PYTHONPATH={REPO}
exec {PYTHON} {REPO}/tests/e2e/trainer_job.py
"""
        job = _sbatch_as(trainer, cluster, script, shared)
        info = cluster.wait_job_state(job, "RUNNING", 30)
        assert info["UserId"].startswith(f"{trainer.name}("), info["UserId"]
        wait_until(lambda: bool(_registrations(agent)), 30, "the job's rank to register")
        first = _registrations(agent)[0]
        proctrack = next(
            line.split("=", 1)[1]
            for line in cluster.conf_path.read_text().splitlines()
            if line.startswith("ProctrackType=")
        )
        expected = "cgroup" if proctrack == "proctrack/cgroup" else "slurmstepd"
        print(f"identity path taken: {first.get('identity')} ({first.get('why')}); ProctrackType={proctrack}")
        assert first["event"] == "local_api_rank_registered", first
        assert (first["job"], first["uid"], first["identity"]) == (job, trainer.uid, expected), first

        # The same user, outside the job, claiming it (environment set to match): refused, because
        # the job's slurmstepd runs on this node and this process is not one of its children.
        forged = run_as(
            trainer,
            RAW,
            {"FTD_SOCKET": socket_path, "FTD_JOB": job, "SLURM_JOB_ID": job, "CLAIM_JOB": job},
        )
        reply = json.loads(forged.stdout.splitlines()[0])
        assert (
            reply["op"] == "error"
            and "refused" in reply["error"]
            and "run under Slurm here" in reply["error"]
        )
        refused = [r for r in _registrations(agent) if r["event"] == "registration_refused"]
        assert len(refused) == 1 and refused[0]["source"] == "environ", refused

        # The fault: the real rank saves, acks through the agent, stops; the action succeeds on its ack.
        with kmsg.open("a") as f:
            f.write(XID79 + "\n")
        wait_until(
            lambda: any(r["what"] == "stopped" for r in trainer_records(trainer_log)),
            40,
            "the trainer to stop",
        )
        saved = [r for r in trainer_records(trainer_log) if r["what"] == "saved"]
        assert len(saved) == 1 and Path(str(saved[0]["path"])).read_text() == str(saved[0]["step"])
        assert Path(str(saved[0]["path"])).stat().st_uid == trainer.uid  # written by the job's user

        def action() -> tuple[str, dict[str, Any]]:
            with sqlite3.connect(ledger) as db:
                row = db.execute(
                    "SELECT state, detail FROM actions WHERE kind = 'checkpoint_restart'"
                ).fetchone()
            return (row[0], json.loads(row[1]) if row[1] else {}) if row else ("", {})

        wait_until(lambda: action()[0] == "succeeded", 30, "checkpoint_restart to succeed")
        assert action()[1]["save_step"] == saved[0]["step"], action()
    finally:
        agent.stop()
        coordinator.stop()
        for daemon in (agent, coordinator):
            print(f"----- {daemon.name} log (tail)\n{daemon.log()[-3000:]}")
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(run_dir, ignore_errors=True)
