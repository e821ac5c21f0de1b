"""``ftd bench kmsg``: kernel-log parser throughput (docs/architecture.md §10: >= 300k lines/s on one core).

The input is a generated, realistic mix: 99% ordinary kernel noise in every prefix shape the parser
accepts (dmesg, raw /dev/kmsg, syslog, journal, ISO) and 1% lines that are events (Xid, SXid,
AER, OOM, hung task, link down). Noise deliberately includes near-misses ("NVRM: loading
driver", "Link is Up", "AER: enabled") that pass the substring pre-filter, so the bench measures
the slow path too.
"""

from __future__ import annotations

import random
import time
from typing import Any

from ftd.agent.kmsg_parse import KmsgParser

_NOISE = (
    "usb 1-1: new high-speed USB device number {n} using xhci_hcd",
    "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Opts: (null)",
    'audit: type=1400 audit({n}.123:456): apparmor="STATUS" operation="profile_load" name="snap"',
    "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
    "systemd[1]: Started Session {n} of user root.",
    "nvme nvme0: I/O {n} QID 3 timeout, completion polled",
    "TCP: request_sock_TCP: Possible SYN flooding on port 22. Sending cookies.",
    "device-mapper: uevent: version 1.0.3",
    "perf: interrupt took too long ({n} > 2500), lowering kernel.perf_event_max_sample_rate to 79750",
    "mlx5_core 0000:86:00.1 ens2f1np1: Link up",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024",
    "pcieport 0000:00:01.0: AER: enabled with IRQ 24",
    "nvidia-uvm: Loaded the UVM driver, major device number 510.",
    "docker0: port 1(veth{n}) entered forwarding state",
    "kauditd_printk_skb: {n} callbacks suppressed",
    "cgroup: fork rejected by pids controller in /system.slice/cron.service",
    "xfs filesystem being remounted at /var/lib supports timestamps until 2038 (0x7fffffff)",
    "random: crng init done",
)
_EVENTS = (
    "NVRM: Xid (PCI:0000:3b:00): 79, pid={n}, name=python, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:b7:00): 45, pid='<unknown>', name=<unknown>, Ch 00000008",
    "NVRM: Xid (0000:18:00): 13, Graphics Exception: ESR 0x514648=0x102000e 0x514650=0x0",
    "NVRM: Xid (PCI:0000:5a:00): 48, pid={n}, name=pt_main_thread, DBE (0x1) has been detected on GPU",
    "nvidia-nvswitch3: SXid (PCI:0000:c6:00.0): 12028, Non-fatal, Link 52 egress non-posted PRIV error",
    "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0",
    "Out of memory: Killed process {n} (python) total-vm:123456kB, anon-rss:1234kB",
    "INFO: task python:{n} blocked for more than 120 seconds.",
    "mlx5_core 0000:86:00.1 ens2f1np1: Link down",
)


def _prefixed(rng: random.Random, seq: int, msg: str) -> str:
    ts = seq * 0.001 + rng.random()
    shape = seq % 5
    if shape == 0:
        return f"[{ts:12.6f}] {msg}"
    if shape == 1:
        return f"6,{seq},{int(ts * 1e6)},-;{msg}"
    if shape == 2:
        return f"Dec  9 12:34:{seq % 60:02d} node17 kernel: [{ts:12.6f}] {msg}"
    if shape == 3:
        return f"Dec 09 12:34:{seq % 60:02d} node17 kernel: {msg}"
    return f"2024-12-09T12:34:{seq % 60:02d},123456+00:00 {msg}"


def generate_mix(count: int, *, event_ratio: float = 0.01, seed: int = 7) -> list[str]:
    """``count`` kernel-log lines; ``event_ratio`` of them are events, the rest noise."""
    rng = random.Random(seed)
    lines = []
    for seq in range(count):
        pool = _EVENTS if rng.random() < event_ratio else _NOISE
        lines.append(_prefixed(rng, seq, rng.choice(pool).format(n=rng.randint(1, 99999))))
    return lines


def bench_kmsg(seconds: float = 3.0) -> dict[str, Any]:
    """Parse the mix repeatedly for about ``seconds``; report throughput on this core."""
    lines = generate_mix(100_000)
    total_lines = total_events = 0
    elapsed = 0.0
    while elapsed < seconds:
        parser = KmsgParser()
        feed = parser.feed
        start = time.perf_counter()
        events = 0
        for lineno, line in enumerate(lines, 1):
            events += len(feed(line, lineno))
        elapsed += time.perf_counter() - start
        total_lines += len(lines)
        total_events += events
    return {"lines_per_s": round(total_lines / elapsed), "lines": total_lines, "events": total_events}


if __name__ == "__main__":
    print(bench_kmsg())
