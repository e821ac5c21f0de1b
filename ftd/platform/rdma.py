"""A job's communication path judged: is it on the fast (RDMA) path, and if not, why.

What: :class:`PathFacts` holds what the agent read for one job on one node -- each fact a
:class:`Fact`, a value or the reason it could not be read -- and :func:`judge` turns them into a
:class:`PathVerdict`: the causes of a slow path (each named, with its evidence), the facts that
are unknown (with their reasons: never a pass), and the checks that passed.

The causes (docs/rdma-and-burn-in.md has each one's source and threshold):

* ``nccl_socket``: NCCL's init output says ``NET/Socket`` on an InfiniBand cluster (error);
* ``nccl_no_gdrdma``: NCCL's channels go ``via NET/IB`` without ``GDRDMA`` (warning);
* ``no_peermem``: ``nvidia_peermem`` is not loaded on an InfiniBand node (error: no GPUDirect RDMA);
* ``memlock_low``: a rank's ``Max locked memory`` is below the minimum on an InfiniBand node (error:
  the verbs cannot pin NCCL's buffers; NCCL falls back or fails);
* ``shm_small``: the ``/dev/shm`` a rank sees is smaller than the minimum (warning: NCCL's SHM
  transport and the data loaders run out);
* ``acs_enabled``: a PCI bridge on a GPU's or NIC's path redirects peer traffic (ACS P2P Request or
  Completion Redirect on): GPUDirect traffic goes up to the root complex (warning);
* ``iommu_translated``: the IOMMU translates DMA (not passthrough) (warning);
* ``rendezvous_unreachable``: the rank's ``MASTER_ADDR:MASTER_PORT`` refused or timed out (error).

Pure: the agent collects, this judges; the coordinator may judge the same facts the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ftd.platform.nccl_init import NcclTransport

__all__ = [
    "NO_NCCL_LINE",
    "UNLIMITED",
    "AcsPort",
    "Cause",
    "Fact",
    "PathFacts",
    "PathVerdict",
    "Thresholds",
    "judge",
]

T = TypeVar("T")
NO_NCCL_LINE = "no NCCL INFO init line seen yet (the job sets no NCCL_DEBUG=INFO, or NCCL has not started)"
UNLIMITED = 2**63 - 1
"""``Max locked memory`` of ``unlimited``, in bytes."""


@dataclass(frozen=True)
class Fact(Generic[T]):
    """A value read, or None with the reason it could not be (``why``)."""

    value: T | None = None
    why: str = ""

    @classmethod
    def unknown(cls, why: str) -> Fact[T]:
        return cls(None, why or "not read")

    @property
    def known(self) -> bool:
        return self.value is not None


@dataclass(frozen=True)
class AcsPort:
    """A bridge on a GPU's or NIC's path and its ACS Control register (None: no ACS capability)."""

    bdf: str
    ctrl: int | None

    @property
    def redirects(self) -> bool:
        """P2P Request Redirect (bit 2) or P2P Completion Redirect (bit 3) on."""
        return self.ctrl is not None and bool(self.ctrl & 0b1100)


@dataclass(frozen=True)
class Thresholds:
    min_memlock_bytes: int = 1 << 30
    min_shm_bytes: int = 1 << 30


@dataclass
class PathFacts:
    """What was read for one job on one node. ``memlock``/``shm`` per rank pid."""

    ib_cluster: Fact[bool] = field(default_factory=lambda: Fact[bool].unknown("not read"))
    peermem: Fact[bool] = field(default_factory=lambda: Fact[bool].unknown("not read"))
    memlock: dict[int, Fact[int]] = field(default_factory=dict)
    shm: dict[int, Fact[int]] = field(default_factory=dict)
    acs: Fact[list[AcsPort]] = field(default_factory=lambda: Fact[list[AcsPort]].unknown("not read"))
    iommu: Fact[str] = field(default_factory=lambda: Fact[str].unknown("not read"))
    rendezvous: Fact[str] = field(default_factory=lambda: Fact[str].unknown("not read"))
    """``"ok"`` or the connect error; unknown when the rank has no MASTER_ADDR/PORT."""
    rendezvous_addr: str = ""
    nccl: NcclTransport | None = None


@dataclass(frozen=True)
class Cause:
    name: str
    severity: str  # "error" | "warning"
    detail: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class PathVerdict:
    causes: list[Cause] = field(default_factory=list)
    unknown: dict[str, str] = field(default_factory=dict)
    passed: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """``slow_path`` (a cause), ``unknown`` (no cause, some fact unread) or ``ok``."""
        if self.causes:
            return "slow_path"
        return "unknown" if self.unknown else "ok"

    @property
    def severity(self) -> str:
        if any(c.severity == "error" for c in self.causes):
            return "error"
        return "warning" if self.causes else "info"

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "causes": [c.name for c in self.causes],
            "details": {c.name: c.detail for c in self.causes},
            "evidence": {c.name: c.evidence for c in self.causes},
            "unknown": dict(self.unknown),
            "passed": list(self.passed),
        }


def _mib(n: int) -> str:
    return (
        "unlimited" if n >= UNLIMITED else f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n / 1024:g} KiB"
    )


def judge(facts: PathFacts, limits: Thresholds | None = None) -> PathVerdict:
    """The verdict on ``facts``: every check either a cause, a pass, or unknown with its reason."""
    lim = limits or Thresholds()
    out = PathVerdict()
    ib = facts.ib_cluster.value
    not_ib = "not an InfiniBand node (no /sys/class/infiniband device, profile does not say so)"
    ib_unknown = f"whether this is an InfiniBand node is unknown: {facts.ib_cluster.why}"

    def ib_only(name: str) -> bool:
        """True when the IB-only check ``name`` applies; else records it as passed/unknown."""
        if ib is None:
            out.unknown[name] = ib_unknown
            return False
        if not ib:
            out.passed.append(f"{name} ({not_ib})")
            return False
        return True

    # NCCL's own word on the transport.
    nccl = facts.nccl
    if nccl is None or not nccl.known:
        out.unknown["nccl_transport"] = NO_NCCL_LINE
    elif ib is None and nccl.on_socket:
        out.unknown["nccl_transport"] = f"NCCL uses NET/Socket; {ib_unknown}"
    elif ib and nccl.on_socket:
        out.causes.append(
            Cause("nccl_socket", "error", "NCCL uses NET/Socket on an InfiniBand node", nccl.to_dict())
        )
    else:
        out.passed.append("nccl_transport")
        if "ib" in nccl.nets and nccl.channels_staged and not nccl.channels_gdrdma:
            out.causes.append(
                Cause(
                    "nccl_no_gdrdma",
                    "warning",
                    "NCCL's channels go via NET/IB without GDRDMA (staged through host memory)",
                    nccl.to_dict(),
                )
            )

    if ib_only("peermem"):
        if facts.peermem.value is None:
            out.unknown["peermem"] = facts.peermem.why
        elif not facts.peermem.value:
            out.causes.append(
                Cause("no_peermem", "error", "nvidia_peermem is not loaded (no GPUDirect RDMA)", {})
            )
        else:
            out.passed.append("peermem")

    if ib_only("memlock"):
        if not facts.memlock:
            out.unknown["memlock"] = "no rank process known"
        low = {
            pid: f.value
            for pid, f in facts.memlock.items()
            if f.value is not None and f.value < lim.min_memlock_bytes
        }
        unread = {pid: f.why for pid, f in facts.memlock.items() if f.value is None}
        if low:
            worst = min(low.values())
            out.causes.append(
                Cause(
                    "memlock_low",
                    "error",
                    f"ranks' Max locked memory {_mib(worst)} < {_mib(lim.min_memlock_bytes)}",
                    {"pids": sorted(low), "bytes": {str(p): v for p, v in sorted(low.items())}},
                )
            )
        elif unread:
            out.unknown["memlock"] = "; ".join(f"pid {p}: {w}" for p, w in sorted(unread.items()))
        elif facts.memlock:
            out.passed.append("memlock")

    small = {
        pid: f.value for pid, f in facts.shm.items() if f.value is not None and f.value < lim.min_shm_bytes
    }
    unread_shm = {pid: f.why for pid, f in facts.shm.items() if f.value is None}
    if small:
        out.causes.append(
            Cause(
                "shm_small",
                "warning",
                f"/dev/shm {_mib(min(small.values()))} < {_mib(lim.min_shm_bytes)}",
                {"pids": sorted(small), "bytes": {str(p): v for p, v in sorted(small.items())}},
            )
        )
    elif unread_shm or not facts.shm:
        why = "; ".join(f"pid {p}: {w}" for p, w in sorted(unread_shm.items()))
        out.unknown["shm"] = why or "no rank process known"
    else:
        out.passed.append("shm")

    if facts.acs.value is None:
        out.unknown["acs"] = facts.acs.why
    else:
        on = [p for p in facts.acs.value if p.redirects]
        if on:
            out.causes.append(
                Cause(
                    "acs_enabled",
                    "warning",
                    f"ACS redirects peer traffic on {len(on)} bridge(s) of the GPU/NIC paths",
                    {"bridges": [p.bdf for p in on][:32], "ctrl": {p.bdf: p.ctrl for p in on[:32]}},
                )
            )
        else:
            out.passed.append("acs")

    if facts.iommu.value is None:
        out.unknown["iommu"] = facts.iommu.why
    elif facts.iommu.value == "translated":
        out.causes.append(
            Cause(
                "iommu_translated",
                "warning",
                "the IOMMU translates DMA (not iommu=pt)",
                {"iommu": "translated"},
            )
        )
    else:
        out.passed.append(f"iommu ({facts.iommu.value})")

    if facts.rendezvous.value is None:
        out.unknown["rendezvous"] = facts.rendezvous.why
    elif facts.rendezvous.value != "ok":
        out.causes.append(
            Cause(
                "rendezvous_unreachable",
                "error",
                f"rendezvous {facts.rendezvous_addr} not reachable: {facts.rendezvous.value}",
                {"address": facts.rendezvous_addr, "error": facts.rendezvous.value},
            )
        )
    else:
        out.passed.append("rendezvous")
    return out
