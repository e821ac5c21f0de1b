"""``ftd run`` with a real ``ftd agent`` on real Mosquitto (issue #24): a spare's supervisor shows in
the job's retained presence (no ranks, only the supervisor), a ``restart`` directive published on the
node's job-directive topic reaches it through the agent and starts generation 1 (the presence says
so at once), and a supervisor killed with SIGKILL is ``lost`` in the presence with a ``supervisor``
event on the bus."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import pytest

from ftd.bus import topics
from ftd.bus.mqtt import MqttBus
from ftd.events import Directive, JobPresence
from tests.e2e.daemons import REPO, Daemon
from tests.realparts import Mosquitto

pytestmark = [pytest.mark.real, pytest.mark.slow]

WITHIN = 60.0


async def test_spare_restart_and_loss_through_a_real_agent(mosquitto: Mosquitto, tmp_path: Path) -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="ftdrun", dir="/tmp"))
    socket_path = str(run_dir / "agent.sock")
    (tmp_path / "kmsg").touch()
    out = tmp_path / "out"
    out.mkdir()
    agent = Daemon(
        "agent-node-1",
        f"""
[bus]
host = "127.0.0.1"
port = {mosquitto.port}
keepalive_s = 2
reconnect_max_s = 1.0

[agent]
node = "node-1"
kmsg_path = "{tmp_path / "kmsg"}"
state_dir = "{tmp_path / "agent-state"}"
socket_path = "{socket_path}"

[log]
level = "info"
json = true
""",
        tmp_path,
    ).start()
    supervisor: asyncio.subprocess.Process | None = None
    bus = MqttBus(host="127.0.0.1", port=mosquitto.port, client_id="e2e-run-watch", clean_session=True)
    presences: list[JobPresence] = []
    event_payloads: list[bytes] = []

    async def watch() -> None:
        async for message in bus.messages():
            if message.topic == topics.node_job("node-1", "j1") and message.payload:
                presences.append(msgspec.json.decode(message.payload, type=JobPresence))
            elif "/events/" in message.topic:
                event_payloads.append(message.payload)

    async def until(what: str, predicate: object) -> None:
        deadline = time.monotonic() + WITHIN
        while not predicate():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {presences[-1:]}\n{agent.log()[-3000:]}")
            await asyncio.sleep(0.05)

    watcher: asyncio.Task[None] | None = None
    try:
        agent.wait_log("bus_connected", timeout=WITHIN)
        await bus.subscribe(topics.node_job("node-1", "j1"))
        await bus.subscribe(f"{topics.PREFIX}/nodes/node-1/events/#")
        await bus.start()
        watcher = asyncio.create_task(watch())
        log = (tmp_path / "run.log").open("ab")
        cmd = [sys.executable, *("-m", "ftd.cli", "run", "--job", "j1", "--socket", socket_path)]
        cmd += ["--nodes", "1", "--spares", "1", "--node-rank", "1", "--preflight", "none"]
        cmd += ["--addr", "10.0.0.2", "--", sys.executable, str(REPO / "tests/e2e/supervisor_rank.py")]
        supervisor = await asyncio.create_subprocess_exec(
            *cmd, env={**os.environ, "OUT_DIR": str(out), "PYTHONPATH": str(REPO)}, stdout=log, stderr=log
        )
        log.close()

        def sup_is(**want: object) -> bool:
            sup = presences[-1].supervisor if presences else None
            return sup is not None and all(getattr(sup, k) == v for k, v in want.items())

        await until("the spare in the presence", lambda: sup_is(role="spare", state="idle", addr="10.0.0.2"))
        assert presences[-1].ranks == []

        restart = Directive(
            id="a1-restart-g1",
            ts=time.time(),
            action="restart",
            job="j1",
            params={
                "generation": 1,
                "slots": ["node-1"],
                "master_addr": "10.0.0.2",
                "resume_step": 3,
                "resume_level": "partner",  # the coordinator's verified choice (issue #34)
                "resume_path": "/local/ckpt",
                "out": ["node-9"],
                "path": "spare",
            },
        )
        await bus.publish(topics.node_job_directives("node-1"), msgspec.json.encode(restart))
        await until(
            "generation 1 running", lambda: sup_is(role="active", slot=0, generation=1, state="running")
        )
        await until("the rank's record", lambda: (out / "g1-r0.json").exists())
        record = json.loads((out / "g1-r0.json").read_text())
        assert (record["RANK"], record["MASTER_PORT"], record["FTD_RESUME_STEP"]) == ("0", "29501", "3")
        assert (record["FTD_RESUME_LEVEL"], record["FTD_RESUME_PATH"]) == ("partner", "/local/ckpt")

        supervisor.send_signal(signal.SIGKILL)
        await asyncio.wait_for(supervisor.wait(), WITHIN)
        await until("the supervisor lost", lambda: sup_is(state="lost", generation=1))
        await until("the supervisor event", lambda: any(b'"supervisor"' in p for p in event_payloads))
        body = next(p for p in event_payloads if b'"supervisor"' in p).decode()
        assert '"state":"lost"' in body and '"generation":1' in body
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record["pid"], signal.SIGKILL)  # the rank a killed supervisor left behind
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(BaseException):
                await watcher
        await bus.stop()
        if supervisor is not None and supervisor.returncode is None:
            supervisor.kill()
            await supervisor.wait()
        agent.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
        print(f"----- agent log (tail)\n{agent.log()[-4000:]}")
        print((tmp_path / "run.log").read_text() if (tmp_path / "run.log").exists() else "")
