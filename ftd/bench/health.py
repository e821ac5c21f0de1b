"""``ftd bench health``: how long Slurm's HealthCheckProgram (``ftd health``) takes.

Why: slurmd runs it every ``HealthCheckInterval`` on every node, and the check must finish well
under a second, also when the agent is down (issue #12). Measured on this host, as whole processes
the way slurmd starts them (interpreter start included), each ``runs`` times:

- ``module``: ``python -m ftd.commands.health`` (``deploy/slurm/healthcheck.sh`` with ``FTD_PYTHON``)
  against a live agent socket (a real :class:`~ftd.agent.local_api.LocalApi` answering from a real
  :class:`~ftd.agent.conditions.ConditionBook` with one active condition, on its own event loop in a
  thread of this process);
- ``cli``: the same through the ``ftd`` command (every sub-command module is imported first);
- ``agent_down``: the module path with no socket (the warning path);
- ``query_ms``: the socket question alone, in-process (connect, ask, read the answer).

Without ``--slurm`` (no scontrol call): that part is Slurm's own cost.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


def _serve(path: str, ready: threading.Event, stop: threading.Event) -> None:
    from ftd.agent.conditions import ConditionBook
    from ftd.agent.local_api import LocalApi
    from ftd.client import protocol
    from ftd.events import Kind, make_event

    book = ConditionBook(None, boot="bench")
    book.observe(
        make_event("bench-1", Kind.XID, severity="critical", data={"code": 79, "pci": "0000:3b:00.0"})
    )

    async def hook(_msg: Any) -> dict[str, Any]:
        conditions = [c.to_dict() for c in book.active()]
        return {
            "v": protocol.PROTOCOL_VERSION,
            "op": protocol.CONDITIONS,
            "node": "bench-1",
            "conditions": conditions,
        }

    async def nothing(*_args: Any) -> None:
        return None

    async def main() -> None:
        api = LocalApi(path, "bench-1", nothing, nothing, on_hook=hook)
        await api.start()
        ready.set()
        await asyncio.to_thread(stop.wait)
        await api.stop()

    asyncio.run(main())


def _time(argv: list[str], runs: int) -> list[float]:
    took = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, capture_output=True, timeout=30)
        took.append(time.perf_counter() - started)
    return took


def bench_health(runs: int = 20) -> dict[str, Any]:
    from ftd.client.ask import ask_conditions

    tmp = tempfile.mkdtemp(prefix="ftd-bench-health-", dir="/tmp")
    path = os.path.join(tmp, "agent.sock")
    ready, stop = threading.Event(), threading.Event()
    server = threading.Thread(target=_serve, args=(path, ready, stop), daemon=True)
    server.start()
    try:
        if not ready.wait(10):
            raise RuntimeError("the bench agent socket did not come up")
        module = [sys.executable, "-m", "ftd.commands.health", "--socket", path]
        cli = [sys.executable, "-m", "ftd.cli", "health", "--socket", path]
        down = [sys.executable, "-m", "ftd.commands.health", "--socket", os.path.join(tmp, "absent.sock")]
        queries = []
        for _ in range(runs * 10):
            started = time.perf_counter()
            reply = ask_conditions(path, 1.0)
            queries.append(time.perf_counter() - started)
        assert len(reply["conditions"]) == 1
        result: dict[str, Any] = {
            "runs": runs,
            "module": _percentiles(_time(module, runs)),
            "cli": _percentiles(_time(cli, runs)),
            "agent_down": _percentiles(_time(down, runs)),
            "query_ms": _percentiles(queries),
        }
    finally:
        stop.set()
        server.join(5)
        shutil.rmtree(tmp, ignore_errors=True)
    module_, cli_, down_, query_ = (result[k] for k in ("module", "cli", "agent_down", "query_ms"))
    result["summary"] = (
        f"ftd health: module p50 {module_['p50_ms']} ms, cli p50 {cli_['p50_ms']} ms, "
        f"agent down p50 {down_['p50_ms']} ms, socket question p50 {query_['p50_ms']} ms"
    )
    return result


__all__ = ["bench_health"]
