"""Reading what this node runs: NVML, sysfs, procfs, ``/etc/os-release`` and ``ofed_info``.

What: :func:`read_host` reads the facts the files hold under a root directory (``/`` on a node, a
tree a test wrote): the kernel (``proc/sys/kernel/osrelease``), the OS (``etc/os-release``
``PRETTY_NAME``, else ``NAME`` and ``VERSION_ID``), each InfiniBand/RoCE device's firmware and board
(``sys/class/infiniband/<dev>/fw_ver``, ``board_id``) and the OFED release (``ofed_info -s`` where
the command exists, else ``sys/module/mlx5_core/version``, which MLNX_OFED's driver has and the
kernel's own does not). :func:`read_gpus` asks NVML (any object with the backend's methods: the
agent's :class:`~ftd.agent.watchers.nvml.backend.NvmlBackend`, its fake in tests) for the driver,
CUDA, and each GPU's name, VBIOS and serial, and names the hardware profile from the GPU name.

Why each fact is a :class:`~ftd.platform.inventory.Fact`: a file that is missing, a command that
fails or times out, an NVML question the driver does not answer is "unknown" with that reason,
never an empty value that would compare equal to another node's. Every read is bounded (small
files, a command with a timeout); nothing here raises for a node's state.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

from ftd.catalog.hardware_profiles import HardwareCatalog
from ftd.platform.inventory import Fact, GpuFacts, NicFacts, joined, known, unknown

__all__ = ["GpuFactsRead", "HostFactsRead", "NvmlVersions", "read_gpus", "read_host", "read_ofed"]

MAX_FILE = 64 << 10  # bytes read from one file
MAX_NICS = 64


class _Identity(Protocol):
    @property
    def name(self) -> str: ...


class NvmlVersions(Protocol):
    """The NVML backend's questions the inventory asks (a subset of ``NvmlBackend``)."""

    def init(self) -> None: ...

    def device_count(self) -> int: ...

    def identity(self, index: int) -> _Identity: ...

    def driver_version(self) -> str: ...

    def cuda_driver_version(self) -> str: ...

    def vbios_version(self, index: int) -> str: ...

    def serial(self, index: int) -> str: ...


