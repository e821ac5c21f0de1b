"""``ftd bench inventory``: 10,000 nodes' inventories held by the coordinator, and drift found in them.

What (issue #36's targets): ``nodes`` inventories as the agents send them (event data: eight GPUs
with their own serials, eight NICs, half the nodes ``h100-sxm`` and half ``h200-sxm``, three of them
drifted: an old driver, one VBIOS, one NIC firmware) are folded into the coordinator's
:class:`~ftd.coordinator.model.inventory.InventoryBook`; ``held_mb`` is what the book holds
(``tracemalloc``: the bytes still allocated after ingest, the inputs excluded), ``drift_s`` one
drift pass over every node, and the three drifted nodes must be exactly those found, each naming its
field. Then the agent's side on 16 nodes (:class:`~ftd.agent.inventory.reporter.InventoryReporter`
on the NVML fake, its events folded as the engine folds them): 16 identical nodes raise no
condition; one node's driver changed under its agent raises one, naming ``driver``, on its first
report after the change (``reports_to_condition``: within one report interval); the same for VBIOS.
"""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc
from pathlib import Path
from typing import Any

DRIFTED = {"node-01234": "driver", "node-04321": "vbios", "node-07777": "nic_firmware"}


def _inventory_data(i: int) -> dict[str, Any]:
    from ftd.platform.inventory import GpuFacts, Inventory, NicFacts, known, unknown

    h200 = i % 2 == 0
    name = f"node-{i:05d}"
    driver = "535.104.05" if DRIFTED.get(name) == "driver" else "550.54.15"
    vbios = "96.00.89.00.01" if not h200 else "96.00.A1.00.01"
    odd_vbios = "96.00.74.00.1C" if DRIFTED.get(name) == "vbios" else vbios
    fw = "28.38.1000" if DRIFTED.get(name) == "nic_firmware" else "28.39.1002"
    gpu_name = "NVIDIA H200" if h200 else "NVIDIA H100 80GB HBM3"
    gpus = [
        GpuFacts(g, known(gpu_name), known(f"1652{i:06d}{g:03d}"), known(odd_vbios if g == 3 else vbios))
        for g in range(8)
    ]
    nics = [NicFacts(f"mlx5_{n}", known(fw), known("MT_0000000838")) for n in range(8)]
    vbios_fact = ",".join(sorted({vbios, odd_vbios}))
    return Inventory(
        profile=known("h200-sxm" if h200 else "h100-sxm"),
        driver=known(driver),
        cuda=known("12.4"),
        vbios=known(vbios_fact),
        gpu_serials=known(",".join(g.serial.value for g in gpus)),
        nic_firmware=known(fw),
        ofed=known("MLNX_OFED_LINUX-23.10-1.1.9.0"),
        nccl=unknown("no job on this node has printed NCCL's version yet"),
        kernel=known("5.15.0-91-generic"),
        os=known("Ubuntu 22.04.3 LTS"),
        gpus=gpus,
        nics=nics,
    ).to_data()


def _held(nodes: int) -> dict[str, Any]:
    from ftd.catalog.hardware_profiles import load_hardware_catalog
    from ftd.coordinator.model.inventory import InventoryBook

    catalog = load_hardware_catalog()
    datas = [_inventory_data(i) for i in range(nodes)]
    book = InventoryBook()
    book.configure(
        minimums=lambda p: catalog.section("versions", p),
        action="warn",
        fields=("driver", "cuda", "vbios", "nic_firmware", "ofed", "kernel", "os"),
        min_peers=3,
    )
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    started = time.perf_counter()
    for i, data in enumerate(datas):
        book.note(f"node-{i:05d}", data, ts=1000.0)
    ingest_s = time.perf_counter() - started
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    started = time.perf_counter()
    book.refresh()
    drift_s = time.perf_counter() - started
    found = {node: list(report.fields) for node, report in book.drifted().items()}
    expected = {node: [field] for node, field in DRIFTED.items() if int(node[5:]) < nodes}
    return {
        "nodes": nodes,
        "held_mb": round(held / (1 << 20), 1),
        "ingest_s": round(ingest_s, 3),
        "drift_s": round(drift_s, 3),
        "drifted_found": found,
        "drifted_right": found == expected,
    }


async def _sixteen(root: Path) -> dict[str, Any]:
    from ftd.agent.inventory.reporter import InventoryReporter
    from ftd.agent.watchers.nvml.fake import FakeNvml
    from ftd.catalog.hardware_profiles import load_hardware_catalog
    from ftd.config.schema import InventoryConfig
    from ftd.coordinator.model.state import ClusterState
    from ftd.events import Event

    catalog = load_hardware_catalog()
    state = ClusterState()
    state.inventory.configure(minimums=lambda p: catalog.section("versions", p), action="warn",
                              fields=("driver", "cuda", "vbios", "nic_firmware", "ofed", "kernel", "os"),
                              min_peers=3)  # fmt: skip

    async def fold(event: Event) -> None:  # what the engine does with each event (apply_event)
        state.apply_event(event)

    gpus = [FakeNvml(8) for _ in range(16)]
    agents = [
        InventoryReporter(InventoryConfig(ofed_command=""), f"n{i:02d}", fold, nvml=gpus[i], root=root)
        for i in range(16)
    ]
    for agent in agents:
        await agent.report_once()
    identical = len(state.refresh_drift())
    out: dict[str, Any] = {"identical_16_conditions": identical}
    for field in ("driver", "vbios"):
        if field == "driver":
            gpus[7].driver = "535.104.05"  # the driver upgraded (here: downgraded) under node 7's agent
        else:
            gpus[11].gpu(2).vbios = "96.00.74.00.1C"  # one GPU of node 11 flashed
        reports = 0
        raised: list[str] = []
        while not raised and reports < 3:
            for agent in agents:
                await agent.report_once()
            reports += 1
            raised = [f"{c.node}: {', '.join(c.report.fields)}" for c in state.refresh_drift() if c.raised]
        out[f"{field}_reports_to_condition"] = reports
        out[f"{field}_condition"] = raised
        out[f"{field}_named"] = any(r.endswith(field) for r in raised) and len(raised) == 1
    return out


def bench_inventory(nodes: int = 10_000) -> dict[str, Any]:
    """Issue #36's inventory figures (see the module docstring)."""
    import tempfile

    result = _held(nodes)
    with tempfile.TemporaryDirectory() as tmp:
        result.update(asyncio.run(_sixteen(Path(tmp))))
    return result
