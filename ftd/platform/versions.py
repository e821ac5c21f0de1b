"""Version strings compared the way operators read them: ``535.104.05`` < ``550.54.15``.

What: :func:`version_key` turns a driver, VBIOS, firmware, OFED, NCCL or kernel version into a key
that orders numerically part by part (``96.00.89.00.01``, ``28.39.1002``, ``2.21.5+cuda12.4``,
``MLNX_OFED_LINUX-23.10-1.1.9.0``, ``5.15.0-91-generic``); :func:`at_least` says whether a version
meets a minimum. Why here: the agent reports versions as text and the coordinator compares them
against ``versions.toml``'s minimums; both sides must agree on one order.

Rules: the text after ``+`` is build metadata (``+cuda12.4``) and takes no part; the rest is split
into runs of digits (compared as numbers) and runs of letters (compared as words, after numbers);
trailing zero parts do not count (``1.0`` equals ``1.0.0``). Any text has a key (never raises);
text with no digit at all is not a version: :func:`at_least` answers ``None`` (cannot tell).
"""

from __future__ import annotations

import re

__all__ = ["VersionKey", "at_least", "version_key"]

_TOKEN = re.compile(r"\d+|[A-Za-z]+")
_PREFIX = re.compile(r"^[^\d]*?(?=\d)")  # product names before the first digit (MLNX_OFED_LINUX-)
MAX_PARTS = 32  # a longer "version" is cut: keys stay small and comparisons bounded

VersionKey = tuple[tuple[int, int, str], ...]


def version_key(text: str) -> VersionKey:
    """The ordering key of ``text`` (module docstring). Pure; never raises."""
    main = text.strip().partition("+")[0]
    main = _PREFIX.sub("", main, count=1)
    parts: list[tuple[int, int, str]] = []
    for token in _TOKEN.findall(main)[:MAX_PARTS]:
        if token.isdigit():
            parts.append((0, int(token[:18]), ""))  # 18 digits: no huge ints from hostile text
        else:
            parts.append((1, 0, token.casefold()))
    while parts and parts[-1] == (0, 0, ""):
        parts.pop()
    return tuple(parts)


def at_least(value: str, minimum: str) -> bool | None:
    """Whether ``value`` is ``minimum`` or newer; ``None`` when either has no digit (not a version)."""
    if not any(c.isdigit() for c in value) or not any(c.isdigit() for c in minimum):
        return None
    return version_key(value) >= version_key(minimum)
