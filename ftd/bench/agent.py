"""``ftd bench agent``: the agent's steady-state cost: CPU (% of one core) and resident memory.

The agent runs as its own process (``python -m ftd.bench.agent CONFIG``: the same :class:`Agent` as
``ftd agent``, with one difference: the NVML watcher gets a :class:`FakeNvml` with 8 GPUs, since
``ftd agent`` only speaks to the real driver) against a private Mosquitto, with: the kernel-log
watcher on a FIFO (read with ``add_reader``, as the agent reads the ``/dev/kmsg`` character device;
a regular file would add the 25 ms idle polling that only file sources need) that receives a few
noise lines a second, the NVML watcher polling the 8 fake GPUs
at 1 Hz, 4 followed log files (a line a second each), the filesystem watcher on one mount, the memory
and heartbeat watchers, storm control and the durable spool. After a warm-up, CPU time
(``utime + stime`` from ``/proc/PID/stat``) is measured over ``seconds`` and RSS (``VmRSS``) read at
the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ftd.bench.broker import PrivateMosquitto
from ftd.bench.e2e import open_fifo_writer

NODE = "bench-agent"


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def bench_agent(seconds: float = 20.0, warmup: float = 5.0) -> dict[str, Any]:
    with PrivateMosquitto() as broker, tempfile.TemporaryDirectory(prefix="ftd-bench-agent-") as tmp:
        work = Path(tmp)
        kmsg = work / "kmsg.fifo"
        os.mkfifo(kmsg)
        logs = [work / f"train-{i}.log" for i in range(4)]
        for log in logs:
            log.touch()
        paths = ", ".join(f'"{p}"' for p in logs)
        config = work / "agent.toml"
        config.write_text(
            f'[bus]\nhost = "127.0.0.1"\nport = {broker.port}\n\n[log]\nlevel = "warning"\njson = true\n\n'
            f'[agent]\nnode = "{NODE}"\nkmsg_path = "{kmsg}"\nstate_dir = "{work}/state"\n'
            f'socket_path = "{work}/a.sock"\n\n[agent.nvml]\ninterval_s = 1.0\n\n'
            f'[agent.logs]\npaths = [{paths}]\n\n[[agent.fs.mounts]]\npath = "{work}"\n'
        )
        out = (work / "agent.out").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "ftd.bench.agent", str(config)], stdout=out, stderr=out
        )
        kmsg_fd = -1
        try:
            kmsg_fd = open_fifo_writer(kmsg)
            end_warm = time.monotonic() + warmup
            step = 0

            def feed() -> None:
                nonlocal step
                step += 1
                os.write(
                    kmsg_fd,
                    f"[{step}.000000] usb 1-1: new high-speed USB device number {step}\n".encode() * 3,
                )
                for log in logs:
                    with log.open("a") as handle:
                        handle.write(f"step {step} loss 0.{step % 97:02d} lr 3e-4\n")

            while time.monotonic() < end_warm:
                feed()
                time.sleep(1.0)
                if proc.poll() is not None:
                    raise RuntimeError(f"agent exited: {(work / 'agent.out').read_text()[-2000:]}")
            cpu0, t0 = _cpu_s(proc.pid), time.monotonic()
            while time.monotonic() - t0 < seconds:
                feed()
                time.sleep(1.0)
            cpu1, t1 = _cpu_s(proc.pid), time.monotonic()
            rss = _rss_mb(proc.pid)
            if proc.poll() is not None:
                raise RuntimeError(f"agent exited: {(work / 'agent.out').read_text()[-2000:]}")
        finally:
            if kmsg_fd >= 0:
                os.close(kmsg_fd)
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            out.close()
        return {
            "cpu_pct": round(100 * (cpu1 - cpu0) / (t1 - t0), 2),
            "rss_mb": round(rss, 1),
            "seconds": round(t1 - t0, 1),
            "gpus": 8,
            "logs": len(logs),
        }


def _child(config_path: str) -> None:
    """The agent process: ``ftd agent`` with 8 fake GPUs behind the NVML watcher."""
    import signal

    from ftd.agent.app import status_messages
    from ftd.agent.watchers.nvml.fake import FakeNvml
    from ftd.agent.wiring import build_agent
    from ftd.bus.factory import make_mqtt_bus
    from ftd.config import load_config
    from ftd.logs import configure

    config = load_config(config_path)
    configure(config.log.level, json=config.log.json)
    node = config.agent.resolved_node()
    will, birth = status_messages(node)
    bus = make_mqtt_bus(config.bus, client_id=f"ftd-agent-{node}", will=will, birth=birth)

    async def main() -> None:
        task = asyncio.create_task(
            build_agent(config.agent, bus=bus, node=node, nvml_backend=FakeNvml(count=8)).run()
        )
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())


if __name__ == "__main__":
    _child(sys.argv[1])
