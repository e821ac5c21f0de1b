"""A job's RDMA path checked on real processes and real files (issue #36 items 3 and 6).

The rank is a real child process: its memlock lowered to 64 KiB with ``setrlimit`` before exec, its
``/dev/shm`` a 64 KiB tmpfs in a mount namespace of its own (``unshare -m``; read back through
``/proc/<pid>/root``), its ``MASTER_ADDR``/``MASTER_PORT`` in its environment. The node's sysfs is a
tree this test writes in the kernel's layout (an IB device, a GPU under a bridge whose config space
has ACS redirect on), ``/proc/modules`` a file in its format. The target: an event naming each
cause within 10 s of the rank's registration.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftd.agent.job_checks.checker import JobPathChecks, Roots
from ftd.config.schema import JobChecksConfig
from ftd.events import Event, Kind, RankInfo, Severity, make_event
from ftd.pci import ACS_CAP_ID
from ftd.platform.rdma import PathVerdict

MODULES = (
    "mlx5_ib 458752 0 - Live 0x0000000000000000\n"
    "ib_uverbs 180224 2 rdma_ucm,mlx5_ib, Live 0x0000000000000000\n"
    "nvidia_uvm 1789952 0 - Live 0x0000000000000000\n"
    "nvidia 54317056 1 nvidia_uvm, Live 0x0000000000000000 (POE)\n"
)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bridge_config(acs_ctrl: int) -> bytes:
    space = bytearray(4096)
    space[0x100:0x104] = (ACS_CAP_ID | (1 << 16)).to_bytes(4, "little")  # ACS, version 1, last
    space[0x104:0x106] = (0x005F).to_bytes(2, "little")  # capability
    space[0x106:0x108] = acs_ctrl.to_bytes(2, "little")  # control
    return bytes(space)


def _sys_tree(root: Path, acs_ctrl: int) -> Path:
    """/sys as the kernel lays it out: the GPU 0000:01:00.0 below bridge 0000:00:01.0."""
    sysfs = root / "sys"
    bridge = sysfs / "devices" / "pci0000:00" / "0000:00:01.0"
    gpu = bridge / "0000:01:00.0"
    gpu.mkdir(parents=True)
    (bridge / "config").write_bytes(_bridge_config(acs_ctrl))
    (gpu / "vendor").write_text("0x10de\n")
    (gpu / "class").write_text("0x030200\n")
    (gpu / "config").write_bytes(bytes(4096))
    devices = sysfs / "bus" / "pci" / "devices"
    devices.mkdir(parents=True)
    os.symlink("../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0", devices / "0000:01:00.0")
    os.symlink("../../devices/pci0000:00/0000:00:01.0", devices / "0000:00:01.0")
    # The HCA 0000:02:00.0 below bridge 0000:00:02.0 (ACS off), its class entry a link into it.
    nic_bridge = sysfs / "devices" / "pci0000:00" / "0000:00:02.0"
    hca = nic_bridge / "0000:02:00.0" / "infiniband" / "mlx5_0"
    hca.mkdir(parents=True)
    (nic_bridge / "config").write_bytes(_bridge_config(0))
    os.symlink("../../../0000:02:00.0", hca / "device")
    (sysfs / "class" / "infiniband").mkdir(parents=True)
    os.symlink(
        "../../devices/pci0000:00/0000:00:02.0/0000:02:00.0/infiniband/mlx5_0",
        sysfs / "class" / "infiniband" / "mlx5_0",
    )
    (sysfs / "class" / "iommu").mkdir(parents=True)
    return sysfs


@pytest.fixture
def slow_rank() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A rank with memlock 64 KiB, a 64 KiB /dev/shm and a rendezvous port nobody listens on."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("this test needs root and unshare(1) (a tmpfs in a mount namespace)")
    port = _closed_port()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    script = "mount -t tmpfs -o size=64k tmpfs /dev/shm && echo ready && exec sleep 120"

    def low_memlock() -> None:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 << 10, 64 << 10))

    proc = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        preexec_fn=low_memlock,
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    try:
        yield proc, port
    finally:
        proc.kill()
        proc.wait()


def test_a_slow_rank_gets_an_event_naming_each_cause_within_10_s(
    tmp_path: Path, slow_rank: tuple[subprocess.Popen[bytes], int]
) -> None:
    proc, port = slow_rank
    modules = tmp_path / "modules"
    modules.write_text(MODULES)
    roots = Roots(
        proc=Path("/proc"), sys=_sys_tree(tmp_path, 0x001D), modules=modules, cmdline=tmp_path / "x"
    )
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    async def scenario() -> tuple[float, float]:
        cfg = JobChecksConfig(connect_attempts=3, connect_retry_s=0.2)
        checks = JobPathChecks(cfg, "node-1", emit, roots=roots)
        started = time.monotonic()
        verdict = await checks.ranks("job-7", [RankInfo(rank=0, pid=proc.pid)])
        took = time.monotonic() - started
        assert verdict is not None and len(events) == 1
        # The rendezvous is probed beside: refused three times (rank 0 may only be late), then a cause.
        await checks.settle()
        probed = time.monotonic() - started
        assert len(events) == 2
        # Another rank of the job registers with the same causes: nothing new to say, no event.
        await checks.ranks("job-7", [RankInfo(rank=0, pid=proc.pid), RankInfo(rank=1, pid=os.getpid())])
        await checks.settle()
        assert len(events) == 2
        # NCCL says NET/Socket later, through the log watcher's pattern event.
        line = "n1:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>"
        await checks.log_event(
            make_event(
                "node-1",
                Kind.LOG_PATTERN,
                severity=Severity.INFO,
                source="logfile",
                data={"pattern": "nccl_net_socket", "text": line},
            )
        )
        return took, probed

    took, probed = asyncio.run(scenario())
    assert took < 10.0 and probed < 10.0
    first, second, third = events
    assert first.kind is Kind.PLATFORM and first.severity is Severity.ERROR
    assert first.data["job"] == "job-7" and first.data["verdict"] == "slow_path"
    assert set(first.data["causes"]) == {"memlock_low", "no_peermem", "shm_small", "acs_enabled"}
    assert first.data["evidence"]["memlock_low"]["bytes"] == {str(proc.pid): 64 << 10}
    assert first.data["evidence"]["shm_small"]["bytes"] == {str(proc.pid): 64 << 10}
    assert first.data["evidence"]["acs_enabled"]["bridges"] == ["0000:00:01.0"]
    assert "nccl_transport" in first.data["unknown"]  # no NCCL line yet: unknown, not passed
    assert first.data["unknown"]["rendezvous"] == "not answered yet (probing)"
    assert first.data["passed"] == ["iommu (off)"]
    assert set(second.data["causes"]) == {*first.data["causes"], "rendezvous_unreachable"}
    assert second.data["evidence"]["rendezvous_unreachable"]["address"] == f"127.0.0.1:{port}"
    assert "ConnectionRefusedError" in second.data["evidence"]["rendezvous_unreachable"]["error"]
    assert "nccl_socket" in third.data["causes"] and third.data["nccl"]["nets"] == ["socket"]


def test_a_fast_rank_passes_what_was_read(tmp_path: Path) -> None:
    """Unlimited memlock, peermem loaded, ACS off, a listening rendezvous: no cause."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
    modules = tmp_path / "modules"
    modules.write_text(MODULES + "nvidia_peermem 16384 0 - Live 0x0000000000000000 (POE)\n")
    roots = Roots(sys=_sys_tree(tmp_path, 0x0001), modules=modules, cmdline=tmp_path / "x")
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)  # the child's (inherited); raising it
        # above the hard limit needs CAP_SYS_RESOURCE, so the minimum is set at it instead.
        floor = 1024.0 if soft == resource.RLIM_INFINITY else soft / (1 << 20)
        cfg = JobChecksConfig(min_shm_mib=0, min_memlock_mib=floor)  # the host's /dev/shm, any size
        checks = JobPathChecks(cfg, "node-1", emit, roots=roots)

        async def check() -> object:
            await checks.ranks("j", [RankInfo(rank=0, pid=proc.pid)])
            await checks.settle()  # the rendezvous answers
            return checks.verdict("j")

        verdict = asyncio.run(check())
    finally:
        proc.kill()
        proc.wait()
        listener.close()
    assert isinstance(verdict, PathVerdict) and verdict.causes == []
    assert {"peermem", "memlock", "shm", "acs", "rendezvous"} <= set(verdict.passed)
    assert verdict.verdict == "unknown" and list(verdict.unknown) == ["nccl_transport"]  # not heard yet
    assert events == []  # nothing to say: NCCL not heard from yet is no event on its own


