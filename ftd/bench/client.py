"""``ftd bench client``: the trainer client's per-step cost, and directive latency through a local API.

Why: the client runs inside every training step, so its cost must stay negligible (target:
``heartbeat(step)`` + ``should_save()`` + ``should_stop()`` <= 20 µs per step with nothing pending;
in practice it is a fraction of a microsecond). Measured twice:

- ``no_agent``: the socket does not exist (the fail-open path; the I/O thread keeps retrying);
- ``connected``: a real :class:`ftd.agent.local_api.LocalApi` on a unix socket, served by its own
  event loop in a thread of this process, with the client registered and heartbeating.

With an agent, it also measures directive latency: ``LocalApi.deliver(save)`` called on the
agent's loop -> the client's I/O thread has read it (``Client.last_directive_ns``), both on
``time.perf_counter_ns()``. Agent, client I/O thread and the measuring thread share one process
(and its GIL), so this is an upper bound of what separate processes see.
The connected part needs the daemon extra (msgspec, structlog); without it only ``no_agent`` runs.

With torch installed, ``torch_agree_us`` is the cost of one :meth:`ftd.client.torch.TorchCoordinator.agree`
(an all-reduce MAX of two int32 on a one-rank gloo group on this host: the fixed per-call overhead,
not the network latency of a real job — call it every N steps when that matters), measured apart
from ``us_per_step``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import threading
import time

from ftd.client import Client

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _per_step_us(client: Client, steps: int) -> float:
    heartbeat, should_save, should_stop = client.heartbeat, client.should_save, client.should_stop
    best = float("inf")
    for _ in range(3):  # best of three: the I/O thread and other tenants add noise
        start = time.perf_counter_ns()
        for step in range(steps):
            heartbeat(step)
            if should_save():
                client.ack_saved(step)
            if should_stop():
                break
        best = min(best, (time.perf_counter_ns() - start) / steps / 1000.0)
    return best


def _wait_for(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


async def _timed_deliver(api: Any, directive: Any) -> int:
    """Deliver on the agent's loop; return perf_counter_ns() taken just before ``deliver``."""
    sent = time.perf_counter_ns()
    await api.deliver(directive)
    return sent


def _bench_connected(steps: int, latency_samples: int) -> dict[str, Any]:
    from ftd.agent.local_api import LocalApi
    from ftd.events import Ack, Directive, RankInfo
    from ftd.logs import configure

    configure("warning")  # per-directive info lines would dominate the latency being measured

    tmp = tempfile.mkdtemp(prefix="ftdb", dir="/tmp")
    path = os.path.join(tmp, "a.sock")
    loop = asyncio.new_event_loop()
    acks: list[Ack] = []

    async def on_presence(job: str, ranks: list[RankInfo]) -> None:
        return None

    async def on_ack(ack: Ack) -> None:
        acks.append(ack)

    api = LocalApi(path, "bench", on_presence, on_ack)
    thread = threading.Thread(target=loop.run_forever, name="ftd-bench-agent", daemon=True)
    thread.start()
    client: Client | None = None
    try:
        asyncio.run_coroutine_threadsafe(api.start(), loop).result(10)
        client = Client(job="bench", rank=0, socket_path=path)
        if not _wait_for(lambda: client is not None and client.connected, 10.0):
            raise RuntimeError("client did not register with the bench agent")
        us = _per_step_us(client, steps)
        latencies: list[float] = []
        for i in range(latency_samples):
            directive = Directive(id=f"bench-{i}", ts=time.time(), action="save", job="bench")
            sent = asyncio.run_coroutine_threadsafe(_timed_deliver(api, directive), loop).result(5)
            if client.wait(5.0) != "save" or client.last_directive_ns is None:
                raise RuntimeError("save directive did not arrive")
            latencies.append((client.last_directive_ns - sent) / 1000.0)
            client.ack_saved(i)
        _wait_for(lambda: len(acks) >= latency_samples, 5.0)
        latencies.sort()
        return {
            "us_per_step": us,
            "directive_latency_us_p50": statistics.median(latencies) if latencies else None,
            "directive_latency_us_p99": latencies[int(0.99 * (len(latencies) - 1))] if latencies else None,
            "acks_received": len(acks),
        }
    finally:
        if client is not None:
            client.close()
        asyncio.run_coroutine_threadsafe(api.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _bench_agree(calls: int = 2000) -> float | None:
    """Microseconds per ``TorchCoordinator.agree`` on a one-rank gloo group (None without torch)."""
    try:
        import torch.distributed as dist

        from ftd.client.torch import TorchCoordinator
    except ImportError:
        return None
    if dist.is_initialized():
        return None
    tmp = tempfile.mkdtemp(prefix="ftdb", dir="/tmp")
    try:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        with Client(job="bench", rank=0, socket_path=os.path.join(tmp, "absent.sock")) as client:
            coordinator = TorchCoordinator(client)
            for step in range(100):  # warm-up: first collectives set up buffers
                coordinator.agree(step)
            start = time.perf_counter_ns()
            for step in range(calls):
                coordinator.agree(step)
            return (time.perf_counter_ns() - start) / calls / 1000.0
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        shutil.rmtree(tmp, ignore_errors=True)


def bench_client(steps: int = 200_000, latency_samples: int = 200) -> dict[str, Any]:
    """Measure the client's per-step cost without and with an agent; ``us_per_step`` is the worse."""
    tmp = tempfile.mkdtemp(prefix="ftdb", dir="/tmp")
    try:
        with Client(job="bench", rank=0, socket_path=os.path.join(tmp, "absent.sock")) as client:
            no_agent = _per_step_us(client, steps)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result: dict[str, Any] = {"steps": steps, "us_per_step_no_agent": no_agent}
    tmp = tempfile.mkdtemp(prefix="ftdb", dir="/tmp")
    try:  # kill and save switch files configured (absent): one monotonic() per call, a stat per 0.2 s
        with Client(
            job="bench",
            rank=0,
            socket_path=os.path.join(tmp, "absent.sock"),
            stop_file=os.path.join(tmp, "STOP"),
            save_file=os.path.join(tmp, "SAVE"),
        ) as client:
            result["us_per_step_switch_files"] = _per_step_us(client, steps)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    agree_us = _bench_agree()
    if agree_us is not None:
        result["torch_agree_us"] = agree_us
    try:
        connected = _bench_connected(steps, latency_samples)
    except ImportError as exc:  # the daemon extra is not installed
        result["connected_skipped"] = str(exc)
        result["us_per_step"] = no_agent
        return result
    result["us_per_step_connected"] = connected.pop("us_per_step")
    result.update(connected)
    result["us_per_step"] = max(no_agent, result["us_per_step_connected"])
    return result


if __name__ == "__main__":
    import json

    print(json.dumps(bench_client()))
