"""Reading the facts of a job's communication path on this node, each a value or unknown with why.

What, and where from (paths relative to the roots passed in, ``/`` in production):

* a rank's memlock limit: ``/proc/<pid>/limits``, the soft value of ``Max locked memory``;
* the ``/dev/shm`` a rank sees: ``statvfs`` of ``/proc/<pid>/root/dev/shm`` (its mount namespace);
* ``nvidia_peermem`` loaded: ``/proc/modules`` (``nv_peer_mem``, the older out-of-tree module, too);
* an InfiniBand node: a device in ``/sys/class/infiniband``, or the hardware profile says so;
* the IOMMU: ``/sys/class/iommu`` empty -> ``off``; else the DMA domain types in
  ``/sys/kernel/iommu_groups/*/type`` (``identity`` -> ``passthrough``, ``DMA``/``DMA-FQ`` ->
  ``translated``), else ``/proc/cmdline`` (``iommu=pt``, ``iommu.passthrough=1``);
* ACS: the ACS Control register (:func:`ftd.pci.acs_control`) of every bridge above each NVIDIA GPU
  and each InfiniBand device in the sysfs device tree;
* the rendezvous: ``MASTER_ADDR``/``MASTER_PORT`` in ``/proc/<pid>/environ``, then a TCP connect.

Why unknown and not pass: a limit the agent could not read may be the 64 KiB one; the verdict
(:func:`ftd.platform.rdma.judge`) reports it as unknown with the reason kept here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from pathlib import Path

from ftd.pci import acs_control, normalize_pci
from ftd.platform.rdma import UNLIMITED, AcsPort, Fact

__all__ = [
    "acs_ports",
    "ib_node",
    "iommu_mode",
    "memlock",
    "peermem",
    "rendezvous",
    "rendezvous_address",
    "shm_size",
]

_PCI_DIR = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
NVIDIA_VENDOR = "0x10de"
NO_DEVICE = "no NVIDIA GPU or InfiniBand device"
NO_RENDEZVOUS = "the rank has no MASTER_ADDR/MASTER_PORT"


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


def memlock(pid: int, proc: Path = Path("/proc")) -> Fact[int]:
    """The soft ``Max locked memory`` of ``pid`` in bytes (:data:`UNLIMITED` for ``unlimited``)."""
    path = proc / str(pid) / "limits"
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return Fact.unknown(f"{path}: {_err(exc)}")
    for line in text.splitlines():
        if line.startswith("Max locked memory"):
            fields = line[len("Max locked memory") :].split()
            if not fields:
                break
            if fields[0] == "unlimited":
                return Fact(UNLIMITED)
            if fields[0].isascii() and fields[0].isdigit():  # "\u00b2" is a digit to isdigit() only
                return Fact(int(fields[0]))
            return Fact.unknown(f"{path}: unreadable value {fields[0][:40]!r}")
    return Fact.unknown(f"{path}: no 'Max locked memory' line")


def shm_size(pid: int, proc: Path = Path("/proc")) -> Fact[int]:
    """The size in bytes of the ``/dev/shm`` ``pid`` sees (its root, its mount namespace)."""
    path = proc / str(pid) / "root" / "dev" / "shm"
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return Fact.unknown(f"{path}: {_err(exc)}")
    return Fact(st.f_blocks * st.f_frsize)


def peermem(modules: Path = Path("/proc/modules")) -> Fact[bool]:
    """Whether ``nvidia_peermem`` (or the older ``nv_peer_mem``) is loaded."""
    try:
        text = modules.read_text(errors="replace")
    except OSError as exc:
        return Fact.unknown(f"{modules}: {_err(exc)}")
    names = {line.split(" ", 1)[0] for line in text.splitlines() if line}
    if not names:
        return Fact.unknown(f"{modules}: empty")
    return Fact(bool(names & {"nvidia_peermem", "nv_peer_mem"}))


def ib_node(sys: Path = Path("/sys"), profile_says: bool | None = None) -> Fact[bool]:
    """Whether this node is on InfiniBand: ``profile_says`` (the site's word) when given, else whether
    it has InfiniBand devices."""
    if profile_says is not None:
        return Fact(profile_says)
    path = sys / "class" / "infiniband"
    try:
        return Fact(bool(os.listdir(path)))
    except FileNotFoundError:
        return Fact(False)  # no RDMA core loaded: no IB devices
    except OSError as exc:
        return Fact.unknown(f"{path}: {_err(exc)}")


def iommu_mode(sys: Path = Path("/sys"), cmdline: Path = Path("/proc/cmdline")) -> Fact[str]:
    """``off``, ``passthrough`` or ``translated``."""
    try:
        units = os.listdir(sys / "class" / "iommu")
    except FileNotFoundError:
        units = []
    except OSError as exc:
        return Fact.unknown(f"{sys / 'class' / 'iommu'}: {_err(exc)}")
    if not units:
        return Fact("off")
    groups = sys / "kernel" / "iommu_groups"
    types: set[str] = set()
    try:
        for group in os.listdir(groups)[:4096]:
            try:
                types.add((groups / group / "type").read_text().strip())
            except OSError:
                continue
    except OSError:
        pass
    if types:
        return Fact("translated" if any(t.startswith("DMA") for t in types) else "passthrough")
    try:
        args = cmdline.read_text(errors="replace").split()
    except OSError as exc:
        return Fact.unknown(f"IOMMU on ({len(units)} unit(s)), its mode unread: {cmdline}: {_err(exc)}")
    if "iommu=pt" in args or "iommu.passthrough=1" in args:
        return Fact("passthrough")
    return Fact("translated")


def _endpoints(sys: Path) -> list[Path]:
    """The sysfs device directories of the NVIDIA GPUs and the InfiniBand devices."""
    found: list[Path] = []
    devices = sys / "bus" / "pci" / "devices"
    try:
        names = sorted(os.listdir(devices))
    except OSError:
        names = []
    for name in names:
        try:
            vendor = (devices / name / "vendor").read_text().strip()
            klass = (devices / name / "class").read_text().strip()
        except OSError:
            continue
        if vendor == NVIDIA_VENDOR and klass[:6] in ("0x0300", "0x0302"):
            found.append(devices / name)
    ib = sys / "class" / "infiniband"
    try:
        for name in sorted(os.listdir(ib)):
            found.append(ib / name / "device")
    except OSError:
        pass
    return found


def acs_ports(sys: Path = Path("/sys")) -> Fact[list[AcsPort]]:
    """The ACS Control of every bridge above the GPUs and IB devices; unknown when none is found or a
    bridge's extended config space cannot be read (not root)."""
    endpoints = _endpoints(sys)
    if not endpoints:
        return Fact.unknown(f"{NO_DEVICE} under {sys}")
    devices_root = (sys / "devices").resolve()
    bridges: dict[str, Path] = {}
    for endpoint in endpoints:
        try:
            real = endpoint.resolve(strict=True)
        except OSError as exc:
            return Fact.unknown(f"{endpoint}: {_err(exc)}")
        for parent in real.parents:
            if parent == devices_root or devices_root not in parent.parents:
                break
            if _PCI_DIR.match(parent.name):
                bridges.setdefault(normalize_pci(parent.name) or parent.name, parent)
    ports = []
    for bdf, where in sorted(bridges.items()):
        try:
            ctrl = acs_control((where / "config").read_bytes()[:4096])
        except (OSError, ValueError) as exc:
            return Fact.unknown(f"{where / 'config'}: {_err(exc)}")
        ports.append(AcsPort(bdf, ctrl))
    return Fact(ports)


def rendezvous_address(pid: int, proc: Path = Path("/proc")) -> tuple[str, int] | str:
    """(MASTER_ADDR, MASTER_PORT) from ``pid``'s environment, or why there is none."""
    path = proc / str(pid) / "environ"
    try:
        raw = path.read_bytes()[: 1 << 20]
    except OSError as exc:
        return f"{path}: {_err(exc)}"
    env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    addr, port = env.get(b"MASTER_ADDR"), env.get(b"MASTER_PORT")
    if not addr or not port:
        return f"{NO_RENDEZVOUS} in its environment"
    try:
        number = int(port)
    except ValueError:
        return f"MASTER_PORT {port[:20]!r} is not a port"
    if not 0 < number < 65536:
        return f"MASTER_PORT {number} is not a port"
    return addr.decode(errors="replace")[:255], number


async def rendezvous(host: str, port: int, timeout_s: float) -> str:
    """``"ok"`` when a TCP connection to ``host:port`` opens within ``timeout_s``, else the error."""
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except OSError as exc:
        return _err(exc)
    writer.close()
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(1.0):
            await writer.wait_closed()
    return "ok"
