"""The agent's inventory (issue #36) on a node laid out by a real process: a shell script writes
``proc/sys/kernel/osrelease``, ``etc/os-release`` and ``sys/class/infiniband/<dev>/{fw_ver,board_id}``
in the kernel's layout, a real ``ofed_info`` executable answers ``-s`` (or hangs), NVML is the
backend's fake. Every fact is read or unknown with its reason; a change is reported once, naming it."""

from __future__ import annotations

import asyncio
import contextlib
import stat
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from ftd.agent.inventory.reporter import InventoryReporter
from ftd.agent.watchers.nvml.fake import FakeNvml
from ftd.agent.wiring import build_agent
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config.schema import AgentConfig, InventoryConfig, LogsConfig
from ftd.events import Event, Kind, make_event
from ftd.platform.inventory import inventory_from_data

LAYOUT = r"""
set -e
root="$1"
mkdir -p "$root/proc/sys/kernel" "$root/etc"
printf '5.15.0-91-generic\n' > "$root/proc/sys/kernel/osrelease"
printf 'NAME="Ubuntu"\nVERSION_ID="22.04"\nPRETTY_NAME="Ubuntu 22.04.3 LTS"\n' > "$root/etc/os-release"
for dev in mlx5_0 mlx5_1; do
  mkdir -p "$root/sys/class/infiniband/$dev/ports/1"
  printf '28.39.1002\n' > "$root/sys/class/infiniband/$dev/fw_ver"
  printf 'MT_0000000838\n' > "$root/sys/class/infiniband/$dev/board_id"
done
"""


async def until(predicate: Callable[[], bool]) -> None:
    """Poll ``predicate`` (the caller bounds the wait)."""
    while True:
        if predicate():
            return
        await asyncio.sleep(0.05)


