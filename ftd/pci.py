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

__all__ = ["normalize_pci"]

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
