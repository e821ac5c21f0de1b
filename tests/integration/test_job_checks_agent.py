"""The issue's target on a real agent: a job whose rank runs with ``ulimit -l`` 64 KiB, without
``nvidia_peermem``, on an InfiniBand node, then logs NCCL's ``NET/Socket`` line: a ``platform`` event
naming the causes on the bus within 10 s of the rank's start, and one naming ``nccl_socket`` once the
line is in its log. The rank is a real process using the ftd client; the agent is ``build_agent``'s,
its log watcher follows the rank's log file. (This machine has no IB device: the site's word
``agent.job_checks.infiniband = "yes"`` makes it an IB node; /proc/modules is the real one: without
nvidia_peermem, or, in a container without it, unknown with its reason.)
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

from ftd.config import AgentConfig, LogsConfig, NvmlConfig
from ftd.config.schema import JobChecksConfig
from ftd.events import Kind
from tests.agent_on_bus import agent_on_bus
from tests.unit.helpers import until

RANK = """
import sys, time
from ftd.client import Client
client = Client(job="j-rdma", rank=0, socket_path=sys.argv[1])
deadline = time.monotonic() + 30
while not client.connected and time.monotonic() < deadline:
    time.sleep(0.05)
print("registered", flush=True)
time.sleep(120)
"""


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_slow_path_job_is_named_within_10_s_and_again_when_nccl_says_socket(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.touch()
    log = tmp_path / "rank0.log"
    log.touch()
    cfg = AgentConfig(
        node="n1",
        kmsg_path=str(kmsg),
        state_dir=str(tmp_path / "s"),
        socket_path=str(tmp_path / "a.sock"),
        nvml=NvmlConfig(enabled=False),
        logs=LogsConfig(paths=[str(log)]),
        job_checks=JobChecksConfig(infiniband="yes", connect_attempts=1, acs=False),
    )
    async with agent_on_bus(cfg, [Kind.PLATFORM]) as running:
        got = running.received
        port = _closed_port()
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}

        def low_memlock() -> None:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 << 10, 64 << 10))

        await until(lambda: os.path.exists(cfg.socket_path), within=10)
        started = time.monotonic()
        rank = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            RANK,
            cfg.socket_path,
            env=env,
            stdout=subprocess.DEVNULL,
            preexec_fn=low_memlock,  # the rank's own limit, as `ulimit -l 64` gives it
        )
        try:
            await until(lambda: len(got) >= 1, within=10)
            at, first = got[0]
            assert at - started < 10.0, at - started
            assert first.data["job"] == "j-rdma" and first.data["pids"] == [rank.pid]
            causes = set(first.data["causes"])
            assert "memlock_low" in causes
            assert "no_peermem" in causes or "/proc/modules" in first.data["unknown"]["peermem"]
            # The rendezvous probe's answer (one attempt here) makes the next event.
            await until(lambda: len(got) >= 2, within=10)
            assert "rendezvous_unreachable" in got[1][1].data["causes"]
            assert first.data["evidence"]["memlock_low"]["bytes"] == {str(rank.pid): 64 << 10}
            assert "nccl_transport" in first.data["unknown"]
            with log.open("a") as f:
                f.write(f"n1:{rank.pid}:{rank.pid} [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n")
            await until(lambda: len(got) >= 3, within=10)
            second = got[2][1]
            assert "nccl_socket" in second.data["causes"] and second.data["nccl"]["nets"] == ["socket"]
        finally:
            rank.kill()
            await rank.wait()
