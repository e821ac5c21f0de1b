"""The NIC's physical counters: ``ethtool -S <netdev>``, run as a bounded subprocess and parsed.

What: :func:`phy_counters` runs ``ethtool -S`` (the configured binary) with a timeout and returns the
counters whose names end in ``_phy`` and the per-priority PFC pause counters (``rx_prio3_pause``)
-- the port's own (pause frames, discards, symbol and CRC errors as the PHY counts them), not the
interface's software counters, which do not see a pause storm -- or the reason it could not: ethtool
missing, a non-zero exit, a timeout, no such counter in the output (a driver without them).
:func:`parse_stats` is the parser (property-tested).

Why a subprocess: the counters come from the driver through the ethtool netlink/ioctl interface,
not sysfs; ``ethtool`` is the tool every NIC vendor documents. Called from a thread by the watcher.
"""

from __future__ import annotations

import re
import subprocess

__all__ = ["parse_stats", "phy_counters"]

#: mlx5's per-priority PFC counters (``rx_prio3_pause``, ``tx_prio3_pause_duration``): the port's own
#: too, though not named ``_phy``; a site judges its lossless priority's with a ``phy:`` rule.
_PFC = re.compile(r"(?:rx|tx)_prio[0-7]_pause(?:_duration|_transition)?\Z")


def parse_stats(text: str) -> dict[str, int]:
    """``NAME: VALUE`` lines of ``ethtool -S`` (the header and anything not an integer are ignored)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, value = line.strip().rpartition(":")
        value = value.strip()
        if sep and name and " " not in name.strip() and value.isdecimal():
            out[name.strip()] = int(value)
    return out


def phy_counters(ethtool: str, netdev: str, timeout_s: float) -> tuple[dict[str, int], str]:
    """The ``*_phy`` counters of ``netdev`` and ``""``, or ``{}`` and why none were read."""
    try:
        proc = subprocess.run(
            [ethtool, "-S", netdev], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except FileNotFoundError:
        return {}, f"{ethtool} not found"
    except subprocess.TimeoutExpired:
        return {}, f"{ethtool} -S {netdev} did not answer in {timeout_s:g} s"
    except OSError as exc:
        return {}, f"{ethtool}: {exc.strerror or exc}"
    if proc.returncode != 0:
        why = (proc.stderr or proc.stdout).strip().splitlines()
        return {}, f"{ethtool} -S {netdev} exited {proc.returncode}: {why[-1][:200] if why else ''}"
    counters = {k: v for k, v in parse_stats(proc.stdout).items() if k.endswith("_phy") or _PFC.match(k)}
    if not counters:
        return {}, f"{ethtool} -S {netdev} reports no *_phy counter (driver without them)"
    return counters, ""
