"""Host state from sysfs and procfs (#23 part 1): the readers on fake trees laid out as the kernel lays
them out (files in a temporary root, no mocks), and the watcher's changes between two samples:
read-only remounts, md arrays degraded or broken, dead NVMe controllers, IB ports down past the
recovery window (a flap that recovers inside it is no event), EDAC counts. (Port counters are the fabric
watcher's: tests/unit/test_fabric_watcher.py.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from ftd.agent.watchers.host import (
    HostWatcher,
    read_edac,
    read_ib_ports,
    read_md,
    read_mounts,
    read_nvme,
    sample,
)
from ftd.events import Event, Kind

MOUNTS = """\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
/dev/nvme0n1p2 / ext4 rw,relatime 0 0
/dev/md0 /local\\040scratch xfs rw,relatime,attr2 0 0
nfs01:/ckpt /ckpt nfs4 rw,relatime,vers=4.2 0 0
/dev/loop3 /snap/core squashfs ro,nodev,relatime 0 0
"""


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def tree(root: Path) -> Path:
    write(root, "proc/self/mounts", MOUNTS)
    write(root, "sys/block/md0/md/degraded", "0\n")
    write(root, "sys/block/md0/md/array_state", "clean\n")
    write(root, "sys/block/sda/size", "100\n")  # not an md array
    write(root, "sys/class/nvme/nvme0/state", "live\n")
    write(root, "sys/class/nvme/nvme1/state", "live\n")
    for port, state in ((1, "4: ACTIVE"), (2, "1: DOWN")):
        base = f"sys/class/infiniband/mlx5_0/ports/{port}"
        write(root, f"{base}/state", state + "\n")
        write(root, f"{base}/phys_state", "5: LinkUp\n" if "ACTIVE" in state else "3: Disabled\n")
        for counter in ("link_downed", "symbol_error", "port_rcv_errors"):
            write(root, f"{base}/counters/{counter}", "0\n")
    write(root, "sys/devices/system/edac/mc/mc0/ce_count", "3\n")
    write(root, "sys/devices/system/edac/mc/mc0/ue_count", "0\n")
    return root


def test_readers_on_a_fake_tree(tmp_path: Path) -> None:
    root = tree(tmp_path)
    mounts = {m.path: m for m in read_mounts(root)}
    assert mounts["/local scratch"].device == "/dev/md0" and not mounts["/local scratch"].ro
    assert mounts["/snap/core"].ro and mounts["/ckpt"].fstype == "nfs4"
    assert read_md(root) == {"md0": (0, "clean")}
    assert read_nvme(root) == {"nvme0": "live", "nvme1": "live"}
    ports = read_ib_ports(root)
    assert sorted(ports) == [("mlx5_0", 1), ("mlx5_0", 2)]
    assert (ports[("mlx5_0", 1)].state, ports[("mlx5_0", 2)].phys_state) == ("ACTIVE", "Disabled")
    assert read_edac(root) == {"mc0": (3, 0)}


def test_an_empty_root_reads_as_nothing(tmp_path: Path) -> None:
    empty = sample(tmp_path)
    assert (empty.mounts, empty.md, empty.nvme, empty.ib, empty.edac) == ([], {}, {}, {}, {})


def kinds(events: list[Event]) -> list[tuple[str, str, str | None]]:
    return [(e.kind, e.severity, e.data.get("fault")) for e in events]


def test_changes_between_samples(tmp_path: Path) -> None:
    root = tree(tmp_path)
    watcher = HostWatcher("gpu-a01", _no_emit, root=root, ib_window_s=60)
    assert watcher.check(sample(root), 1000.0) == []  # the first sample is the baseline
    write(root, "proc/self/mounts", MOUNTS.replace("/local\\040scratch xfs rw", "/local\\040scratch xfs ro"))
    write(root, "sys/block/md0/md/degraded", "1\n")
    write(root, "sys/class/nvme/nvme1/state", "dead\n")
    write(root, "sys/devices/system/edac/mc/mc0/ue_count", "2\n")
    events = watcher.check(sample(root), 1030.0)
    assert kinds(events) == [
        (Kind.STORAGE, "error", "disk_failed"),
        (Kind.STORAGE, "critical", "dead"),
        (Kind.MACHINE_CHECK, "critical", None),
        (Kind.FS_READONLY, "critical", None),
    ]
    readonly = events[-1]
    assert (readonly.source, readonly.data["device"], readonly.data["mount"], readonly.data["fstype"]) == (
        "host", "md0", "/local scratch", "xfs",
    )  # fmt: skip
    assert events[2].data["extra"]["count"] == 2
    assert watcher.check(sample(root), 1060.0) == []  # the same state again: nothing new


def test_network_and_already_read_only_mounts_are_not_this_nodes_disk(tmp_path: Path) -> None:
    root = tree(tmp_path)
    watcher = HostWatcher("gpu-a01", _no_emit, root=root)
    watcher.check(sample(root), 0.0)
    write(root, "proc/self/mounts", MOUNTS.replace("/ckpt nfs4 rw", "/ckpt nfs4 ro"))
    assert watcher.check(sample(root), 30.0) == []


def test_a_dead_nvme_at_start_is_reported(tmp_path: Path) -> None:
    root = tree(tmp_path)
    write(root, "sys/class/nvme/nvme0/state", "dead\n")
    write(root, "sys/block/md0/md/array_state", "broken\n")
    events = HostWatcher("gpu-a01", _no_emit, root=root).check(sample(root), 0.0)
    assert kinds(events) == [(Kind.STORAGE, "critical", "dead")]  # md: no state before to compare


def test_ib_flap_inside_the_window_is_no_event_a_longer_outage_is_one(tmp_path: Path) -> None:
    root = tree(tmp_path)
    port1 = "sys/class/infiniband/mlx5_0/ports/1"
    watcher = HostWatcher("gpu-a01", _no_emit, root=root, ib_window_s=60)
    watcher.check(sample(root), 0.0)
    write(root, f"{port1}/state", "1: DOWN\n")
    assert watcher.check(sample(root), 30.0) == []  # down, inside the window
    write(root, f"{port1}/state", "4: ACTIVE\n")
    assert watcher.check(sample(root), 60.0) == []  # recovered: a flap, no event
    write(root, f"{port1}/state", "1: DOWN\n")
    assert watcher.check(sample(root), 90.0) == []
    assert watcher.check(sample(root), 120.0) == []
    (event,) = watcher.check(sample(root), 150.0)  # down 60 s: the window is over
    assert (event.kind, event.severity) == (Kind.IB_LINK, "error")
    assert {k: event.data["extra"][k] for k in ("device", "port", "state", "down_s")} == {
        "device": "mlx5_0", "port": 1, "state": "DOWN", "down_s": 60.0,
    }  # fmt: skip
    assert watcher.check(sample(root), 180.0) == []  # reported once
    # Port 2 was never ACTIVE (no cable): never reported, however long it stays down.
    assert all(e.data["extra"]["port"] == 1 for e in [event])


def test_the_watcher_loop_emits(tmp_path: Path) -> None:
    root = tree(tmp_path)
    write(root, "sys/class/nvme/nvme0/state", "dead\n")
    got: list[Event] = []

    async def emit(event: Event) -> None:
        got.append(event)

    async def main() -> None:
        task = asyncio.create_task(HostWatcher("gpu-a01", emit, root=root, interval_s=0.01).run())
        for _ in range(500):
            if got:
                break
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(main())
    assert [(e.kind, e.data["device"]) for e in got] == [(Kind.STORAGE, "nvme0")]


async def _no_emit(event: Event) -> None:
    raise AssertionError("check() is called directly in these tests")
