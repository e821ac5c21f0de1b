"""Whether a node has NVIDIA GPUs without NVML (issue #32 item 3): :func:`find_gpus` reads what the
driver and the kernel show under a root laid out here like a host's /proc, /dev and /sys."""

from __future__ import annotations

from pathlib import Path

from ftd.agent.watchers.nvml.presence import find_gpus


def pci_device(root: Path, address: str, vendor: str, klass: str) -> None:
    device = root / "sys" / "bus" / "pci" / "devices" / address
    device.mkdir(parents=True)
    (device / "vendor").write_text(vendor + "\n")
    (device / "class").write_text(klass + "\n")


def test_nothing_there_is_no_gpu(tmp_path: Path) -> None:
    assert find_gpus(str(tmp_path)) == []
    assert find_gpus(str(tmp_path / "absent")) == []


def test_the_drivers_entries_and_device_nodes_are_gpus(tmp_path: Path) -> None:
    (tmp_path / "proc" / "driver" / "nvidia" / "gpus" / "0000:3b:00.0").mkdir(parents=True)
    (tmp_path / "dev").mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvme0"):
        (tmp_path / "dev" / name).touch()
    assert find_gpus(str(tmp_path)) == [
        "proc/driver/nvidia/gpus/0000:3b:00.0",
        "dev/nvidia0",
        "dev/nvidia1",
    ]


def test_a_pci_gpu_counts_without_any_driver_but_not_nvidias_other_functions(tmp_path: Path) -> None:
    pci_device(tmp_path, "0000:3b:00.0", "0x10de", "0x030200")  # 3D controller: an H100
    pci_device(tmp_path, "0000:3b:00.1", "0x10de", "0x040300")  # the GPU's audio function
    pci_device(tmp_path, "0000:05:00.0", "0x10de", "0x068000")  # an NVSwitch (bridge class)
    pci_device(tmp_path, "0000:00:02.0", "0x8086", "0x030000")  # another vendor's VGA
    pci_device(tmp_path, "0000:17:00.0", "0x10de", "0x030000")  # a VGA-class NVIDIA board
    assert find_gpus(str(tmp_path)) == [
        "sys/bus/pci/devices/0000:17:00.0",
        "sys/bus/pci/devices/0000:3b:00.0",
    ]
