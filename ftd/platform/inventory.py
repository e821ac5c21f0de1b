"""The inventory's wire shape: what a node runs, each fact a value or "unknown" with its reason.

What: :class:`Inventory` is the data of a ``Kind.INVENTORY`` event (``msgspec.to_builtins``), sent by
the agent at start and whenever a fact changes, and decoded by the coordinator with
:func:`inventory_from_data` (bad input is ``None``, never a crash). Every fact is a :class:`Fact`:
``value`` when it was read, else ``unknown`` saying why (no NVML, no InfiniBand device, ``ofed_info``
absent, no job printed NCCL's version yet) -- an unread fact is never an empty value that looks
like a pass.

The compared facts (:data:`COMPARED`) are single strings, so nodes compare field by field: ``vbios``
and ``nic_firmware`` are the node's distinct versions, sorted and joined by ``,`` (eight GPUs on one
VBIOS read ``96.00.89.00.01``); ``gpu_serials`` is per node (never compared); the per-device detail
is in ``gpus`` and ``nics``.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "COMPARED",
    "FIELDS",
    "Fact",
    "GpuFacts",
    "Inventory",
    "NicFacts",
    "inventory_from_data",
    "joined",
    "unknown",
]

#: Every fact of an inventory, in the order they are shown.
FIELDS = ("profile", "driver", "cuda", "vbios", "gpu_serials", "nic_firmware", "ofed", "nccl", "kernel", "os")
#: The facts compared between the nodes of one hardware profile (drift) and against minimums.
COMPARED = ("driver", "cuda", "vbios", "nic_firmware", "ofed", "nccl", "kernel", "os")
MAX_FACT = 256  # characters of one value or reason
MAX_DEVICES = 64  # GPUs or NICs listed per node


class Fact(msgspec.Struct, frozen=True, omit_defaults=True):
    """A value that was read, or (``value`` empty) why it could not be: ``unknown``."""

    value: str = ""
    unknown: str = ""

    @property
    def known(self) -> bool:
        return bool(self.value) and not self.unknown

    def text(self) -> str:
        """How it is shown: the value, or ``unknown (why)``."""
        return self.value if self.known else f"unknown ({self.unknown or 'not reported'})"


def unknown(reason: str) -> Fact:
    return Fact(unknown=(reason or "not reported")[:MAX_FACT])


def known(value: str) -> Fact:
    """``value`` (cut to :data:`MAX_FACT`), or unknown when it is empty."""
    value = value.strip()[:MAX_FACT]
    return Fact(value=value) if value else unknown("read an empty value")


def joined(values: list[str], *, none_reason: str) -> Fact:
    """The distinct non-empty ``values``, sorted and joined by ``,``; unknown when there is none."""
    distinct = sorted({v.strip() for v in values if v.strip()})
    return known(",".join(distinct)) if distinct else unknown(none_reason)


class GpuFacts(msgspec.Struct, frozen=True, omit_defaults=True):
    index: int
    name: Fact = Fact()
    serial: Fact = Fact()
    vbios: Fact = Fact()


class NicFacts(msgspec.Struct, frozen=True, omit_defaults=True):
    device: str
    fw_ver: Fact = Fact()
    board_id: Fact = Fact()


class Inventory(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    profile: Fact = Fact()
    driver: Fact = Fact()
    cuda: Fact = Fact()
    vbios: Fact = Fact()
    gpu_serials: Fact = Fact()
    nic_firmware: Fact = Fact()
    ofed: Fact = Fact()
    nccl: Fact = Fact()
    kernel: Fact = Fact()
    os: Fact = Fact()
    gpus: list[GpuFacts] = msgspec.field(default_factory=list)
    nics: list[NicFacts] = msgspec.field(default_factory=list)

    def fact(self, name: str) -> Fact:
        value = getattr(self, name, None)
        return value if isinstance(value, Fact) else unknown(f"no fact {name!r}")

    def facts(self) -> dict[str, Fact]:
        return {name: self.fact(name) for name in FIELDS}

    def to_data(self) -> dict[str, Any]:
        """The event's data."""
        data: dict[str, Any] = msgspec.to_builtins(self)
        return data


def inventory_from_data(data: Any) -> Inventory | None:
    """An event's data as an :class:`Inventory`; ``None`` when it is not one (bad input)."""
    try:
        inventory = msgspec.convert(data, Inventory)
    except (msgspec.ValidationError, TypeError, ValueError):
        return None
    if len(inventory.gpus) > MAX_DEVICES or len(inventory.nics) > MAX_DEVICES:
        return None
    facts = [*inventory.facts().values()]
    facts += [f for g in inventory.gpus for f in (g.name, g.serial, g.vbios)]
    facts += [f for n in inventory.nics for f in (n.fw_ver, n.board_id)]
    if any(len(f.value) > MAX_FACT or len(f.unknown) > MAX_FACT for f in facts):
        return None
    if any(len(n.device) > MAX_FACT for n in inventory.nics):
        return None
    return inventory
