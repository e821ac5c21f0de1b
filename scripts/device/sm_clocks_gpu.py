"""Device check for issue #33 item 3 (not part of the suite): the SM clocks the NVML watcher reads and
sends, on a real GPU. Run from the repository root on a GPU machine
(``python3 scripts/device/sm_clocks_gpu.py``):

1. :meth:`RealNvml.sm_clocks_mhz` of every GPU: the SM clock now and its maximum;
2. the watcher with the real NVML, one poll: one info ``thermal`` event per GPU with ``signal``
   ``sm_clocks``, ``sm_mhz`` and ``max_mhz`` matching step 1's maximum.

Prints one JSON line per step.
"""

import asyncio
import json
import os
import sys

sys.path.insert(0, os.getcwd())
from ftd.agent.watchers.nvml.real import RealNvml
from ftd.agent.watchers.nvml.watcher import NvmlWatcher
from ftd.config import NvmlConfig


async def main() -> None:
    nvml = RealNvml()
    nvml.init()
    count = nvml.device_count()
    print(json.dumps({"step": "read", "clocks": [nvml.sm_clocks_mhz(i) for i in range(count)]}), flush=True)
    sent = []

    async def emit(event) -> None:
        sent.append(event)

    watcher = NvmlWatcher(NvmlConfig(interval_s=1.0), "gpu-node", emit, backend=nvml)
    watcher.available = True
    await watcher.poll_once()
    clocks = [e.data for e in sent if e.data.get("signal") == "sm_clocks"]
    print(
        json.dumps(
            {"step": "watcher", "kinds": [str(e.kind) for e in sent], "sm_clocks": clocks}, default=str
        )
    )
    nvml.shutdown()


asyncio.run(main())
