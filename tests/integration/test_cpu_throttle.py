"""The bench's CPU throttle (:mod:`ftd.bench.cpu_throttle`) on this host's real cgroup CPU controller:
a busy process with two threads is held to its quota while throttled and runs free again after,
the cgroup is gone after close (also when the process ended first), and a host without a CPU
controller is a clear error."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftd.bench.cpu_throttle import CpuThrottle, ThrottleError, cores_used, find_cpu_controller

BUSY = """
import threading
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
spin()
"""


def _writable() -> str | None:
    try:
        _, mount = find_cpu_controller()
    except ThrottleError as exc:
        return str(exc)
    return None if os.access(mount, os.W_OK) else f"{mount} is not writable"


needs_cgroup = pytest.mark.skipif(_writable() is not None, reason=f"no CPU cgroup: {_writable()}")


@pytest.fixture
def busy() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        time.sleep(0.3)
        yield proc
    finally:
        proc.kill()
        proc.wait()


@needs_cgroup
def test_a_throttled_process_gets_its_quota_and_everything_is_undone(busy: subprocess.Popen[bytes]) -> None:
    throttle = CpuThrottle(busy.pid, cores=0.2)
    origin = Path(f"/proc/{busy.pid}/cgroup").read_text()
    with throttle:
        assert throttle.path.is_dir()
        assert len(throttle.moved) >= 2  # the main thread and the spinning one
        used = cores_used(busy.pid, 1.5)
        assert used < 0.3, used  # two spinning threads would take up to 2 cores unthrottled
        assert throttle.throttled_s() > 0
    assert not throttle.path.exists()
    assert Path(f"/proc/{busy.pid}/cgroup").read_text() == origin
    assert cores_used(busy.pid, 1.0) > 0.3  # free again


@needs_cgroup
def test_close_after_the_process_ended_removes_the_cgroup(busy: subprocess.Popen[bytes]) -> None:
    throttle = CpuThrottle(busy.pid, cores=0.5)
    throttle.start()
    busy.kill()
    busy.wait()
    throttle.close()
    throttle.close()  # twice is fine
    assert not throttle.path.exists()


def test_no_cpu_controller_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ThrottleError, match="no cgroup CPU controller"):
        CpuThrottle(os.getpid(), root=tmp_path)


def test_an_unwritable_controller_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    throttle = CpuThrottle(os.getpid(), root=tmp_path)
    (tmp_path / "cpu").chmod(0o500)
    try:
        if os.access(tmp_path / "cpu", os.W_OK):  # root ignores the mode: make mkdir fail another way
            (tmp_path / "cpu" / throttle.path.name).write_text("in the way")
        with pytest.raises(ThrottleError, match="cannot create the cgroup"):
            throttle.start()
    finally:
        (tmp_path / "cpu").chmod(0o700)


def test_a_v2_hierarchy_is_found(tmp_path: Path) -> None:
    (tmp_path / "cgroup.subtree_control").write_text("cpuset cpu io memory pids\n")
    assert find_cpu_controller(tmp_path) == ("v2", tmp_path)
