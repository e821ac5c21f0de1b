"""PCI addresses in one canonical form, so the kernel log and NVML name a GPU the same way.

ftd joins GPU facts from several sources by PCI address: kernel lines (``Xid (PCI:0000:3B:00)``,
``GPU 0000:3b:00.0``, ``NVRM: GPU at PCI:0000:3b:00``), NVML (``00000000:3B:00.0``, eight hex digits
of domain, upper case) and ``nvidia-smi``. Events carry the kernel's own spelling, the canonical
form: lowercase ``dddd:bb:dd.f`` (domain, bus, device, function). A missing domain is ``0000``; a
missing function is ``0``; a domain written with leading zeros beyond four digits (NVML's) is cut
back to four, while a genuinely wider domain (``10000:01:00.0``, VMD) keeps its digits.

Standard library only: the kernel-log parser and the NVML backend both import it.
"""

from __future__ import annotations

import re

__all__ = ["ACS_CAP_ID", "acs_control", "ext_capability", "normalize_pci"]

ACS_CAP_ID = 0x000D
"""PCI Express extended capability id of Access Control Services."""
CONFIG_EXT_START = 0x100
CONFIG_EXT_END = 0x1000

_PCI_RE = re.compile(r"(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.([0-7]))?")


def normalize_pci(address: str | bytes | None) -> str | None:
    """The canonical ``dddd:bb:dd.f`` of ``address``, or ``None`` when it is not a PCI address.

    ``0000:3B:00`` -> ``0000:3b:00.0``; ``3b:00.0`` -> ``0000:3b:00.0``; ``PCI:0000:3b:00.1`` ->
    ``0000:3b:00.1``; NVML's ``00000000:3B:00.0`` (str or bytes) -> ``0000:3b:00.0``; junk,
    ``""`` and ``None`` -> ``None``. Idempotent: a canonical address is returned unchanged.
    """
    if not address:
        return None
    text = address.decode(errors="replace") if isinstance(address, bytes) else address
    text = text.strip()
    if text[:4].upper() == "PCI:":
        text = text[4:]
    match = _PCI_RE.fullmatch(text)
    if match is None:
        return None
    domain, bus, dev, fn = match.groups()
    domain = (domain or "").lower().lstrip("0").rjust(4, "0")
    return f"{domain}:{bus.lower()}:{dev.lower()}.{fn or '0'}"


def ext_capability(config: bytes, cap_id: int) -> int | None:
    """Offset of the PCI Express extended capability ``cap_id`` in ``config`` (a device's
    ``/sys/bus/pci/devices/<bdf>/config``), or None when the list does not have it.

    Raises ``ValueError`` when ``config`` is too short to hold the extended space (a non-root reader
    gets only the first 64 bytes): absent and unreadable are different answers. The list is walked
    from 0x100 by each header's next pointer (bits 31:20), at most 1024 steps, ignoring a pointer
    that leaves the space or goes backwards (a loop)."""
    if len(config) < CONFIG_EXT_START + 4:
        raise ValueError(f"config space is {len(config)} bytes: the extended capabilities are not readable")
    offset, seen = CONFIG_EXT_START, 0
    while CONFIG_EXT_START <= offset <= min(len(config), CONFIG_EXT_END) - 4 and seen < 1024:
        header = int.from_bytes(config[offset : offset + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == cap_id:
            return offset
        nxt = (header >> 20) & 0xFFC
        if nxt <= offset:
            return None
        offset, seen = nxt, seen + 1
    return None


def acs_control(config: bytes) -> int | None:
    """The ACS Control register (16 bits at the ACS capability + 6) of a device's config space, or
    None when the device has no ACS capability; ``ValueError`` when the space is not readable."""
    offset = ext_capability(config, ACS_CAP_ID)
    if offset is None or offset + 8 > len(config):
        return None
    return int.from_bytes(config[offset + 6 : offset + 8], "little")
