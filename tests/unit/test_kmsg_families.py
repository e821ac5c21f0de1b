"""The kernel log's host signal families (#23 part 1): every family on real line forms, under every
prefix shape the agent reads, near misses that must stay quiet, the multi-line folding, and
properties of the word pre-filter (a line a family recognises always passes it).

The lines are the forms drivers and the kernel print (and peers' corpora quote): docs/signals.md
lists them per kind.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.agent.kmsg_parse import KernelEvent, is_candidate, parse_lines
from ftd.agent.kmsg_parse.families import family_candidate, match_family
from ftd.agent.watchers.kmsg import kernel_event_to_event
from ftd.events import Kind
from tests.properties import examples


def parse(*lines: str) -> list[KernelEvent]:
    return list(parse_lines(lines))


# (message, kind, data fields expected (a subset), severity)
CASES: list[tuple[str, Kind, dict[str, Any], str]] = [
    # storage
    (
        "nvme nvme4: I/O tag 7 (3007) opcode 0x6 (Admin Cmd) QID 0 timeout, reset controller",
        Kind.STORAGE, {"device": "nvme4", "subsystem": "nvme", "fault": "timeout"}, "error",
    ),
    ("nvme nvme0: I/O 123 QID 4 timeout, aborting", Kind.STORAGE, {"fault": "timeout"}, "warning"),
    (
        "nvme nvme7: Disabling device after reset failure: -5",
        Kind.STORAGE, {"device": "nvme7", "fault": "disabled"}, "critical",
    ),
    (
        "nvme nvme1: controller is down; will reset: CSTS=0xffffffff, PCI_STATUS=0xffff",
        Kind.STORAGE, {"fault": "controller_down"}, "error",
    ),
    (
        "block nvme3c3n2: no available path - failing I/O",
        Kind.STORAGE, {"device": "nvme3c3n2", "fault": "no_available_path"}, "critical",
    ),
    (
        "md/raid1:md1: Disk failure on sda1, disabling device.",
        Kind.STORAGE, {"device": "md1", "subsystem": "md", "fault": "disk_failed"}, "error",
    ),
    (
        "md/raid0md2: Disk failure on nvme3n1p1 detected, failing array.",
        Kind.STORAGE, {"device": "md2", "subsystem": "md", "fault": "array_failed"}, "critical",
    ),
    (
        "blk_update_request: I/O error, dev nvme2n1, sector 918273645 op 0x1:(WRITE) flags 0x800",
        Kind.STORAGE, {"device": "nvme2n1", "subsystem": "block", "fault": "io_error"}, "error",
    ),
    (
        "sd 0:0:0:0: [sda] tag#0 critical medium error, dev sda, sector 12345 op 0x0:(READ) flags 0x0",
        Kind.STORAGE, {"device": "sda", "fault": "io_error"}, "error",
    ),
    (
        "Buffer I/O error on dev sdc1, logical block 42, async page read",
        Kind.STORAGE, {"device": "sdc1", "subsystem": "fs", "fault": "buffer_io_error"}, "error",
    ),
    (
        "EXT4-fs (nvme5n1p2): I/O error while writing superblock",
        Kind.STORAGE, {"device": "nvme5n1p2", "fault": "superblock_write_error", "fstype": "ext4"}, "error",
    ),
    (
        "EXT4-fs error (device sda1): ext4_find_entry:1663: inode #2: comm find: reading directory lblock 0",
        Kind.STORAGE, {"device": "sda1", "fault": "fs_error", "fstype": "ext4"}, "error",
    ),
    (
        "XFS (nvme1n1p3): writeback error on inode 2113, off 0, sector 917504",
        Kind.STORAGE, {"device": "nvme1n1p3", "fault": "writeback_error"}, "error",
    ),
    (
        "kworker/u98:4: attempt to access beyond end of device",
        Kind.STORAGE, {"fault": "beyond_end_of_device"}, "error",
    ),
    # read-only remounts
    (
        "EXT4-fs (md5): Remounting filesystem read-only",
        Kind.FS_READONLY, {"device": "md5", "fstype": "ext4"}, "critical",
    ),
    ("XFS (sdc3): Remounting filesystem read-only", Kind.FS_READONLY, {"fstype": "xfs"}, "critical"),
    (
        "BTRFS warning (device sdd1): Remounting filesystem read-only",
        Kind.FS_READONLY, {"device": "sdd1", "fstype": "btrfs"}, "critical",
    ),
    (
        "BTRFS info (device nvme0n1p2): forced readonly",
        Kind.FS_READONLY, {"device": "nvme0n1p2", "fstype": "btrfs"}, "critical",
    ),
    (
        "XFS (dm-3): Filesystem has been shut down due to log error (0x2).",
        Kind.FS_READONLY, {"device": "dm-3", "fstype": "xfs"}, "critical",
    ),
    # network filesystems
    (
        "nfs: server filer-b.cluster.internal not responding, still trying",
        Kind.NETFS, {"fs": "nfs", "server": "filer-b.cluster.internal", "state": "not_responding"}, "error",
    ),
    ("nfs: server 10.0.0.5 OK", Kind.NETFS, {"server": "10.0.0.5", "state": "recovered"}, "info"),
    (
        "NFS: nfs4_reclaim_locks: Lock reclaim failed!",
        Kind.NETFS, {"fs": "nfs", "state": "lock_reclaim_failed"}, "error",
    ),
    (
        " nfs_lock_and_join_requests+0x5a/0x2e0 [nfs]",
        Kind.NETFS, {"fs": "nfs", "state": "writeback_hang"}, "warning",
    ),
    (
        "Lustre: lfs-OST0003-osc-ffff8e6f: Connection to lfs-OST0003 (at 10.1.0.3@o2ib) was lost; in progress"
        " operations using this service will wait for recovery to complete",
        Kind.NETFS, {"fs": "lustre", "server": "10.1.0.3@o2ib", "state": "not_responding"}, "error",
    ),
    (
        "Lustre: lfs-OST0003-osc-ffff8e6f: Connection restored to lfs-OST0003 (at 10.1.0.3@o2ib)",
        Kind.NETFS, {"fs": "lustre", "state": "recovered"}, "info",
    ),
    (
        "LustreError: 167-0: lfs-OST0003-osc-ffff8e6f: This client was evicted by lfs-OST0003; in progress"
        " operations using this service will fail.",
        Kind.NETFS, {"fs": "lustre", "server": "lfs-OST0003", "state": "evicted"}, "error",
    ),
    # NICs
    (
        "mlx5_core 0000:3a:00.0: wait_func:1204:(pid 88412): QUERY_VPORT_STATE(0x750) timeout. Will cause a"
        " leak of a command resource",
        Kind.NIC, {"driver": "mlx5_core", "device": "0000:3a:00.0", "fault": "cmd_timeout"}, "critical",
    ),
    (
        "mlx5_core 0000:d2:00.0: mlx5_cmd_out_err:841:(pid 90311): ACCESS_REG(0x805) op_mod(0x1) failed,"
        " status bad parameter(0x3), syndrome (0x15c3a2), err(-22)",
        Kind.NIC, {"device": "0000:d2:00.0", "fault": "access_reg_failed"}, "warning",
    ),
    (
        "mlx5_core 0000:41:00.0: poll_health:807:(pid 0): device's health compromised - reached miss count",
        Kind.NIC, {"fault": "health_poll_failed"}, "critical",
    ),
    (
        "mlx5_core 0000:3a:00.0: INFO: synd 0x8: unrecoverable hardware error.",
        Kind.NIC, {"fault": "unrecoverable"}, "critical",
    ),
    (
        "mlx5_core 0000:5c:00.0: mlx5_pcie_event:301:(pid 5120): Detected insufficient power on the PCIe"
        " slot (35W).",
        Kind.NIC, {"device": "0000:5c:00.0", "fault": "insufficient_slot_power"}, "warning",
    ),
    (
        "NETDEV WATCHDOG: ibp12s0 (mlx5_core): transmit queue 5 timed out",
        Kind.NIC, {"driver": "mlx5_core", "fault": "tx_timeout"}, "info",
    ),
    (
        "infiniband rdmap79s0: The device didn't send any completion for admin cmd MODIFY_QP(7) status 0",
        Kind.NIC, {"driver": "efa", "fault": "admin_cmd_timeout"}, "critical",
    ),
    (
        "efa 0000:10:1c.0: Wait for completion (polling) timeout",
        Kind.NIC, {"driver": "efa", "device": "0000:10:1c.0", "fault": "admin_cmd_timeout"}, "critical",
    ),
    ("infiniband efa_3: Admin queue is closed", Kind.NIC, {"fault": "admin_queue_closed"}, "critical"),
    (
        "infiniband rdmap33s0: Failed to submit command DEREG_MR (opcode 10) err -16",
        Kind.NIC, {"fault": "admin_cmd_failed"}, "warning",
    ),
    ("efa 0000:10:1c.0: Reset indication didn't turn off", Kind.NIC, {"fault": "reset_failed"}, "critical"),
    ("efa 0000:10:1c.0: Device isn't ready, abort com init", Kind.NIC, {"fault": "not_ready"}, "critical"),
    # GPUDirect, NVLink
    (
        "nvidia-peermem nv_get_p2p_free_callback:131 ERROR detected invalid context, skipping further"
        " processing",
        Kind.GPUDIRECT, {"fault": "invalid_context"}, "error",
    ),
    (
        "NVRM: knvlinkDiscoverPostRxDetLinks_GB100_REV3: Getting peer9 postRxDetLinkMask failed!",
        Kind.NVLINK, {"fault": "post_rx_detect_failed"}, "error",
    ),
    (
        "NVRM: knvlinkUpdatePostRxDetectLinkMask_GB200: Failed to update Rx Detect Link mask!",
        Kind.NVLINK, {"fault": "post_rx_detect_failed"}, "error",
    ),
    # PCIe links below their capability (issue #35): our own values, the kernel's wording
    (
        "mlx5_core 0000:17:00.0: 126.024 Gb/s available PCIe bandwidth, limited by 16.0 GT/s PCIe x8 link at"
        " 0000:16:00.0 (capable of 252.048 Gb/s with 16.0 GT/s PCIe x16 link)",
        Kind.PCIE_LINK,
        {"pci": "0000:17:00.0", "cur_width": 8, "max_width": 16, "lanes_lost": 8, "gens_lost": 0,
         "bandwidth_pct": 50.0, "what": "width", "subject": "pcie:0000:17:00.0", "from": "kmsg"},
        "warning",
    ),
    (
        "nvidia 0000:9a:00.0: 31.504 Gb/s available PCIe bandwidth, limited by 2.5 GT/s PCIe x16 link at"
        " 0000:97:01.0 (capable of 504.112 Gb/s with 32.0 GT/s PCIe x16 link)",
        Kind.PCIE_LINK,
        {"pci": "0000:9a:00.0", "cur_speed_gts": 2.5, "max_speed_gts": 32.0, "gens_lost": 4, "lanes_lost": 0,
         "what": "speed", "bandwidth_pct": 6.2},
        "info",  # speed alone from a GPU: its link idles at a low generation
    ),
    (
        "mlx5_core 0000:3a:00.0: 126.024 Gb/s available PCIe bandwidth, limited by 8.0 GT/s PCIe x16 link at"
        " 0000:38:02.0 (capable of 252.048 Gb/s with 16.0 GT/s PCIe x16 link)",
        Kind.PCIE_LINK,
        {"pci": "0000:3a:00.0", "what": "speed", "gens_lost": 1, "bandwidth_pct": 50.0},
        "warning",  # a NIC's speed is judged
    ),
    # CPU and kernel
    (
        "mce: [Hardware Error]: CPU 12: Machine Check Exception: 5 Bank 4: b200000000070f0f",
        Kind.MACHINE_CHECK, {"cpu": 12, "bank": 4}, "critical",
    ),
    (
        "mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank 7: 8c00004000010091",
        Kind.MACHINE_CHECK, {"cpu": 0, "bank": 7}, "warning",
    ),
    ("{3}[Hardware Error]: event severity: fatal", Kind.MACHINE_CHECK, {}, "critical"),
    ("{1}[Hardware Error]: event severity: corrected", Kind.MACHINE_CHECK, {}, "info"),
    ("EDAC MC0: 1 UE memory read error on DIMM#0", Kind.MACHINE_CHECK, {}, "critical"),
    (
        "watchdog: BUG: soft lockup - CPU#6 stuck for 26s! [VM Thread:9182]",
        Kind.SOFT_LOCKUP, {"cpu": 6, "process": "VM Thread"}, "warning",
    ),
    (
        "BUG: unable to handle kernel NULL pointer dereference at           (null)",
        Kind.KERNEL_OOPS, {"what": "null_deref"}, "critical",
    ),
    (  # the wording of kernels 4.20 and later (read as a generic "bug", error, before)
        "BUG: kernel NULL pointer dereference, address: 0000000000000048",
        Kind.KERNEL_OOPS, {"what": "null_deref"}, "critical",
    ),
    ("kernel BUG at mm/slub.c:305!", Kind.KERNEL_OOPS, {"what": "bug"}, "critical"),
    ("divide error: 0000 [#1] PREEMPT SMP", Kind.KERNEL_OOPS, {"what": "oops"}, "critical"),
    (
        "Oops: general protection fault, probably for non-canonical address 0xdead: 0000 [#1] SMP NOPTI",
        Kind.KERNEL_OOPS, {"what": "oops"}, "critical",
    ),
    (
        "Kernel panic - not syncing: softlockup: hung tasks",
        Kind.KERNEL_OOPS, {"what": "panic"}, "critical",
    ),
    ("BUG: Bad page state in process python  pfn:1a2b3c", Kind.KERNEL_OOPS, {"what": "bug"}, "error"),
    (
        "CPU: 61 PID: 2207 Comm: khungtaskd Tainted: P           OE     6.8.0-1012-nvidia #12-Ubuntu",
        Kind.KERNEL_OOPS, {"what": "stack_dump"}, "info",
    ),
    (
        "unregister_netdevice: waiting for eth2 to become free. Usage count = 3",
        Kind.KERNEL_OOPS, {"what": "netdev_refcount_leak"}, "warning",
    ),
    (
        "pt_main_thread[771920]: segfault at 7f2a10c00000 ip 00007f2b3d41a7c2 sp 00007f2a9e3f5b40 error 4 in"
        " libnccl.so.2[7f2b3d200000+d3d3000]",
        Kind.SEGFAULT, {"process": "pt_main_thread", "pid": 771920, "library": "libnccl.so.2"}, "error",
    ),
    (
        "kexec[896]: segfault at 0 ip 0000000000000000 sp 00007ffd13572a90 error 14 in dash[561ac3c5+4000]",
        Kind.SEGFAULT, {"process": "kexec", "pid": 896, "library": "dash"}, "warning",
    ),
    # resource limits
    (
        "nf_conntrack: table full, dropping packet",
        Kind.RESOURCE_LIMIT, {"resource": "nf_conntrack"}, "error",
    ),
    ("VFS: file-max limit 2097152 reached", Kind.RESOURCE_LIMIT, {"resource": "file_max"}, "error"),
    (
        "neighbour: arp_cache: neighbor table overflow!",
        Kind.RESOURCE_LIMIT, {"resource": "neighbor_table"}, "warning",
    ),
]  # fmt: skip

# Every prefix shape the agent reads (prefix.py): dmesg, dmesg -T, dmesg --time-format iso with and
# without the -x level, the console's <4>, a raw /dev/kmsg record, syslog with and without the dmesg
# time, journald, a caller tag.
PREFIXES = [
    "",
    "[  421.907315] ",
    "[Sat Mar 14 07:12:09 2026] ",
    "2026-03-14T07:12:09,518223+00:00 ",
    "kern  :warn  : 2026-03-14T07:12:09,518223+00:00 ",
    "<4>[1904417.099010] ",
    "6,5120,918273645,-;",
    "Dec  9 12:34:44 gpu-a01 kernel: [  421.907315] ",
    "Dec 09 12:34:44 gpu-a01 kernel: ",
    "[   47.118306][  T1203] ",
]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize(("message", "kind", "data", "severity"), CASES, ids=[c[0][:48] for c in CASES])
def test_every_family_under_every_prefix(
    prefix: str, message: str, kind: Kind, data: dict[str, Any], severity: str
) -> None:
    line = prefix + message
    assert is_candidate(line), line
    events = parse(line)
    assert [e.kind for e in events] == [kind], line
    (event,) = events
    assert event.severity == severity
    assert {k: event.data.get(k) for k in data} == data
    if prefix.startswith("6,"):
        assert (event.seq, event.ts) == (5120, 918.273645)  # the raw record's numbers are kept


NEAR_MISSES = [
    "nvme nvme0: I/O 5 QID 3 timeout, completion polled",  # a lost interrupt; the command completed
    "nvme nvme0: I/O timeout",
    "nvme nvme11: Disabling controller",
    "block nvme6n2: no available path",
    "md: raid6 personality registered for level 6",
    "md/raid10: Disk failure detected",
    "EXT4-fs (nvme1n1p2): mounted filesystem with writeback data mode. Quota mode: none.",
    "EXT4-fs (sdb2): Remounting filesystem read-write",
    "EXT4-fs (dm-3): I/O error while reading superblock",
    "Buffer I/O error on dev dm-3",
    "General I/O error detected (no device named)",
    "nfs: server 10.20.0.9 starting",
    "NFS: Registering the legacy dns_resolver key type",
    " prefix_nfs_lock_and_join_requests+0x5a/0x2e0 [nfs]",
    " nfs_xxx_other+0x1f/0x3a0 [nfs]",
    "mlx5_cmd_out_err:841:(pid 6612): OTHER_CMD(0x9a1) failed",
    "mlx5_core: ACCESS_REG query done",
    "mlx5_core 0000:86:00.1 ens2f1np1: Link up",
    "ena 0000:00:07.0 ens6: Wait for completion (polling) timeout",
    "infiniband mlx5_3: Wait for completion (polling) timeout",
    "ena 0000:00:07.0 ens6: Admin queue is closed",
    "ena 0000:00:07.0: Reset indication didn't turn on",
    "ena 0000:00:07.0: Device isn't ready, abort com init",
    "infiniband rdmap33s0: an unrelated message",
    "Failed to process command MODIFY_QP without an efa prefix",
    "nvidia-peermem nv_get_p2p_free_callback:131 an unrelated message",
    "nvidia-peermem nv_get_p2p_free_callback:131",
    "segfault at 7f2a10c00000 ip 00007f2b3d41a7c2",
    "an unrelated error in libnccl.so.2",
    "VFS: file-max limit 2097152",
    "VFS: file-max limit is reached",
    "vfs: File-max Limit 2097152 Reached",
    "CPU: 44 Comm: ftd-watch idle",
    "CPU: abc PID: 2207 Comm: khungtaskd",
    "CPU operation back to normal",
    "mce: CPU0: Core temperature above threshold, cpu clock throttled",
    "cgroup: fork rejected by pids controller in /system.slice/cron.service",
    "xfs filesystem being remounted at /var/lib supports timestamps until 2038 (0x7fffffff)",
    "nvidia 0000:18:00.0: 504.112 Gb/s available PCIe bandwidth (32.0 GT/s PCIe x16 link)",  # not limited
    "pci 0000:03:00.0: 8.000 Gb/s available PCIe bandwidth, limited by 5.0 GT/s PCIe x2 link at",
]


@pytest.mark.parametrize("line", NEAR_MISSES)
def test_near_misses_stay_quiet(line: str) -> None:
    assert parse(line) == [], line


def test_event_data_carries_the_documented_fields() -> None:
    (kev,) = parse("[5.0] EXT4-fs (md5): Remounting filesystem read-only")
    event = kernel_event_to_event("gpu-a01", kev, event_id="e1", ts=1.0)
    assert event.kind is Kind.FS_READONLY
    assert {k: event.data[k] for k in ("device", "fstype", "message", "kernel_ts")} == {
        "device": "md5",
        "fstype": "ext4",
        "message": "EXT4-fs (md5): Remounting filesystem read-only",
        "kernel_ts": 5.0,
    }
    (kev,) = parse("NFS: nfs4_reclaim_locks: Lock reclaim failed!")
    event = kernel_event_to_event("gpu-a01", kev, event_id="e2", ts=1.0)
    assert "server" not in event.data  # None values are left out, as for every kernel event
    assert (event.data["fs"], event.data["state"]) == ("nfs", "lock_reclaim_failed")


def test_a_trace_header_is_part_of_the_report_that_printed_it() -> None:
    panic = [
        "<0>[1904417.098863] Kernel panic - not syncing: softlockup: hung tasks",
        "<4>[1904417.099010] CPU: 61 PID: 2207 Comm: khungtaskd Tainted: P           OE     6.8.0-1012 #12",
        "<4>[1904417.099185] Hardware name: Supermicro SYS-821GE-TNHR, BIOS 2.1 01/15/2025",
        "<4>[1904417.099382] Call Trace:",
        "<4>[1904417.100333]  panic+0x15c/0x334",
    ]
    assert [(e.kind, e.data["what"], e.line) for e in parse(*panic)] == [(Kind.KERNEL_OOPS, "panic", 1)]
    warning = [
        "[ 10.0] WARNING: CPU: 3 PID: 1 at kernel/foo.c:12 foo+0x1/0x2",
        "[ 10.0] Modules linked in: nvidia(POE)",
        "[ 10.1] CPU: 3 PID: 1 Comm: swapper/0 Not tainted 5.15.0 #1",
    ]
    assert parse(*warning) == []  # a WARN_ON's trace: not an event
    lone = parse("[ 20.0] CPU: 9 PID: 118 Comm: khungtaskd Not tainted 6.1.77 #1")
    assert [(e.kind, e.data["what"], e.pid, e.process) for e in lone] == [
        (Kind.KERNEL_OOPS, "stack_dump", 118, "khungtaskd")
    ]
    far = ["[1.0] divide error: 0000 [#1] PREEMPT SMP", *(f"[1.{i}] frame {i}" for i in range(70))]
    events = parse(*far, "[2.0] CPU: 2 PID: 15 Comm: init Not tainted 5.4.0 #83")
    assert [e.data["what"] for e in events] == ["oops", "stack_dump"]  # beyond the window: its own


def test_one_event_per_trace_for_nfs_writeback_frames() -> None:
    trace = [
        "[91022.4] INFO: task python:40517 blocked for more than 245 seconds.",
        "[91022.5]  nfs_lock_and_join_requests+0x5a/0x2e0 [nfs]",
        "[91022.5]  nfs_wb_all+0x31/0x1a0 [nfs]",
        "[91022.5]  nfs_page_async_flush+0x2b/0x2a0 [nfs]",
        "[91022.5] \tnfs_writepages_callback+0x3c/0x70 [nfs]",
    ]
    assert [(e.kind, e.data.get("state")) for e in parse(*trace)] == [
        (Kind.HUNG_TASK, None),
        (Kind.NETFS, "writeback_hang"),
    ]


def test_machine_check_records_of_one_incident_fold() -> None:
    lines = [
        "mce: [Hardware Error]: CPU 3: Machine Check Exception: 5 Bank 4: b200000000070f0f",
        "mce: [Hardware Error]: RIP !INEXACT! 10:<ffffffff8100bd56> {intel_idle+0x6/0x10}",
        "mce: [Hardware Error]: CPU 3: Machine Check Exception: 5 Bank 4: b200000000070f0f",
        "mce: [Hardware Error]: CPU 5: Machine Check: 0 Bank 7: 8c00004000010091",  # corrected: its own
    ]
    assert [(e.kind, e.severity) for e in parse(*lines)] == [
        (Kind.MACHINE_CHECK, "critical"),
        (Kind.MACHINE_CHECK, "warning"),
    ]


# --- properties -----------------------------------------------------------------------------------

_DEVICE = st.from_regex(r"\A(sd[a-z]|nvme\d{1,2}n\d|dm-\d{1,2}|md\d{1,3})\Z")
_NUMBER = st.integers(min_value=0, max_value=10**9)
_JUNK = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), max_size=40
)


@st.composite
def family_lines(draw: st.DrawFn) -> tuple[str, Kind]:
    """A family line with drawn devices and numbers (and a prefix, and junk after it)."""
    device, n = draw(_DEVICE), draw(_NUMBER)
    forms = [
        (f"Buffer I/O error on dev {device}, logical block {n}, lost async page write", Kind.STORAGE),
        (f"blk_update_request: I/O error, dev {device}, sector {n} op 0x1:(WRITE) flags 0x0", Kind.STORAGE),
        (f"EXT4-fs ({device}): Remounting filesystem read-only", Kind.FS_READONLY),
        (f"XFS ({device}): I/O error while writing superblock", Kind.STORAGE),
        (f"nfs: server 10.{n % 256}.0.1 not responding, timed out", Kind.NETFS),
        (f"mlx5_core 0000:{n % 256:02x}:00.0: poll_health:807: device's health compromised", Kind.NIC),
        (f"VFS: file-max limit {n} reached", Kind.RESOURCE_LIMIT),
        (f"pci 0000:{n % 256:02x}:00.0: {n % 999}.000 Gb/s available PCIe bandwidth, limited by 8.0 GT/s"
         f" PCIe x{1 + n % 16} link at 0000:00:01.0 (capable of 252.048 Gb/s with 16.0 GT/s PCIe x16 link)",
         Kind.PCIE_LINK),
        (f"python[{n}]: segfault at {n:x} ip {n:x} sp {n:x} error 4 in libcuda.so.1[7f00+10]", Kind.SEGFAULT),
        (f"watchdog: BUG: soft lockup - CPU#{n % 512} stuck for {n % 100}s! [python:{n}]", Kind.SOFT_LOCKUP),
        (f"mce: [Hardware Error]: CPU {n % 512}: Machine Check: 5 Bank {n % 32}: b2", Kind.MACHINE_CHECK),
    ]  # fmt: skip
    line, kind = draw(st.sampled_from(forms))
    return draw(st.sampled_from(PREFIXES)) + line + draw(st.sampled_from(["", " ", "."])), kind


@settings(max_examples=examples(300), deadline=None)
@given(family_lines())
def test_family_lines_parse_whatever_their_numbers_and_prefix(case: tuple[str, Kind]) -> None:
    line, kind = case
    assert family_candidate(line) or is_candidate(line)
    assert [e.kind for e in parse(line)] == [kind], line


@settings(max_examples=examples(500), deadline=None)
@given(_JUNK, st.sampled_from([c[0] for c in CASES]), _JUNK)
def test_the_prefilter_never_drops_a_family_line(before: str, message: str, after: str) -> None:
    """Whatever text surrounds a family's message, if a matcher recognises the line then the word
    pre-filter let it through: the filter can cost a false candidate, never a missed event."""
    line = f"{before} {message} {after}"
    if match_family(line) is not None:
        assert is_candidate(line), line


@settings(max_examples=examples(500), deadline=None)
@given(
    st.lists(
        st.one_of(
            _JUNK, st.sampled_from([c[0] for c in CASES + [(n, Kind.XID, {}, "") for n in NEAR_MISSES]])
        ),
        max_size=12,
    )
)
def test_any_mix_of_lines_parses_without_raising(lines: list[str]) -> None:
    for event in parse(*lines):
        assert isinstance(event.data, dict) and event.kind in Kind
