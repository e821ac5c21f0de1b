#!/usr/bin/env python3
"""Read every GPU through ftd's real NVML backend and run the NVML watcher for a while.

Prints one JSON object: per GPU the inventory, ECC counters, remapped rows, histogram, retired pages,
temperature, throttle reasons, power, PCIe replays, NVLink support (what answered NotSupported),
timings per call, and every event the watcher emitted while running ``--seconds``.

    python scripts/nvml_probe.py [--seconds 10] [--interval 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ftd.agent.watchers.nvml.backend import NvmlError, NvmlNotSupported, throttle_names
from ftd.agent.watchers.nvml.real import RealNvml
from ftd.agent.watchers.nvml.watcher import NvmlWatcher
from ftd.config import NvmlConfig
from ftd.events import Event, to_builtins

QUESTIONS = (
    "ecc_counters",
    "remapped_rows",
    "remap_histogram",
    "retired_pages_pending",
    "temperature_c",
    "throttle_reasons",
    "power_w",
    "pcie_replay_count",
    "nvlink_errors",
)


def read_all(backend: RealNvml) -> dict[str, Any]:
    out: dict[str, Any] = {"device_count": backend.device_count(), "gpus": []}
    for index in range(out["device_count"]):
        gpu: dict[str, Any] = {"identity": dataclasses.asdict(backend.identity(index)), "timings_us": {}}
        for name in QUESTIONS:
            start = time.perf_counter()
            try:
                value: Any = getattr(backend, name)(index)
                if dataclasses.is_dataclass(value) and not isinstance(value, type):
                    value = dataclasses.asdict(value)
            except NvmlNotSupported as exc:
                value = {"not_supported": str(exc)}
            except NvmlError as exc:
                value = {"error": str(exc)}
            gpu["timings_us"][name] = round((time.perf_counter() - start) * 1e6, 1)
            gpu[name] = value
        if isinstance(gpu.get("throttle_reasons"), int):
            gpu["throttle_reason_names"] = throttle_names(gpu["throttle_reasons"])
        out["gpus"].append(gpu)
    try:
        backend.xid_events_start()
        out["xid_events"] = "supported (registered nvmlEventTypeXidCriticalError)"
        start = time.perf_counter()
        record = backend.xid_wait(200)
        out["xid_wait_200ms"] = {
            "record": None if record is None else dataclasses.asdict(record),
            "took_ms": round((time.perf_counter() - start) * 1e3, 1),
        }
        backend.xid_events_stop()
    except NvmlError as exc:
        out["xid_events"] = f"unavailable: {exc}"
    return out


async def watch(seconds: float, interval: float) -> dict[str, Any]:
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    watcher = NvmlWatcher(NvmlConfig(interval_s=interval), "probe-node", emit)
    task = asyncio.create_task(watcher.run())
    await asyncio.sleep(seconds)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return {
        "available": watcher.available,
        "disabled_reason": watcher.disabled_reason,
        "polls": watcher.polls,
        "xid_supported": watcher.xid_supported,
        "gpus": {
            u: {
                "index": s.ident.index,
                "pci": s.ident.pci,
                "unsupported": sorted(s.unsupported),
                "last_sample": None if s.last is None else dataclasses.asdict(s.last),
            }
            for u, s in watcher.gpus.items()
        },
        "events": [to_builtins(e) for e in events],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    result: dict[str, Any] = {}
    backend = RealNvml()
    try:
        backend.init()
    except NvmlError as exc:
        result["direct"] = {"unavailable": str(exc)}
    else:
        try:
            result["direct"] = read_all(backend)
        finally:
            backend.shutdown()
    result["watcher"] = asyncio.run(watch(args.seconds, args.interval))
    print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