def _why(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _read(path: Path) -> tuple[str | None, str]:
    """(the file's text, stripped) or (None, why not)."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE)
    except FileNotFoundError:
        return None, f"{path} does not exist"
    except OSError as exc:
        return None, f"cannot read {path}: {exc.strerror or exc}"
    return data.decode(errors="replace").strip(), ""


def _file_fact(path: Path) -> Fact:
    text, why = _read(path)
    return unknown(why) if text is None else known(text)


def read_kernel(root: Path) -> Fact:
    return _file_fact(root / "proc" / "sys" / "kernel" / "osrelease")


def read_os(root: Path) -> Fact:
    path = root / "etc" / "os-release"
    text, why = _read(path)
    if text is None:
        return unknown(why)
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip().isidentifier():
            values[key.strip()] = value.strip().strip("\"'")
    if values.get("PRETTY_NAME"):
        return known(values["PRETTY_NAME"])
    name = " ".join(v for v in (values.get("NAME", ""), values.get("VERSION_ID", "")) if v)
    return known(name) if name else unknown(f"{path} has no PRETTY_NAME, NAME or VERSION_ID")


def read_nics(root: Path) -> tuple[list[NicFacts], Fact]:
    """Each RDMA device's firmware and board id, and the node's distinct firmware versions."""
    base = root / "sys" / "class" / "infiniband"
    try:
        devices = sorted(p for p in base.iterdir())[:MAX_NICS]
    except FileNotFoundError:
        return [], unknown(f"no RDMA device: {base} does not exist")
    except OSError as exc:
        return [], unknown(f"cannot list {base}: {exc.strerror or exc}")
    nics = [NicFacts(d.name, _file_fact(d / "fw_ver"), _file_fact(d / "board_id")) for d in devices]
    if not nics:
        return [], unknown(f"no RDMA device in {base}")
    fw = joined([n.fw_ver.value for n in nics if n.fw_ver.known], none_reason="")
    missing = [n.device for n in nics if not n.fw_ver.known]
    if missing:  # one unreadable device makes the node's firmware unknown: never a partial pass
        first = next(n for n in nics if not n.fw_ver.known)
        return nics, unknown(f"firmware of {', '.join(missing)} unknown: {first.fw_ver.unknown}")
    return nics, fw


Runner = Callable[[list[str], float], tuple[int, str]]


def run_command(argv: list[str], timeout_s: float) -> tuple[int, str]:
    """(exit status, stdout) of ``argv``; OSError and :class:`subprocess.TimeoutExpired` raise. On a
    timeout its whole process group is killed (a script's own children too, never left behind)."""
    with subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    ) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return proc.returncode, out[:MAX_FILE].decode(errors="replace")


def read_ofed(root: Path, command: str, timeout_s: float, runner: Runner = run_command) -> Fact:
    """``ofed_info -s`` (``MLNX_OFED_LINUX-23.10-1.1.9.0:``), else the module's version file."""
    why = ""
    exe = shutil.which(command) if command else None
    if exe is not None:
        try:
            rc, out = runner([exe, "-s"], timeout_s)
        except subprocess.TimeoutExpired:
            why = f"{command} -s timed out after {timeout_s:g} s"
        except OSError as exc:
            why = f"{command} -s failed: {exc.strerror or exc}"
        else:
            line = out.strip().splitlines()[0].strip().rstrip(":") if out.strip() else ""
            if rc == 0 and line:
                return known(line)
            why = f"{command} -s exited {rc}" + ("" if line else " with no output")
    else:
        why = f"{command or 'ofed_info'} not found"
    version = root / "sys" / "module" / "mlx5_core" / "version"
    text, file_why = _read(version)
    if text:
        return known(text)
    return unknown(f"{why}; {file_why or f'{version} is empty'}")


@dataclass(frozen=True)
class HostFactsRead:
    """What :func:`read_host` found."""

    kernel: Fact
    os: Fact
    nics: list[NicFacts]
    nic_firmware: Fact
    ofed: Fact


def read_host(root: Path, *, ofed_command: str = "ofed_info", timeout_s: float = 5.0,
              runner: Runner = run_command) -> HostFactsRead:  # fmt: skip
    """The file-held facts under ``root`` (module docstring)."""
    kernel = read_kernel(root)
    if not kernel.known and root == Path("/"):
        kernel = known(os.uname().release)
    nics, firmware = read_nics(root)
    ofed = read_ofed(root, ofed_command, timeout_s, runner)
    return HostFactsRead(kernel, read_os(root), nics, firmware, ofed)


@dataclass(frozen=True)
class GpuFactsRead:
    """What :func:`read_gpus` found."""

    driver: Fact
    cuda: Fact
    vbios: Fact
    serials: Fact
    gpus: list[GpuFacts]
    profile: Fact


def _ask(question: Callable[[], str]) -> Fact:
    try:
        return known(question())
    except Exception as exc:  # an NVML error, or anything a broken driver raises: unknown, why
        return unknown(f"NVML: {_why(exc)}")


def read_gpus(nvml: NvmlVersions | None, *, profile: str, catalog: HardwareCatalog,
              why_none: str = "NVML is not used on this node") -> GpuFactsRead:  # fmt: skip
    """The GPU facts through ``nvml`` (already initialised); every one unknown when it is ``None``.

    ``profile``: the configured hardware profile (``hardware.profile``), else matched from the first
    GPU's name; a name no profile matches leaves the profile unknown with that name as the reason."""
    if nvml is None:
        none = unknown(why_none)
        prof = known(profile) if profile else unknown(f"no hardware profile configured and {why_none}")
        return GpuFactsRead(none, none, none, none, [], prof)
    driver = _ask(nvml.driver_version)
    cuda = _ask(nvml.cuda_driver_version)
    try:
        count = nvml.device_count()
    except Exception as exc:
        why = unknown(f"NVML: cannot count GPUs: {_why(exc)}")
        prof = known(profile) if profile else why
        return GpuFactsRead(driver, cuda, why, why, [], prof)
    gpus = []
    for index in range(min(count, 64)):
        name = _ask(partial(_gpu_name, nvml, index))
        vbios = _ask(partial(nvml.vbios_version, index))
        serial = _ask(partial(nvml.serial, index))
        gpus.append(GpuFacts(index=index, name=name, serial=serial, vbios=vbios))
    if not gpus:
        none = unknown("NVML lists no GPU")
        return GpuFactsRead(driver, cuda, none, none, [], known(profile) if profile else none)
    vbios_fact = _all_or_unknown(gpus, "vbios")
    serials = _all_or_unknown(gpus, "serial", join_all=True)
    return GpuFactsRead(driver, cuda, vbios_fact, serials, gpus, _profile(profile, gpus, catalog))


def _gpu_name(nvml: NvmlVersions, index: int) -> str:
    return nvml.identity(index).name


def _all_or_unknown(gpus: list[GpuFacts], attr: str, *, join_all: bool = False) -> Fact:
    facts: list[Fact] = [getattr(g, attr) for g in gpus]
    bad = [(g.index, f) for g, f in zip(gpus, facts, strict=True) if not f.known]
    if bad:
        fact = bad[0][1]
        which = ", ".join(str(i) for i, _ in bad)
        return unknown(f"GPU {which}: {fact.unknown}")
    if join_all:  # per GPU, in index order (serials differ by nature)
        return known(",".join(f.value for f in facts))
    return joined([f.value for f in facts], none_reason="no GPU answered")


def _profile(configured: str, gpus: list[GpuFacts], catalog: HardwareCatalog) -> Fact:
    if configured:
        return known(configured)
    names = sorted({g.name.value for g in gpus if g.name.known})
    if not names:
        return unknown("no GPU name could be read to match a hardware profile")
    matched = {catalog.profile_for_gpu(n) for n in names}
    if None in matched or len(matched) != 1:
        return unknown(f"no single hardware profile matches the GPU names {', '.join(names)}")
    (name,) = matched
    assert name is not None
    return known(name)
