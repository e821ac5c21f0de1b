"""Does this node have NVIDIA GPUs, whatever NVML says? Read from what the kernel and driver show.

What: :func:`find_gpus` lists the evidence of NVIDIA GPUs under a root (``agent.nvml.gpu_root``,
``/`` on a host): the driver's ``proc/driver/nvidia/gpus/<pci>`` entries, its ``dev/nvidia<N>``
device nodes, and PCI devices in ``sys/bus/pci/devices`` with NVIDIA's vendor id (0x10de) and a
display or 3D controller class (0x0300, 0x0302: what ``lspci`` lists as the GPU; NVIDIA's audio and
USB functions and NVSwitches are other classes). Each is one short string, such as
``proc/driver/nvidia/gpus/0000:3b:00.0``; none: an empty list.

Why: without a working NVML the watcher sees nothing, which on a GPU node means every GPU signal is
switched off, and on a CPU node means nothing. The sysfs PCI list works without any NVIDIA software
(a driver that failed to load still leaves the devices there), the other two need the driver. Only
directory listings and two tiny sysfs files per PCI device are read: well under a millisecond.
"""

from __future__ import annotations

import os
import re

__all__ = ["find_gpus"]

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA compatible controller, 3D controller
_DEVICE_RE = re.compile(r"^nvidia\d{1,4}$")
_MAX = 64


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read(64).strip().lower()
    except OSError:
        return ""


def find_gpus(root: str = "/") -> list[str]:
    """Evidence of NVIDIA GPUs under ``root`` (paths relative to it); empty: none found."""
    found: list[str] = []
    procfs = os.path.join(root, "proc/driver/nvidia/gpus")
    found += [f"proc/driver/nvidia/gpus/{name}" for name in _listdir(procfs)]
    found += [f"dev/{name}" for name in _listdir(os.path.join(root, "dev")) if _DEVICE_RE.match(name)]
    pci = os.path.join(root, "sys/bus/pci/devices")
    for name in _listdir(pci):
        if len(found) >= _MAX:
            break
        device = os.path.join(pci, name)
        if _read(os.path.join(device, "vendor")) == NVIDIA_VENDOR and _read(
            os.path.join(device, "class")
        ).startswith(GPU_CLASSES):
            found.append(f"sys/bus/pci/devices/{name}")
    return found[:_MAX]
