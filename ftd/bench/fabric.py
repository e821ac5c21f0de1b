"""``ftd bench fabric``: what one poll of the fabric watcher costs on a full node, and how soon a
counter crossing its threshold is an event.

What: a node's sysfs laid out in a temporary root the way the kernel lays it out (8 InfiniBand ports,
each with its ``counters/`` and ``hw_counters/``, a network device and a PCI function behind a PCIe
switch shared with one of 8 GPUs; the GPUs' PCIe links), 8 GPUs with NVLink through
:class:`~ftd.agent.watchers.nvml.fake.FakeNvml`, the ``h100-sxm`` profile. The
:class:`~ftd.agent.watchers.fabric.FabricWatcher` reads and judges it ``--samples`` times (the read
and the judgement timed together, its state file written each time, as on a node); then, ``trials``
times, one port's ``symbol_error`` jumps over the per-hour limit and the bench counts the polls until
the ``fabric`` event (the issue's target: within two polls).

Figures: ``poll_p50_ms``, ``poll_p99_ms`` (one read + judgement + state save), ``polls_to_event``
(the most any trial took), ``events`` (the counter events, one per trial), ``files_read`` (per poll,
counted from the tree).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from ftd.agent.watchers.fabric import FabricWatcher
from ftd.agent.watchers.nvml.fake import FakeNvml
from ftd.config.schema import FabricConfig, HardwareConfig
from ftd.events import Event, Kind

PORTS = 8
_IB = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors", "local_link_integrity_errors",
       "excessive_buffer_overrun_errors", "port_xmit_discards", "port_rcv_remote_physical_errors",
       "port_xmit_wait", "port_xmit_data", "port_rcv_data")  # fmt: skip
_HW = ("out_of_buffer", "np_cnp_sent", "np_ecn_marked_roce_packets", "rp_cnp_handled", "rp_cnp_ignored")


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _function(root: Path, chain: str, bdf: str, vendor: str, klass: str) -> None:
    real = f"sys/devices/{chain}/{bdf}"
    for name, text in (("vendor", vendor), ("class", klass), ("current_link_speed", "32.0 GT/s PCIe"),
                       ("max_link_speed", "32.0 GT/s PCIe"), ("current_link_width", "16"),
                       ("max_link_width", "16")):  # fmt: skip
        _write(root, f"{real}/{name}", text + "\n")
    link = root / "sys" / "bus" / "pci" / "devices" / bdf
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(f"../../../devices/{chain}/{bdf}", link)


def node_tree(root: Path) -> list[str]:
    """8 GPU + NIC pairs, each pair behind its own PCIe switch; the GPUs' addresses."""
    gpus = []
    for i in range(PORTS):
        switch = f"pci0000:{i:02x}/0000:{i:02x}:01.0/0000:{0x10 + i:02x}:00.0"
        gpu, nic = f"0000:{0x20 + i:02x}:00.0", f"0000:{0x40 + i:02x}:00.0"
        _function(root, f"{switch}/0000:{0x18 + i:02x}:00.0", gpu, "0x10de", "0x030200")
        _function(root, f"{switch}/0000:{0x18 + i:02x}:01.0", nic, "0x15b3", "0x020700")
        port = f"sys/class/infiniband/mlx5_{i}/ports/1"
        for name, text in (("state", "4: ACTIVE"), ("phys_state", "5: LinkUp"), ("link_layer", "InfiniBand"),
                           ("rate", "400 Gb/sec (4X NDR)")):  # fmt: skip
            _write(root, f"{port}/{name}", text + "\n")
        for name in _IB:
            _write(root, f"{port}/counters/{name}", "0\n")
        for name in _HW:
            _write(root, f"{port}/hw_counters/{name}", "0\n")
        chain = f"{switch}/0000:{0x18 + i:02x}:01.0/{nic}"
        _write(root, f"sys/devices/{chain}/net/ibp{0x40 + i}s0/dev_port", "0\n")
        os.symlink(
            f"../../../devices/{chain}", root / "sys" / "class" / "infiniband" / f"mlx5_{i}" / "device"
        )
        gpus.append(gpu)
    return gpus


def bench_fabric(samples: int = 200, trials: int = 20) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ftd-bench-fabric-") as tmp:
        root = Path(tmp) / "root"
        gpus = node_tree(root)
        nvml = FakeNvml(count=PORTS)
        for gpu, pci in zip(nvml.gpus, gpus, strict=True):
            gpu.pci = pci
            gpu.with_nvlink(18)

        async def emit(event: Event) -> None:
            return None

        watcher = FabricWatcher(
            FabricConfig(ethtool="/nonexistent/ethtool"),
            "bench",
            emit,
            hardware=HardwareConfig(profile="h100-sxm"),
            state_path=Path(tmp) / "state" / "fabric.json",
            root=root,
            backend=nvml,
        )
        now = 1_000_000.0
        times = []
        for _ in range(samples):
            start = time.perf_counter()
            watcher.check(watcher.read(), now)
            times.append((time.perf_counter() - start) * 1000.0)
            now += 30.0
        most, events = 0, 0
        for trial in range(trials):
            port = root / "sys" / "class" / "infiniband" / f"mlx5_{trial % PORTS}" / "ports" / "1"
            value = int((port / "counters" / "symbol_error").read_text()) + 500
            (port / "counters" / "symbol_error").write_text(f"{value}\n")
            for polls in range(1, 4):
                found = [e for e in watcher.check(watcher.read(), now) if _counter(e)]
                now += 30.0
                if found:
                    events += len(found)
                    most = max(most, polls)
                    break
            else:
                most = max(most, 99)
            now += 3700.0  # an hour later the condition clears: the next trial crosses afresh
            watcher.check(watcher.read(), now)
        files = sum(1 for _ in root.rglob("*") if _.is_file())
    times.sort()
    return {
        "samples": samples,
        "poll_p50_ms": round(statistics.median(times), 3),
        "poll_p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))], 3),
        "trials": trials,
        "polls_to_event": most,
        "events": events,
        "files_in_tree": files,
    }


def _counter(event: Event) -> bool:
    return (
        event.kind == Kind.FABRIC
        and event.data.get("check") == "counter"
        and event.data["status"] == "crossed"
    )
