"""On Kubernetes a rank stopped by the coordinator exits non-zero, so the Job's pod is recreated (issue #12).

A real trainer process (the client in a training loop, ``sys.exit(client.exit_status())`` after it)
against a real :class:`~ftd.agent.local_api.LocalApi`: a ``stop`` directive ends it with 75 when
``KUBERNETES_SERVICE_HOST`` is set (as in every pod), 0 outside Kubernetes, ``$FTD_STOP_EXIT_CODE``
when set; a SIGTERM stop (the kubelet deleting the pod) is 0 either way.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftd.agent.local_api import LocalApi
from ftd.client import STOP_EXIT_CODE
from ftd.events import Directive
from tests.unit.helpers import until

REPO = Path(__file__).resolve().parents[2]
TRAINER = r"""
import sys, time
from ftd.client import Client
client = Client(job="k8s-job", rank=0, signals=True)
print("ready", flush=True)
step = 0
while not client.should_stop():
    step += 1
    client.heartbeat(step)
    time.sleep(0.01)
client.close()
sys.exit(client.exit_status())
"""


def start(api: LocalApi, **env: str) -> subprocess.Popen[str]:
    full = {
        k: v
        for k, v in os.environ.items()
        if k not in ("KUBERNETES_SERVICE_HOST", "FTD_STOP_EXIT_CODE", "SLURM_JOB_ID")
    }
    full.update(FTD_SOCKET=api.socket_path, PYTHONPATH=str(REPO), **env)
    return subprocess.Popen([sys.executable, "-c", TRAINER], env=full, stdout=subprocess.PIPE, text=True)


async def stopped_by_directive(api: LocalApi, n: int, **env: str) -> int:
    proc = start(api, **env)
    try:
        await until(lambda: "k8s-job" in api.jobs(), 20)
        stop = Directive(id=f"stop-{n}", ts=time.time(), action="stop", job="k8s-job", reason="xid 79")
        assert await api.deliver(stop) == 1
        return await asyncio.to_thread(proc.wait, 20)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize(
    ("env", "code"),
    [
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, STOP_EXIT_CODE),
        ({}, 0),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "FTD_STOP_EXIT_CODE": "3"}, 3),
        ({"FTD_STOP_EXIT_CODE": "0"}, 0),
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "SLURM_JOB_ID": "12"}, 0),  # Slurm in pods: ftd requeues
    ],
)
async def test_a_stop_directive_sets_the_exit_status(api: LocalApi, env: dict[str, str], code: int) -> None:
    assert await stopped_by_directive(api, len(env) + code, **env) == code


async def test_a_sigterm_stop_exits_zero_on_kubernetes_too(api: LocalApi) -> None:
    proc = start(api, KUBERNETES_SERVICE_HOST="10.96.0.1")
    try:
        await until(lambda: "k8s-job" in api.jobs(), 20)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
