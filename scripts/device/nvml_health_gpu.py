"""Device check for issue #32 item 3 (not part of the suite): the NVML watcher's honest health on a real
GPU node. Run from the repository root on a GPU machine (``python3 scripts/device/nvml_health_gpu.py``):

1. :func:`find_gpus` on the real root: the driver's /proc and /dev entries and the PCI display/3D
   controllers it finds;
2. the watcher with the real NVML for a few seconds: ``running``, GPUs sampled, no ``agent_health``;
3. the watcher on the same node with an NVML whose init fails (the library missing in an agent image):
   ``unavailable`` naming the real GPUs, one ``agent_health`` error event.

Prints one JSON line per step.
"""

import asyncio
import json
import os
import sys

sys.path.insert(0, os.getcwd())
from ftd.agent.watchers.nvml.presence import find_gpus
from ftd.agent.watchers.nvml.real import RealNvml
from ftd.agent.watchers.nvml.watcher import NvmlWatcher
from ftd.config import NvmlConfig


class BrokenNvml(RealNvml):
    def init(self):
        raise RuntimeError("NVML Shared Library Not Found (the device check's broken NVML)")


async def watch(backend, seconds):
    events = []

    async def emit(event):
        events.append(event)

    watcher = NvmlWatcher(NvmlConfig(interval_s=1.0), "gpu-node", emit, backend=backend)
    task = asyncio.create_task(watcher.run())
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    health = watcher.health()
    return {
        "state": health.state,
        "reason": health.reason,
        "available": watcher.available,
        "polls": watcher.polls,
        "gpus": len(watcher.gpus),
        "events": [(str(e.kind), str(e.severity), e.data.get("problem")) for e in events][:10],
    }


async def main():
    print(json.dumps({"step": "find_gpus", "found": find_gpus("/")}))
    print(json.dumps({"step": "real_nvml", **await watch(None, 6.0)}))
    print(json.dumps({"step": "broken_nvml", **await watch(BrokenNvml(), 3.0)}))


asyncio.run(main())
