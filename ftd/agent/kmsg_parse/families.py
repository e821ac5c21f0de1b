"""Host signal families of the kernel log (#23): storage, network filesystems, NICs, GPUDirect,
NVLink link masks, PCIe links below their capability (#35), machine checks, lockups, oopses,
segfaults and resource limits.

What: one small matcher per family (a function of the message text, the line after its prefix),
the table :data:`FAMILIES` that says which cheap substrings send a message to which matcher, and
:func:`family_candidate` (the substring pre-filter :func:`~ftd.agent.kmsg_parse.patterns.is_candidate`
adds for these families). A matcher returns a :class:`Found` (the event's kind, severity, its
documented ``data`` fields -- docs/signals.md -- and ``extra`` context) or ``None``.

Why apart from :mod:`~ftd.agent.kmsg_parse.patterns`: those are NVIDIA-driver formats whose state
(folding, templates) the parser owns; these are kernel and driver formats of the rest of the host,
each independent of the others, so a family is added here as one function and one table row.

Every pattern is linear in the line's length: literal anchors first, bounded repetitions
(``{1,64}``), no nested or unbounded quantifiers over the same characters. Matchers that must look
left of an anchor (the process before ``segfault at``) find the anchor with ``str.find`` and read a
bounded slice.

Lines that are the same driver text from another device are not attributed: EFA admin-queue
messages only count from an EFA device (``infiniband rdmap*`` / ``infiniband efa_*`` / the ``efa``
PCI driver), never from ``ena`` (the Ethernet driver prints identical text) nor from ``mlx5_*``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

from ftd.events import Kind
from ftd.fabric.links import parse_pcie_speed, pcie_gen
from ftd.pci import normalize_pci

__all__ = ["FAMILIES", "Found", "family_candidate", "match_family"]


class Found(NamedTuple):
    """What a family matcher recognised. ``data``: the kind's documented top-level data fields;
    ``fold``: a key under which repeats within a few lines are one incident (a stack trace's
    frames); ``trace``: this line starts a kernel trace (its ``CPU: N PID: N Comm:`` header that
    follows is part of it, not an event of its own)."""

    kind: Kind
    severity: str
    data: dict[str, Any]
    extra: dict[str, Any]
    pci: str | None = None
    pid: int | None = None
    process: str | None = None
    fold: str | None = None
    trace: bool = False


_PCI = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
_DEVICE_RE = re.compile(r"(?:^|\s)([a-z][\w-]{0,31}) (" + _PCI + r")\b")
_FS = r"(EXT[234]-fs|XFS|BTRFS(?: \w{1,8})?)"
_FS_DEV = r"(?: \((?:device )?([^()\s]{1,64})\))?"


def _pci(msg: str) -> tuple[str | None, str | None]:
    """(driver, canonical PCI address) of the first ``driver dddd:bb:dd.f`` in ``msg``."""
    match = _DEVICE_RE.search(msg)
    if match is None:
        return None, None
    return match.group(1), normalize_pci(match.group(2))


def _fstype(word: str | None) -> str | None:
    if not word:
        return None
    return word.split()[0].lower().removesuffix("-fs")


# --- storage --------------------------------------------------------------------------------------

_NVME_TIMEOUT_RE = re.compile(
    r"\bnvme (nvme\d{1,4}): I/O (?:tag )?(\d{1,10}) (?:\(\w{1,8}\) )?(?:opcode (0x[0-9a-fA-F]{1,4}) "
    r"\(([^()]{1,40})\) )?QID (\d{1,5}) timeout(?:, ([a-z ]{1,32}))?"
)
_NVME_STATE_RE = re.compile(
    r"\bnvme (nvme\d{1,4}): (Disabling device after reset failure: (-?\d{1,4})|controller is down; will reset"
    r"|Removing after probe failure status: (-?\d{1,4})|Device not ready; aborting (?:reset|initialisation))"
)
_NVME_PATH_RE = re.compile(r"\bblock (nvme\d{1,4}[cn]\d{1,4}(?:n\d{1,4})?): no available path - failing I/O")
_MD_RE = re.compile(
    r"\bmd/raid(\d{0,2}):?(md[\w-]{1,32}): Disk failure on ([\w-]{1,64})"
    r"(?:,? (detected, failing array|disabling device))"
)
_BLK_RE = re.compile(
    r"\b(critical medium|critical target|critical nexus|critical space allocation|recoverable transport"
    r"|critical protection|I/O|protection|medium) error, dev ([\w-]{1,32}), sector (\d{1,20})"
    r"(?: op 0x[0-9a-fA-F]{1,4}:\((\w{1,20})\))?"
)
_BUFFER_RE = re.compile(
    r"\bBuffer I/O error on (?:dev(?:ice)? )?([\w-]{1,32}), logical block (\d{1,20})(?:, ([a-z ]{1,40}))?"
)
_SUPER_RE = re.compile(r"(?:" + _FS + _FS_DEV + r": )?I/O error while writing superblock")
_FS_ERROR_RE = re.compile(r"\b(EXT[234]-fs) error \(device ([^()\s]{1,64})\)(?::| in) ?(\w{1,64})?")
_XFS_IO_RE = re.compile(r"\bXFS \(([^()\s]{1,64})\): (log I/O error|metadata I/O error|writeback error)")
_XFS_FAULTS = {
    "log I/O error": "log_io_error",
    "metadata I/O error": "metadata_io_error",
    "writeback error": "writeback_error",
}
_BEYOND = "attempt to access beyond end of device"


def _nvme(msg: str) -> Found | None:
    if (match := _NVME_PATH_RE.search(msg)) is not None:
        return _storage(match.group(1), "nvme", "no_available_path", "critical")  # every I/O fails
    if (match := _NVME_TIMEOUT_RE.search(msg)) is not None:
        after = (match.group(6) or "").strip()
        if after == "completion polled":
            return None  # the command completed (a lost interrupt): not a device fault
        extra: dict[str, Any] = {"qid": int(match.group(5))}
        if match.group(4):
            extra["opcode"] = match.group(4)
        if after:
            extra["then"] = after
        severity = "error" if "reset" in after or match.group(5) == "0" else "warning"
        return _storage(match.group(1), "nvme", "timeout", severity, extra)
    if (match := _NVME_STATE_RE.search(msg)) is not None:
        what = match.group(2)
        if what.startswith("Disabling"):
            return _storage(match.group(1), "nvme", "disabled", "critical", {"status": int(match.group(3))})
        if what.startswith("Removing"):
            return _storage(match.group(1), "nvme", "removed", "critical", {"status": int(match.group(4))})
        if what.startswith("Device not ready"):
            return _storage(match.group(1), "nvme", "not_ready", "critical")
        return _storage(match.group(1), "nvme", "controller_down", "error")
    return None


def _storage(
    device: str | None, subsystem: str, fault: str, severity: str, extra: dict[str, Any] | None = None
) -> Found:
    return Found(
        Kind.STORAGE, severity, {"device": device, "subsystem": subsystem, "fault": fault}, extra or {}
    )


def _md(msg: str) -> Found | None:
    match = _MD_RE.search(msg)
    if match is None:
        return None
    failed = match.group(4).startswith("detected")
    extra = {"member": match.group(3), "level": f"raid{match.group(1)}" if match.group(1) else "raid"}
    fault = "array_failed" if failed else "disk_failed"
    return _storage(match.group(2), "md", fault, "critical" if failed else "error", extra)


def _io_error(msg: str) -> Found | None:
    if (match := _SUPER_RE.search(msg)) is not None:
        found = _storage(match.group(2), "fs", "superblock_write_error", "error")
        if match.group(1):
            found.data["fstype"] = _fstype(match.group(1))
        return found
    if (match := _BUFFER_RE.search(msg)) is not None:
        extra: dict[str, Any] = {"block": int(match.group(2))}
        if match.group(3):
            extra["op"] = match.group(3).strip()
        return _storage(match.group(1), "fs", "buffer_io_error", "error", extra)
    if (match := _BLK_RE.search(msg)) is not None:
        extra = {"sector": int(match.group(3)), "error": match.group(1).lower()}
        if match.group(4):
            extra["op"] = match.group(4).lower()
        return _storage(match.group(2), "block", "io_error", "error", extra)
    if (match := _FS_ERROR_RE.search(msg)) is not None:
        found = _storage(
            match.group(2), "fs", "fs_error", "error", {"function": match.group(3)} if match.group(3) else {}
        )
        found.data["fstype"] = _fstype(match.group(1))
        return found
    if (match := _XFS_IO_RE.search(msg)) is not None:
        found = _storage(match.group(1), "fs", _XFS_FAULTS[match.group(2)], "error")
        found.data["fstype"] = "xfs"
        return found
    if _BEYOND in msg:
        return _storage(None, "block", "beyond_end_of_device", "error")
    return None


_RO_RE = re.compile(r"(?:" + _FS + _FS_DEV + r"(?: error)?: )?Remounting filesystem read-only")
_BTRFS_RO_RE = re.compile(
    r"\bBTRFS(?: \w{1,8})? \(device ([^()\s]{1,64})\)(?: state \w{1,16})?: forced readonly"
)
_XFS_DOWN_RE = re.compile(
    r"\bXFS \(([^()\s]{1,64})\): (?:Filesystem has been shut down|Shutting down filesystem)"
)


def _readonly(msg: str) -> Found | None:
    if (match := _RO_RE.search(msg)) is not None:
        data = {"device": match.group(2), "fstype": _fstype(match.group(1))}
        return Found(Kind.FS_READONLY, "critical", data, {})
    if (match := _BTRFS_RO_RE.search(msg)) is not None:
        return Found(Kind.FS_READONLY, "critical", {"device": match.group(1), "fstype": "btrfs"}, {})
    if (match := _XFS_DOWN_RE.search(msg)) is not None:
        return Found(
            Kind.FS_READONLY, "critical", {"device": match.group(1), "fstype": "xfs"}, {"shutdown": True}
        )
    return None


# --- network filesystems --------------------------------------------------------------------------

_NFS_RE = re.compile(r"\bnfs: server (\S{1,255}) (not responding|OK)\b(?:, ([a-z ]{1,20}))?")
_NFS_FRAME_RE = re.compile(
    r"(?<![\w.])(nfs_lock_and_join_requests|nfs_wb_all|nfs_page_async_flush|nfs_writepages_callback)"
    r"\+0x[0-9a-f]{1,8}/0x[0-9a-f]{1,8} \[nfs\]"
)
_LUSTRE_RE = re.compile(
    r"\b(?:Connection to (\S{1,128}) \(at (\S{1,128})\) was lost|Connection restored to (\S{1,128})"
    r" \(at (\S{1,128})\)|This client was evicted by (\S{1,128}?);)"
)


def _netfs(msg: str) -> Found | None:
    if (match := _NFS_RE.search(msg)) is not None:
        up = match.group(2) == "OK"
        extra = {"detail": match.group(3)} if match.group(3) else {}
        state = "recovered" if up else "not_responding"
        return Found(
            Kind.NETFS,
            "info" if up else "error",
            {"fs": "nfs", "server": match.group(1), "state": state},
            extra,
        )
    if "Lock reclaim failed" in msg and "nfs4_reclaim" in msg:
        return Found(Kind.NETFS, "error", {"fs": "nfs", "server": None, "state": "lock_reclaim_failed"}, {})
    if (match := _NFS_FRAME_RE.search(msg)) is not None:
        data = {"fs": "nfs", "server": None, "state": "writeback_hang"}
        return Found(Kind.NETFS, "warning", data, {"frame": match.group(1)}, fold="nfs_writeback")
    if "Lustre" in msg and (match := _LUSTRE_RE.search(msg)) is not None:
        if match.group(1):
            target, server, state, severity = match.group(1), match.group(2), "not_responding", "error"
        elif match.group(3):
            target, server, state, severity = match.group(3), match.group(4), "recovered", "info"
        else:
            target, server, state, severity = match.group(5), None, "evicted", "error"
        return Found(
            Kind.NETFS,
            severity,
            {"fs": "lustre", "server": server or target, "state": state},
            {"target": target},
        )
    return None


# --- NICs -----------------------------------------------------------------------------------------

_MLX5_CMD_TIMEOUT_RE = re.compile(r"\b([A-Z][A-Z0-9_]{1,40})\(0x[0-9a-fA-F]{1,8}\) timeout\b")
_ACCESS_REG_RE = re.compile(
    r"\bmlx5_cmd_out_err\b[^\n]{0,40}?\bACCESS_REG(?:\(0x[0-9a-fA-F]{1,8}\))?"
    r"(?: op_mod\(0x[0-9a-fA-F]{1,8}\))? failed"
)
_SLOT_POWER_RE = re.compile(r"Detected insufficient power on the PCIe slot \((\d{1,4})W\)")
_SYND_RE = re.compile(r"\bsynd (0x[0-9a-fA-F]{1,8}): unrecoverable hardware error")
_WATCHDOG_RE = re.compile(
    r"NETDEV WATCHDOG: (?:CPU: \d{1,5}: )?(\S{1,32}) \((\S{1,32})\): transmit queue (?:(\d{1,5}) )?timed out"
)


def _nic(
    driver: str | None, pci: str | None, fault: str, severity: str, extra: dict[str, Any] | None = None
) -> Found:
    return Found(Kind.NIC, severity, {"driver": driver, "device": pci, "fault": fault}, extra or {}, pci=pci)


def _mlx5(msg: str) -> Found | None:
    if "mlx5" not in msg or "Port module event" in msg:
        return None  # cable and module events: the link parser's (ib_link)
    driver, pci = _pci(msg)
    driver = "mlx5_core" if driver in (None, "mlx5_core") else driver
    if (
        match := _MLX5_CMD_TIMEOUT_RE.search(msg)
    ) is not None or "Will cause a leak of a command resource" in msg:
        extra = {"command": match.group(1)} if match is not None else {}
        return _nic(driver, pci, "cmd_timeout", "critical", extra)
    if _ACCESS_REG_RE.search(msg) is not None:
        return _nic(driver, pci, "access_reg_failed", "warning")
    if "health compromised" in msg:
        return _nic(driver, pci, "health_poll_failed", "critical")
    if (match := _SYND_RE.search(msg)) is not None:
        return _nic(driver, pci, "unrecoverable", "critical", {"syndrome": match.group(1)})
    if (match := _SLOT_POWER_RE.search(msg)) is not None:
        return _nic(driver, pci, "insufficient_slot_power", "warning", {"watts": int(match.group(1))})
    return None


def _watchdog(msg: str) -> Found | None:
    match = _WATCHDOG_RE.search(msg)
    if match is None:
        return None
    extra: dict[str, Any] = {"interface": match.group(1)}
    if match.group(3):
        extra["queue"] = int(match.group(3))
    return _nic(match.group(2), None, "tx_timeout", "info", extra)  # the kernel resets the queue


_EFA_DEVICE_RE = re.compile(r"(?:^|\s)(?:infiniband (rdmap\w{1,32}|efa_\d{1,4})|efa (" + _PCI + r")):")
_EFA_FAULTS = (  # (text, fault, severity): the EFA driver's admin-queue and reset failures
    ("Wait for completion (polling) timeout", "admin_cmd_timeout", "critical"),
    ("didn't send any completion for admin cmd", "admin_cmd_timeout", "critical"),
    ("Admin queue is closed", "admin_queue_closed", "critical"),
    ("Failed to process command", "admin_cmd_failed", "warning"),
    ("Failed to submit command", "admin_cmd_failed", "warning"),
    ("Reset indication didn't turn", "reset_failed", "critical"),
    ("Device isn't ready, can't reset device", "reset_failed", "critical"),
    ("Device isn't ready, abort com init", "not_ready", "critical"),
)


def _efa(msg: str) -> Found | None:
    device = _EFA_DEVICE_RE.search(msg)
    if device is None:
        return None  # ena, mlx5_* or no device: the same text is not an EFA fault
    for text, fault, severity in _EFA_FAULTS:
        if text in msg:
            pci = normalize_pci(device.group(2)) if device.group(2) else None
            extra = {"ibdev": device.group(1)} if device.group(1) else {}
            return _nic("efa", pci, fault, severity, extra)
    return None


# --- GPUDirect, NVLink ----------------------------------------------------------------------------


def _peermem(msg: str) -> Found | None:
    start = msg.find("nvidia-peermem")
    at = msg.find(" ERROR ", start)
    if start < 0 or at < 0 or at - start > 120:
        return None
    detail = msg[at + 7 : at + 200].strip()
    fault = "invalid_context" if "invalid context" in detail else "error"
    return Found(Kind.GPUDIRECT, "error", {"fault": fault}, {"detail": detail})


_NVLINK_RE = re.compile(
    r"NVRM: (?:GPU at PCI:(\S{1,20}) )?(knvlink\w{1,80}): "
    r"(?:Getting peer ?(\d{1,4})'?s? postRxDetLinkMask failed"
    r"|Failed to update Rx Detect Link mask)"
)


def _nvlink(msg: str) -> Found | None:
    match = _NVLINK_RE.search(msg) if "knvlink" in msg else None
    if match is None:
        return None
    extra: dict[str, Any] = {"function": match.group(2)}
    if match.group(3):
        extra["peer"] = int(match.group(3))
    pci = normalize_pci(match.group(1)) if match.group(1) else None
    return Found(Kind.NVLINK, "error", {"fault": "post_rx_detect_failed", "gpu": pci}, extra, pci=pci)


# --- PCIe link bandwidth --------------------------------------------------------------------------

# The PCI core's pcie_print_link_status() at probe: "<driver> <bdf>: 63.008 Gb/s available PCIe
# bandwidth, limited by 8.0 GT/s PCIe x8 link at 0000:00:01.0 (capable of 252.048 Gb/s with 16.0 GT/s
# PCIe x16 link)". The link "at" may be an upstream port (a switch or root port slower than the device).
_PCIE_LIMITED_RE = re.compile(
    r"(?:^|\s)([a-z][\w-]{0,31}) (" + _PCI + r"): (\d{1,5}\.\d{1,3}) Gb/s available PCIe bandwidth, "
    r"limited by (\d{1,3}(?:\.\d{1,2})? GT/s) PCIe x(\d{1,2}) link at (" + _PCI + r") \(capable of "
    r"(\d{1,5}\.\d{1,3}) Gb/s with (\d{1,3}(?:\.\d{1,2})? GT/s) PCIe x(\d{1,2}) link\)"
)


_NIC_DRIVERS = frozenset({"mlx5_core", "mlx4_core", "bnxt_en", "ice", "i40e", "efa", "ena", "irdma"})


def _pcie_limited(msg: str) -> Found | None:
    match = _PCIE_LIMITED_RE.search(msg) if "limited by" in msg else None
    if match is None:
        return None
    driver, bdf, have, cur_speed, cur_width, at, full, max_speed, max_width = match.groups()
    pci = normalize_pci(bdf)
    cur_gts, max_gts = parse_pcie_speed(cur_speed), parse_pcie_speed(max_speed)
    lanes_lost = max(0, int(max_width) - int(cur_width))
    cur_gen, max_gen = pcie_gen(cur_gts), pcie_gen(max_gts)
    slower = cur_gts is not None and max_gts is not None and cur_gts < max_gts
    what = "+".join(w for w, bad in (("width", lanes_lost > 0), ("speed", slower)) if bad) or "bandwidth"
    data = {
        "subject": f"pcie:{pci}",
        "device": driver,
        "pci": pci,
        "cur_width": int(cur_width),
        "max_width": int(max_width),
        "cur_speed_gts": cur_gts,
        "max_speed_gts": max_gts,
        "lanes_lost": lanes_lost,
        "gens_lost": max(0, max_gen - cur_gen) if cur_gen is not None and max_gen is not None else 0,
        "bandwidth_pct": round(100.0 * float(have) / float(full), 1) if float(full) > 0 else 0.0,
        "what": what,
        "status": "limited",
        "from": "kmsg",
    }
    extra = {"limited_at": normalize_pci(at), "available_gbps": float(have), "capable_gbps": float(full)}
    # Speed alone, from a device that is not a known NIC (a GPU probed while its link idled at a low
    # generation, the "pci" core at enumeration): recorded, not acted on; lanes lost always are.
    severity = "warning" if lanes_lost or driver in _NIC_DRIVERS else "info"
    return Found(Kind.PCIE_LINK, severity, data, extra, pci=pci)


# --- CPU and kernel -------------------------------------------------------------------------------

_MCE_RE = re.compile(
    r"\[Hardware Error\]: (?:CPU (\d{1,5}): Machine Check(?: Exception)?: (\d{1,4}) Bank (\d{1,4}): "
    r"([0-9a-fA-F]{1,16})"
    r"|event severity: (\w{1,20})|Machine check events logged)"
)
_EDAC_RE = re.compile(r"\bEDAC (\w{1,16}): (\d{1,9}) (CE|UE) ")
_UC_BIT = 1 << 61  # MCi_STATUS.UC: the error was not corrected


def _mce(msg: str) -> Found | None:
    match = _MCE_RE.search(msg)
    if match is None:
        return None
    if match.group(1) is not None:
        status = int(match.group(4), 16)
        uncorrected = bool(status & _UC_BIT) or "Exception" in msg
        data = {"cpu": int(match.group(1)), "bank": int(match.group(3))}
        extra = {"status": f"0x{status:016x}", "uncorrected": uncorrected}
        return Found(Kind.MACHINE_CHECK, "critical" if uncorrected else "warning", data, extra, fold="mce")
    if match.group(5) is not None:
        level = match.group(5).lower()
        severity = {"fatal": "critical", "recoverable": "error", "corrected": "info"}.get(level, "warning")
        extra = {"event_severity": level, "uncorrected": level != "corrected"}
        return Found(Kind.MACHINE_CHECK, severity, {"cpu": None, "bank": None}, extra, fold="mce")
    return Found(Kind.MACHINE_CHECK, "info", {"cpu": None, "bank": None}, {"uncorrected": False}, fold="mce")


def _edac(msg: str) -> Found | None:
    match = _EDAC_RE.search(msg)
    if match is None:
        return None
    uncorrected = match.group(3) == "UE"
    extra = {"edac": match.group(1), "count": int(match.group(2)), "uncorrected": uncorrected}
    return Found(
        Kind.MACHINE_CHECK, "critical" if uncorrected else "info", {"cpu": None, "bank": None}, extra
    )


_SOFT_RE = re.compile(r"\bsoft lockup - CPU#(\d{1,5}) stuck for (\d{1,7})s! \[([^\[\]]{1,64}):(\d{1,10})\]")
_HARD_RE = re.compile(r"\bWatchdog detected hard LOCKUP on cpu (\d{1,5})")


def _lockup(msg: str) -> Found | None:
    if (match := _SOFT_RE.search(msg)) is not None:
        process, pid = match.group(3), int(match.group(4))
        data = {"cpu": int(match.group(1)), "process": process}
        return Found(
            Kind.SOFT_LOCKUP,
            "warning",
            data,
            {"stuck_s": int(match.group(2))},
            pid=pid,
            process=process,
            trace=True,
        )
    if (match := _HARD_RE.search(msg)) is not None:
        data = {"cpu": int(match.group(1)), "process": None}
        return Found(Kind.SOFT_LOCKUP, "critical", data, {"hard": True}, trace=True)
    return None


_OOPS_RE = re.compile(
    # both wordings: "BUG: unable to handle kernel NULL pointer dereference at ..." (older kernels) and
    # "BUG: kernel NULL pointer dereference, address: ..." (4.20 and later)
    r"(?:^|\] )(?:(BUG: (?:unable to handle )?(?:kernel )?"
    r"(NULL pointer dereference|paging request|page fault))"
    r"|kernel BUG at ([^\s!]{1,160})!"
    r"|(Oops|general protection fault|divide error|invalid opcode|stack segment|double fault)\b"
    r"[^\[]{0,200}\[#(\d{1,6})\]"
    r"|Kernel [Pp]anic - not syncing: ?([^\n]{0,200})"
    r"|BUG: ([^\n]{1,120}))"
)
_NETDEV_LEAK_RE = re.compile(
    r"unregister_netdevice: waiting for (\S{1,32}) to become free\. Usage count = (-?\d{1,9})"
)
_STACK_RE = re.compile(
    r"(?:^|\] )CPU: (\d{1,5}) (?:UID: \d{1,10} )?PID: (\d{1,10}) Comm: (\S{1,64}) (?:Not tainted|Tainted:)"
)


def _oops(msg: str) -> Found | None:
    match = _OOPS_RE.search(msg)
    if match is None:
        return None
    if match.group(1):
        what = "null_deref" if match.group(2).startswith("NULL") else "paging_request"
        return Found(Kind.KERNEL_OOPS, "critical", {"what": what}, {}, trace=True)
    if match.group(3):
        return Found(Kind.KERNEL_OOPS, "critical", {"what": "bug"}, {"at": match.group(3)}, trace=True)
    if match.group(4):
        extra = {"trap": match.group(4).lower(), "oops_count": int(match.group(5))}
        return Found(Kind.KERNEL_OOPS, "critical", {"what": "oops"}, extra, fold="oops", trace=True)
    if match.group(6) is not None:
        extra = {"reason": match.group(6).strip()}
        return Found(Kind.KERNEL_OOPS, "critical", {"what": "panic"}, extra, fold="panic", trace=True)
    return Found(Kind.KERNEL_OOPS, "error", {"what": "bug"}, {"detail": match.group(7).strip()}, trace=True)


def _netdev_leak(msg: str) -> Found | None:
    match = _NETDEV_LEAK_RE.search(msg)
    if match is None:
        return None
    extra = {"interface": match.group(1), "usage_count": int(match.group(2))}
    return Found(Kind.KERNEL_OOPS, "warning", {"what": "netdev_refcount_leak"}, extra, fold="netdev_leak")


def stack_header(msg: str) -> Found | None:
    """The ``CPU: N PID: N Comm: X ...tainted`` header of a kernel stack dump: an event only when no
    oops, lockup or warning that printed it came just before (the parser folds it into those). Alone
    it is ``info``, recorded only: a driver's own ``dump_stack()`` (the NVIDIA driver prints one after
    an Xid 119 GSP timeout) is a diagnostic, and the fault that prompted it is its own event."""
    match = _STACK_RE.search(msg)
    if match is None:
        return None
    pid, process = int(match.group(2)), match.group(3)
    extra = {"cpu": int(match.group(1))}
    return Found(Kind.KERNEL_OOPS, "info", {"what": "stack_dump"}, extra, pid=pid, process=process)


_SEGV_TAIL_RE = re.compile(
    r"segfault at ([0-9a-fA-F]{1,16}) ip ([0-9a-fA-F]{1,16}) sp ([0-9a-fA-F]{1,16}) error (\d{1,3})"
    r"(?: in ([^\[\s]{1,128}))?"
)
_SEGV_PID_RE = re.compile(r"\[(\d{1,10})\]: $")  # "NAME[PID]: " just before "segfault at"
_GPU_LIBS = ("libnccl", "libcuda", "libcudart", "libcublas", "libcudnn", "libnvidia", "libnvrtc")


def _segfault_who(before: str) -> tuple[str | None, int | None]:
    """The process name and pid of ``NAME[PID]: `` ending ``before`` (the text before "segfault at").
    The name is the text after the last ``[``, ``]`` or ``:``, at most 64 characters: found with
    string methods, since a pattern for it would be tried from every start of the line."""
    pid = _SEGV_PID_RE.search(before)
    if pid is None:
        return None, None
    head = before[: pid.start()]
    name = head[max(head.rfind("["), head.rfind("]"), head.rfind(":")) + 1 :][-64:]
    return (name.strip(), int(pid.group(1))) if name else (None, None)


def _segfault(msg: str) -> Found | None:
    at = msg.find("segfault at ")
    if at < 0:
        return None
    match = _SEGV_TAIL_RE.match(msg, at)
    if match is None:
        return None
    process, pid = _segfault_who(msg[max(0, at - 80) : at])
    library = match.group(5)
    gpu = library is not None and library.startswith(_GPU_LIBS)
    data = {"process": process, "pid": pid, "library": library}
    extra = {
        "address": match.group(1),
        "ip": match.group(2),
        "error": int(match.group(4)),
        "gpu_library": gpu,
    }
    return Found(Kind.SEGFAULT, "error" if gpu else "warning", data, extra, pid=pid, process=process)


# --- resource limits ------------------------------------------------------------------------------

_FILE_MAX_RE = re.compile(r"\bVFS: file-max limit (\d{1,20}) reached")


def _resource(msg: str) -> Found | None:
    if "table full, dropping packet" in msg and "nf_conntrack" in msg:
        return Found(Kind.RESOURCE_LIMIT, "error", {"resource": "nf_conntrack"}, {})
    if (match := _FILE_MAX_RE.search(msg)) is not None:
        return Found(Kind.RESOURCE_LIMIT, "error", {"resource": "file_max"}, {"limit": int(match.group(1))})
    if "neighbor table overflow" in msg:
        return Found(Kind.RESOURCE_LIMIT, "warning", {"resource": "neighbor_table"}, {})
    if "failed to create new OS thread" in msg and "errno=11" in msg:
        return Found(Kind.RESOURCE_LIMIT, "error", {"resource": "threads"}, {})
    return None


#: (words, matcher), in order of precedence (a soft lockup's ``BUG:`` is not an oops): a message is
#: offered to a matcher when one of its words (whitespace-separated, as printed) is in that set;
#: the first matcher that recognises it wins. Words, not substrings: one split and one set lookup
#: per word of a line, however many families there are (the pre-filter runs on every line).
FAMILIES: tuple[tuple[frozenset[str], Callable[[str], Found | None]], ...] = tuple(
    (frozenset(words.split()), matcher)
    for words, matcher in (
        # Not "nvme": a timeout whose command completed ("completion polled") is a common near miss.
        ("reset aborting Disabling Removing available down;", _nvme),
        ("failure", _md),
        ("Remounting read-only readonly Shutting shut", _readonly),
        ("error error, superblock beyond", _io_error),
        ("nfs: [nfs] nfs4_reclaim_open_state: nfs4_reclaim_locks: Lustre: LustreError:", _netfs),
        ("failed failed, leak health unrecoverable insufficient", _mlx5),
        ("WATCHDOG:", _watchdog),
        ("infiniband efa", _efa),
        ("nvidia-peermem", _peermem),
        ("NVRM:", _nvlink),
        ("bandwidth,", _pcie_limited),
        ("[Hardware Error]:", _mce),
        ("EDAC", _edac),
        ("lockup LOCKUP", _lockup),
        ("BUG: BUG Oops: fault: opcode: segment: error: panic Panic", _oops),
        ("segfault", _segfault),
        ("unregister_netdevice:", _netdev_leak),
        ("nf_conntrack: file-max neighbor thread", _resource),
    )
)
#: Every word that can send a line to a family, the ``CPU: N PID: N Comm:`` stack header's and
#: ``WARNING:`` (a WARN_ON's trace, whose stack header is not an event).
_HINT_WORDS = frozenset().union(*(words for words, _ in FAMILIES), {"Comm:", "WARNING:"})
#: word -> the positions in :data:`FAMILIES` of the families it can send a line to.
_BY_WORD = {word: tuple(i for i, (words, _) in enumerate(FAMILIES) if word in words) for word in _HINT_WORDS}


def match_family(msg: str) -> Found | None:
    """The first family that recognises ``msg`` (the message text, prefix removed), or None."""
    get = _BY_WORD.get
    hits = {i for word in msg.split() for i in get(word, ())}
    for index in sorted(hits):
        found = FAMILIES[index][1](msg)
        if found is not None:
            return found
    return None


def family_candidate(line: str) -> bool:
    """Cheap pre-filter for the families: can ``line`` be one of their events? True when one of its
    words is in :data:`_HINT_WORDS` (a raw ``/dev/kmsg`` record's first word is read after its ``;``)."""
    if not _HINT_WORDS.isdisjoint(line.split()):
        return True
    semi = line.find(";", 0, 40)
    if semi < 0:
        return False
    first = line[semi + 1 : semi + 65].split(None, 1)
    return bool(first) and first[0] in _HINT_WORDS
