"""Memory probes for :meth:`ftd.client.Client.memory_guard`: how close this rank is to an OOM kill.

What: this process's RSS and the host's ``MemTotal``; the memory cgroup's working set and limit
(v2, else v1); the current CUDA device's reserved and total memory when the trainer already
imported torch; and :func:`readings`, which compares them with a threshold. Why apart: these read
``/proc`` and ``/sys`` files whose formats have nothing to do with talking to the agent. Each probe
returns None when it cannot tell; torch is never imported here (only looked up in ``sys.modules``).
"""

from __future__ import annotations

import os
import sys

from ftd.client.files import read_text

TYPE_CHECKING = False  # not imported from typing: keeps `import ftd.client` light
if TYPE_CHECKING:
    from typing import Any

__all__ = ["cgroup_memory", "cuda_memory", "mem_total", "process_rss", "readings"]


def readings(max_fraction: float, gpu: bool) -> tuple[dict[str, Any], list[str]]:
    """(report, what is over ``max_fraction``): the report is ``{"host"|"cgroup"|"gpu": {used,
    limit, fraction}}`` for the probes that could tell; the list says, one phrase each, which
    are above the threshold (empty: none)."""
    report: dict[str, Any] = {}
    over: list[str] = []
    rss, total = process_rss(), mem_total()
    if rss is not None and total:
        report["host"] = {"used": rss, "limit": total, "fraction": rss / total}
        if rss > max_fraction * total:
            over.append(f"host rss {rss / total:.0%} of MemTotal")
    cgroup = cgroup_memory()
    if cgroup is not None:
        used, limit = cgroup
        report["cgroup"] = {"used": used, "limit": limit, "fraction": used / limit}
        if used > max_fraction * limit:
            over.append(f"cgroup memory {used / limit:.0%} of its limit")
    if gpu:
        cuda = cuda_memory()
        if cuda is not None:
            used, limit = cuda
            report["gpu"] = {"used": used, "limit": limit, "fraction": used / limit}
            if used > max_fraction * limit:
                over.append(f"gpu reserved {used / limit:.0%} of device memory")
    return report, over


def process_rss() -> int | None:
    text = read_text("/proc/self/statm")
    if text is None:
        return None
    return int(text.split()[1]) * os.sysconf("SC_PAGE_SIZE")


def mem_total() -> int | None:
    text = read_text("/proc/meminfo")
    for line in (text or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def cgroup_memory() -> tuple[int, int] | None:
    """(working set, limit) of this process's memory cgroup, if it has a limit (v2, else v1)."""
    text = read_text("/proc/self/cgroup") or ""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":  # cgroup v2
            base = "/sys/fs/cgroup" + parts[2].rstrip("/")
            limit_text, usage_text = read_text(base + "/memory.max"), read_text(base + "/memory.current")
            stat_key = "inactive_file"
        elif "memory" in parts[1].split(","):  # cgroup v1
            base = "/sys/fs/cgroup/memory" + parts[2].rstrip("/")
            limit_text = read_text(base + "/memory.limit_in_bytes")
            usage_text = read_text(base + "/memory.usage_in_bytes")
            stat_key = "total_inactive_file"
        else:
            continue
        if not limit_text or not usage_text or limit_text.strip() == "max":
            continue
        limit, usage = int(limit_text), int(usage_text)
        if limit <= 0 or limit >= 1 << 60:  # v1 spells "no limit" as a huge number
            continue
        for stat_line in (read_text(base + "/memory.stat") or "").splitlines():
            key, _, value = stat_line.partition(" ")
            if key == stat_key:
                usage -= int(value)
                break
        return max(usage, 0), limit
    return None


def cuda_memory() -> tuple[int, int] | None:
    """(reserved, total) bytes of the current CUDA device, only if the trainer imported torch."""
    torch: Any = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    device = torch.cuda.current_device()
    return int(torch.cuda.memory_reserved(device)), int(torch.cuda.get_device_properties(device).total_memory)
