"""The fabric watcher's memory across agent restarts: counter histories and what it has reported open.

What: one JSON file in the agent's state dir (``fabric.json``), written atomically
(:func:`ftd.fileio.write_atomic`) after each poll that changed it: every counter's recent samples
(:class:`~ftd.fabric.rates.CounterHistory`) and the subjects of the conditions it reported and has not
yet cleared (with their last event's data). A restarted agent so judges a counter's last hour across
the restart, judges what rose while it was down, and clears what it opened before.

A file that is missing, unreadable or not this shape is an empty memory (logged), never a crash:
the counters then start from their current values. The file names the kernel's boot id: after a
reboot it is forgotten whole -- the conditions it held (the agent's condition book forgets them too,
and a link still bad after the reboot must be reported open again) and the histories (the reboot
reset the counters, and a port that trains at boot counts a ``link_downed``: judged against the last
boot's values, every reboot would look like a link fault).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftd.fabric.rates import HOUR_S, CounterHistory
from ftd.fileio import write_atomic
from ftd.logs import get_logger

__all__ = ["FabricState", "boot_id", "load_state", "save_state"]

log = get_logger(__name__)
VERSION = 1


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id(path: Path = BOOT_ID) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


@dataclass
class FabricState:
    counters: dict[str, CounterHistory] = field(default_factory=dict)
    open: dict[str, dict[str, Any]] = field(default_factory=dict)  # subject -> the event's data
    boot: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "boot": self.boot,
            "counters": {key: history.to_json() for key, history in self.counters.items()},
            "open": self.open,
        }


def load_state(path: Path | None, window_s: float = HOUR_S, boot: str | None = None) -> FabricState:
    """The saved state (module docstring); ``boot``: this boot's id (default: the kernel's)."""
    boot = boot_id() if boot is None else boot
    if path is None:
        return FabricState(boot=boot)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return FabricState(boot=boot)
    except (OSError, ValueError) as exc:
        log.warning("fabric_state_unreadable", path=str(path), error=str(exc)[:200])
        return FabricState(boot=boot)
    if not isinstance(data, dict) or data.get("version") != VERSION:
        log.warning("fabric_state_unknown_shape", path=str(path))
        return FabricState(boot=boot)
    if data.get("boot") != boot:
        # The reboot reset the counters (and NVML's); a link that trains at boot counts a
        # link_downed: judged against the last boot's values, every reboot would look like a fault.
        log.info("fabric_state_forgotten_after_reboot", path=str(path))
        return FabricState(boot=boot)
    counters = data.get("counters")
    opened = data.get("open")
    state = FabricState(boot=boot)
    if isinstance(counters, dict):
        for key, samples in counters.items():
            if isinstance(key, str):
                state.counters[key] = CounterHistory.from_json(samples, window_s)
    if isinstance(opened, dict):
        state.open = {k: v for k, v in opened.items() if isinstance(k, str) and isinstance(v, dict)}
    return state


def save_state(path: Path | None, state: FabricState) -> bool:
    """Write ``state``; False (logged) when it cannot be written: the watcher goes on in memory."""
    if path is None:
        return True
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(state.to_json(), separators=(",", ":")), fsync=False)
    except OSError as exc:
        log.warning("fabric_state_not_saved", path=str(path), error=str(exc)[:200])
        return False
    return True
