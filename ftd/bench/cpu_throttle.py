"""A real CPU throttle for one process: ``ftd bench culprit``'s ``throttled`` case (issue #33 item 5).

:class:`CpuThrottle` makes a cgroup with a CPU quota (half a core by default), moves a process and
all of its threads into it, and on :meth:`CpuThrottle.close` moves them back to the cgroups they came
from and removes the cgroup, as a noisy neighbour or a thermally throttled CPU slows one rank. Both
layouts are handled, detected from what exists: cgroup v2 (``cpu.max`` in the unified hierarchy, the
``cpu`` controller enabled for the parent) and cgroup v1 (the ``cpu`` controller's
``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, as on this host's hybrid layout).

A controller that is missing or cannot be written is :class:`ThrottleError` with the reason: the case
cannot run, and is never silently replaced by something else.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import TracebackType

__all__ = ["CpuThrottle", "ThrottleError", "cores_used", "find_cpu_controller"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


class ThrottleError(RuntimeError):
    """The CPU controller is missing or not writable, or the process could not be moved."""


def find_cpu_controller(root: Path = CGROUP_ROOT) -> tuple[str, Path]:
    """``("v2", dir)`` or ``("v1", dir)``: where a throttling cgroup can be made; ThrottleError if
    neither layout has a CPU quota file here."""
    v1 = root / "cpu"
    if (v1 / "cpu.cfs_quota_us").is_file():
        return "v1", v1
    for v2 in (root, root / "unified"):
        controllers = v2 / "cgroup.subtree_control"
        if controllers.is_file() and "cpu" in controllers.read_text().split():
            return "v2", v2
    raise ThrottleError(
        f"no cgroup CPU controller under {root}: neither {v1}/cpu.cfs_quota_us (v1) nor a v2 "
        "hierarchy with 'cpu' in cgroup.subtree_control"
    )


def _cpu_s(pid: int) -> float:
    """``pid``'s CPU seconds so far (user + system, every thread), from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cores_used(pid: int, seconds: float = 3.0) -> float:
    """The cores ``pid`` used over the next ``seconds`` (what it gets now, contention included)."""
    before, t0 = _cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    return (_cpu_s(pid) - before) / (time.monotonic() - t0)


def _own_cgroup(pid: int, version: str) -> str:
    """The path (relative to the controller's mount) of ``pid``'s cgroup in that hierarchy."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        hid, controllers, path = line.split(":", 2)
        if (version == "v2" and hid == "0") or (version == "v1" and "cpu" in controllers.split(",")):
            return path
    return "/"


class CpuThrottle:
    """Throttle ``pid`` (all its threads) to ``cores`` of CPU until :meth:`close` (module docstring)."""

    def __init__(self, pid: int, cores: float = 0.5, *, root: Path = CGROUP_ROOT, name: str = "") -> None:
        if not 0 < cores <= 64:
            raise ValueError(f"cores must be in (0, 64], got {cores}")
        self.pid = pid
        self.cores = cores
        self.version, self.mount = find_cpu_controller(root)
        self.path = self.mount / (name or f"ftd-bench-throttle-{pid}-{time.monotonic_ns()}")
        self.origin = self.mount / _own_cgroup(pid, self.version).lstrip("/")
        self.moved: list[int] = []
        self.used_before: float | None = None  # the cores the process used before (the caller's note)

    def __enter__(self) -> CpuThrottle:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> None:
        """Make the cgroup, set its quota, move every thread of the process into it."""
        quota = max(1000, int(self.cores * PERIOD_US))
        try:
            self.path.mkdir()
        except OSError as exc:
            raise ThrottleError(f"cannot create the cgroup {self.path}: {exc}") from exc
        try:
            if self.version == "v1":
                (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (self.path / "cpu.cfs_quota_us").write_text(str(quota))
            else:
                (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
            self._move(self.path)
        except (OSError, ThrottleError) as exc:
            self.close()
            raise ThrottleError(f"cannot throttle pid {self.pid} in {self.path}: {exc}") from exc

    def _tids(self) -> list[int]:
        try:
            return sorted(int(t) for t in os.listdir(f"/proc/{self.pid}/task"))
        except FileNotFoundError:
            return []

    def _move(self, into: Path) -> None:
        """Every thread of the process into ``into`` (v1: ``tasks``, per thread; v2: ``cgroup.procs``
        moves the whole process). Threads started meanwhile are caught by a second pass."""
        if self.version == "v2":
            (into / "cgroup.procs").write_text(str(self.pid))
            self.moved = self._tids()
            return
        for _ in range(2):
            for tid in self._tids():
                try:
                    (into / "tasks").write_text(str(tid))
                except ProcessLookupError:
                    continue  # the thread ended
                if tid not in self.moved:
                    self.moved.append(tid)

    def throttled_s(self) -> float:
        """Seconds the cgroup's tasks were held back by the quota so far (``cpu.stat``)."""
        stat = dict(
            line.split(" ", 1) for line in (self.path / "cpu.stat").read_text().splitlines() if " " in line
        )
        if "throttled_usec" in stat:
            return int(stat["throttled_usec"]) / 1e6
        return int(stat.get("throttled_time", "0")) / 1e9

    def close(self) -> None:
        """Move whatever is left in the cgroup back where the process came from; remove the cgroup.
        Safe to call twice and after the process ended."""
        if not self.path.exists():
            return
        procs = self.path / ("cgroup.procs" if self.version == "v2" else "tasks")
        back = self.origin / ("cgroup.procs" if self.version == "v2" else "tasks")
        for _ in range(3):
            try:
                left = [int(x) for x in procs.read_text().split()]
            except OSError:
                left = []
            if not left:
                break
            for tid in left:
                try:
                    back.write_text(str(tid))
                except OSError:
                    continue  # ended meanwhile
        for _ in range(20):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.05)  # a task that just left is still counted for a moment
        raise ThrottleError(f"cannot remove the cgroup {self.path}: tasks are still in it")