def test_an_unreadable_rank_is_unknown_with_its_reason(tmp_path: Path) -> None:
    """A pid that is gone: its limits and /dev/shm are unknown, never passed."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    modules = tmp_path / "modules"
    modules.write_text(MODULES)
    roots = Roots(sys=_sys_tree(tmp_path, 0), modules=modules, cmdline=tmp_path / "x")
    asyncio.run(
        JobPathChecks(JobChecksConfig(), "n", emit, roots=roots).ranks("j", [RankInfo(rank=0, pid=proc.pid)])
    )
    data = events[0].data
    assert "FileNotFoundError" in data["unknown"]["memlock"]
    assert "FileNotFoundError" in data["unknown"]["shm"]
    assert "FileNotFoundError" in data["unknown"]["rendezvous"]
    assert not {"memlock", "shm", "rendezvous"} & set(data["passed"])


def test_the_preflight_rdma_check_fails_without_peermem_on_ib_and_names_warnings(tmp_path: Path) -> None:
    from ftd.agent.job_checks.node_check import rdma_node_check

    modules = tmp_path / "modules"
    modules.write_text(MODULES)
    roots = Roots(sys=_sys_tree(tmp_path, 0x001D), modules=modules, cmdline=tmp_path / "x")
    status, reason = rdma_node_check(JobChecksConfig(), roots)
    assert (status, reason) == ("fail", "nvidia_peermem is not loaded (no GPUDirect RDMA)")
    modules.write_text(MODULES + "nvidia_peermem 16384 0 - Live 0x0000000000000000 (POE)\n")
    status, reason = rdma_node_check(JobChecksConfig(), roots)
    assert status == "pass"
    assert reason == (
        "peermem, iommu (off) passed; warning: ACS redirects peer traffic on 1 bridge(s) of the GPU/NIC paths"
    )
    unreadable = Roots(sys=roots.sys, modules=tmp_path / "gone", cmdline=tmp_path / "x")
    status, reason = rdma_node_check(JobChecksConfig(acs=False), unreadable)
    assert status == "skip" and reason.startswith("peermem unknown: ") and "FileNotFoundError" in reason
