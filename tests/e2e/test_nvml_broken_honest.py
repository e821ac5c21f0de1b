"""Issue #32 item 3: a broken NVML does not look healthy.

Real parts: Mosquitto, ``ftd agent`` and ``ftd coordinator`` as subprocesses, and this machine's
missing NVML (no libnvidia-ml: the agent's real NVML backend fails to initialise, as on a GPU node
whose driver is broken or whose container lacks the library; on a machine whose NVML works, the
agent is started with ``pynvml`` shadowed by a module that fails to import, the library missing).
Whether the node has GPUs is read from a root the test lays out (``agent.nvml.gpu_root``):
``proc/driver/nvidia/gpus/<pci>`` and ``dev/nvidia0``, what the NVIDIA driver creates, or nothing.

Before the fix the agent logged one warning and kept ``ftd_agent_watcher_up{watcher="nvml"} 1``: no
condition, nothing in ``ftd status``, no alert. Now, on a node with GPUs, the watcher is
``unavailable`` in the metrics (``up`` 0, the reason in ``ftd_agent_watcher_state``), the node has a
condition that ``ftd health`` and ``ftd status`` show; on a node without GPUs it is idle, not a
problem.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftd.agent.watchers.nvml.real import RealNvml
from tests.e2e.daemons import REPO
from tests.e2e.one_node import Node, one_node
from tests.e2e.stack import wait_until
from tests.realparts import Mosquitto, free_port

pytestmark = [pytest.mark.real, pytest.mark.slow]


def gpu_root(tmp_path: Path, *, gpus: bool) -> Path:
    root = tmp_path / "host"
    (root / "proc" / "driver").mkdir(parents=True)
    (root / "dev").mkdir()
    if gpus:
        (root / "proc" / "driver" / "nvidia" / "gpus" / "0000:3b:00.0").mkdir(parents=True)
        (root / "dev" / "nvidia0").touch()
        (root / "dev" / "nvidiactl").touch()
    return root


def without_nvml(tmp_path: Path) -> dict[str, str]:
    """The agent's environment: as it is where NVML does not work; with ``pynvml`` hidden where it does."""
    try:
        backend = RealNvml()
        backend.init()
        backend.shutdown()
    except Exception:
        return {}
    shadow = tmp_path / "no-nvml"
    shadow.mkdir()
    (shadow / "pynvml.py").write_text('raise ImportError("libnvidia-ml hidden by the test")\n')
    return {"PYTHONPATH": f"{shadow}:{REPO}"}


def started(mosquitto: Mosquitto, tmp_path: Path, *, gpus: bool) -> Any:
    metrics = free_port()
    extra = (
        f'[agent.nvml]\ngpu_root = "{gpu_root(tmp_path, gpus=gpus)}"\n\n'
        f'[agent.metrics]\nhost = "127.0.0.1"\nport = {metrics}\n'
    )
    stack = one_node(
        mosquitto, tmp_path, agent_extra=extra, api_port=free_port(), agent_env=without_nvml(tmp_path)
    )
    return stack, metrics


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def sample(text: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """The samples of ``name`` whose labels include ``labels``: (all labels, value)."""
    out = []
    for line in text.splitlines():
        match = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if match is None:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(1)))
        if all(found.get(k) == v for k, v in labels.items()):
            out.append((found, float(match.group(2))))
    return out


def ftd(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ftd.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "FTD_SOCKET": node.socket},
    )


def health(node: Node) -> dict[str, Any]:
    return dict(json.loads(ftd(node, "health", "--socket", node.socket, "--json", "--timeout", "5").stdout))


def status_nodes(node: Node) -> list[dict[str, Any]]:
    out = ftd(node, "status", "--url", str(node.api), "--json")
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout)["nodes"])


@pytest.fixture
def gpu_node(mosquitto: Mosquitto, tmp_path: Path) -> Iterator[tuple[Node, int]]:
    stack, metrics = started(mosquitto, tmp_path, gpus=True)
    with stack as node:
        yield node, metrics


@pytest.fixture
def cpu_node(mosquitto: Mosquitto, tmp_path: Path) -> Iterator[tuple[Node, int]]:
    stack, metrics = started(mosquitto, tmp_path, gpus=False)
    with stack as node:
        yield node, metrics


def test_a_gpu_node_without_working_nvml_is_a_condition_and_its_watcher_is_down(
    gpu_node: tuple[Node, int],
) -> None:
    node, metrics = gpu_node
    wait_until(
        lambda: sample(scrape(metrics), "ftd_agent_watcher_up", watcher="nvml"), 20, "the nvml watcher"
    )

    def unavailable() -> list[tuple[dict[str, str], float]]:
        return sample(scrape(metrics), "ftd_agent_watcher_state", watcher="nvml", state="unavailable")

    wait_until(unavailable, 20, "the nvml watcher to say it is unavailable")
    [(labels, value)] = unavailable()
    assert value == 1 and labels["reason"], labels
    assert sample(scrape(metrics), "ftd_agent_watcher_up", watcher="nvml")[0][1] == 0
    assert sample(scrape(metrics), "ftd_agent_watcher_up", watcher="kmsg")[0][1] == 1  # the others are fine

    # the node's condition: the health check fails it, with the reason
    wait_until(lambda: health(node)["conditions"], 20, "the node's condition")
    [condition] = health(node)["conditions"]
    assert condition["reason"].startswith("nvml unavailable on a node with NVIDIA GPUs"), condition
    assert "0000:3b:00.0" in condition["reason"], condition
    done = ftd(node, "health", "--socket", node.socket, "--timeout", "5")
    assert done.returncode == 1 and "nvml unavailable" in done.stdout, done

    # ... and the coordinator shows it: ftd status lists the node among the problems
    wait_until(lambda: status_nodes(node)[0].get("conditions"), 20, "the condition in ftd status")
    [shown] = status_nodes(node)[0]["conditions"]
    assert shown == condition["reason"]
    table = ftd(node, "status", "--url", str(node.api), "--problems")
    assert "nvml unavailable" in table.stdout, table.stdout
    [event] = [e for e in node.ledger_events("agent_health") if e["data"].get("watcher") == "nvml"]
    assert event["severity"] == "error" and event["data"]["problem"] == "watcher_unavailable", event


def test_a_node_without_gpus_and_without_nvml_is_not_a_problem(cpu_node: tuple[Node, int]) -> None:
    node, metrics = cpu_node

    def idle() -> list[tuple[dict[str, str], float]]:
        return sample(scrape(metrics), "ftd_agent_watcher_state", watcher="nvml", state="idle")

    wait_until(idle, 20, "the nvml watcher to say it has nothing to watch")
    [(labels, _)] = idle()
    assert "no NVIDIA GPU" in labels["reason"], labels
    assert sample(scrape(metrics), "ftd_agent_watcher_up", watcher="nvml")[0][1] == 1
    assert health(node)["conditions"] == []
    assert not status_nodes(node)[0].get("conditions")