def gone(pid: int) -> bool:
    """No such process any more (or only its zombie, for a parent that has not reaped it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def lay_out(root: Path) -> None:
    subprocess.run(["sh", "-c", LAYOUT, "layout", str(root)], check=True, timeout=30)


def executable(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def nccl_event(text: str, file: str = "/logs/r0.log") -> Event:
    data = {"pattern": "nccl_version", "file": file, "text": text}
    return make_event("node-1", Kind.LOG_PATTERN, severity="info", data=data)


def write_by_process(path: Path, text: str) -> None:
    subprocess.run(
        ["sh", "-c", 'printf "%s\\n" "$2" > "$1"', "write", str(path), text], check=True, timeout=30
    )


def reporter(
    root: Path, ofed: str, nvml: FakeNvml | None, timeout_s: float = 5.0
) -> tuple[InventoryReporter, list[Event]]:
    sent: list[Event] = []

    async def emit(event: Event) -> None:
        sent.append(event)

    cfg = InventoryConfig(interval_s=60, timeout_s=timeout_s, ofed_command=ofed)
    return InventoryReporter(cfg, "node-1", emit, nvml=nvml, root=root), sent


async def test_every_fact_from_a_real_tree_and_the_nvml_fake(tmp_path: Path) -> None:
    lay_out(tmp_path / "root")
    ofed = executable(tmp_path / "ofed_info", "echo 'MLNX_OFED_LINUX-23.10-1.1.9.0:'")
    nvml = FakeNvml(8)
    nvml.gpu(5).vbios = "96.00.74.00.1C"  # one GPU flashed differently: both versions are listed
    inv_reporter, sent = reporter(tmp_path / "root", str(ofed), nvml)
    assert await inv_reporter.report_once()
    assert len(sent) == 1 and sent[0].kind == Kind.INVENTORY and sent[0].severity == "info"
    inv = inventory_from_data(sent[0].data)
    assert inv is not None
    facts = {name: fact.text() for name, fact in inv.facts().items()}
    assert facts["profile"] == "h100-sxm"  # matched from the GPU name
    assert facts["driver"] == "550.54.15" and facts["cuda"] == "12.4"
    assert facts["vbios"] == "96.00.74.00.1C,96.00.89.00.01"
    assert facts["gpu_serials"].split(",")[3] == "1652020000003"
    assert facts["nic_firmware"] == "28.39.1002" and [n.device for n in inv.nics] == ["mlx5_0", "mlx5_1"]
    assert facts["ofed"] == "MLNX_OFED_LINUX-23.10-1.1.9.0"
    assert facts["kernel"] == "5.15.0-91-generic" and facts["os"] == "Ubuntu 22.04.3 LTS"
    assert facts["nccl"].startswith("unknown (no job on this node has printed NCCL's version yet")
    assert not await inv_reporter.report_once()  # unchanged: nothing sent


async def test_a_change_is_reported_once_and_nccl_comes_from_the_jobs_log_line(tmp_path: Path) -> None:
    root = tmp_path / "root"
    lay_out(root)
    nvml = FakeNvml(2)
    inv_reporter, sent = reporter(root, "", nvml)
    await inv_reporter.report_once()
    await asyncio.to_thread(write_by_process, root / "sys/class/infiniband/mlx5_1/fw_ver", "28.40.1000")
    nvml.driver = "535.104.05"
    assert await inv_reporter.report_once()
    second = inventory_from_data(sent[-1].data)
    assert second is not None
    assert second.nic_firmware.value == "28.39.1002,28.40.1000" and second.driver.value == "535.104.05"
    line = "[node-1 0] node-1:4242:4242 [0] NCCL INFO NCCL version 2.21.5+cuda12.4"
    inv_reporter.observe(nccl_event(line))
    assert await inv_reporter.report_once()
    third = inventory_from_data(sent[-1].data)
    assert third is not None and third.nccl.value == "2.21.5+cuda12.4"
    assert len(sent) == 3


async def test_nothing_readable_is_unknown_with_reasons_never_empty(tmp_path: Path) -> None:
    hang = executable(tmp_path / "ofed_info", f"sleep 30 & echo $! > {tmp_path}/child; wait")
    inv_reporter, sent = reporter(tmp_path / "empty", str(hang), FakeNvml(unavailable="driver not loaded"),
                                  timeout_s=0.5)  # fmt: skip
    assert await inv_reporter.report_once()
    inv = inventory_from_data(sent[0].data)
    assert inv is not None
    for name, fact in inv.facts().items():
        assert not fact.known and fact.unknown, name
    assert "NVML unavailable: driver not loaded" in inv.driver.unknown
    assert "timed out after 0.5 s" in inv.ofed.unknown
    child = int((tmp_path / "child").read_text())  # the script's own child is killed with it
    assert gone(child)
    assert "sys/class/infiniband does not exist" in inv.nic_firmware.unknown
    assert "osrelease does not exist" in inv.kernel.unknown


async def test_a_gpu_that_does_not_answer_makes_its_fact_unknown(tmp_path: Path) -> None:
    lay_out(tmp_path / "root")
    nvml = FakeNvml(4)
    nvml.gpu(2).unsupported.add("serial")
    nvml.gpu(3).lost = True
    inv_reporter, sent = reporter(tmp_path / "root", "", nvml)
    await inv_reporter.report_once()
    inv = inventory_from_data(sent[0].data)
    assert inv is not None
    assert inv.gpu_serials.unknown.startswith("GPU 2, 3: NVML: NvmlNotSupported")
    assert inv.vbios.unknown.startswith("GPU 3: NVML: NvmlGpuLost")  # never the three that answered


async def test_run_wakes_on_a_new_nccl_version(tmp_path: Path) -> None:
    lay_out(tmp_path / "root")
    sent: list[Event] = []
    arrived = asyncio.Event()

    async def emit(event: Event) -> None:
        sent.append(event)
        arrived.set()

    inv_reporter = InventoryReporter(InventoryConfig(interval_s=60), "node-1", emit, nvml=FakeNvml(1),
                                     root=tmp_path / "root")  # fmt: skip
    task = asyncio.create_task(inv_reporter.run())
    try:
        async with asyncio.timeout(30):  # generous; the wake-up itself is well before interval_s (60 s)
            await arrived.wait()
            arrived.clear()
            inv_reporter.observe(nccl_event("NCCL INFO NCCL version 2.19.3+cuda12.2", file="/l"))
            await arrived.wait()
    finally:
        task.cancel()
    last = inventory_from_data(sent[-1].data)
    assert last is not None and last.nccl.value == "2.19.3+cuda12.2"


async def test_an_unchanged_inventory_is_sent_again_after_resend_s(tmp_path: Path) -> None:
    lay_out(tmp_path / "root")
    sent: list[Event] = []

    async def emit(event: Event) -> None:
        sent.append(event)

    cfg = InventoryConfig(ofed_command="", resend_s=3600)
    inv_reporter = InventoryReporter(cfg, "node-1", emit, nvml=FakeNvml(1), root=tmp_path / "root")
    assert await inv_reporter.report_once() and not await inv_reporter.report_once()
    inv_reporter._sent_at -= 3601  # resend_s later, unchanged: sent again for a restarted coordinator
    assert await inv_reporter.report_once() and len(sent) == 2 and sent[0].data == sent[1].data
    inv_reporter.resend_soon()  # the coordinator came online: sent again, changed or not
    assert await inv_reporter.report_once() and len(sent) == 3 and not await inv_reporter.report_once()
    never = InventoryReporter(InventoryConfig(ofed_command="", resend_s=0), "node-1", emit, nvml=FakeNvml(1),
                              root=tmp_path / "root")  # fmt: skip
    await never.report_once()
    never._sent_at -= 10**6
    assert not await never.report_once()


async def test_a_real_agent_takes_nccl_from_the_job_log_it_follows(tmp_path: Path) -> None:
    """build_agent's wiring: the log watcher follows the job's log, a real process appends NCCL's init
    line (with the rank supervisor's prefix), the agent's inventory reports that version."""
    log_file = tmp_path / "job.log"
    log_file.touch()
    (tmp_path / "kmsg").touch()
    cfg = AgentConfig(
        node="node-1",
        kmsg_path=str(tmp_path / "kmsg"),
        state_dir=str(tmp_path / "agent"),
        socket_path=f"{tempfile.mkdtemp(prefix='ftd-inv-', dir='/tmp')}/a.sock",
        logs=LogsConfig(paths=[str(log_file)], rescan_s=0.2),
        inventory=InventoryConfig(ofed_command=""),
    )
    agent = build_agent(cfg, bus=MemoryBus(MemoryBroker(), client_id="agent"), node="node-1",
                        nvml_backend=FakeNvml(2))  # fmt: skip
    (reporter_,) = [w for w in agent.watchers if isinstance(w, InventoryReporter)]
    task = asyncio.create_task(agent.run())
    try:
        async with asyncio.timeout(30):  # generous: the machine is shared
            await until(lambda: reporter_.last is not None)
            line = "[node-1 3] node-1:777:777 [3] NCCL INFO NCCL version 2.21.5+cuda12.4"
            await asyncio.to_thread(
                subprocess.run, ["sh", "-c", 'echo "$1" >> "$2"', "append", line, str(log_file)], check=True
            )
            await until(lambda: reporter_.last is not None and reporter_.last.nccl.value == "2.21.5+cuda12.4")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
