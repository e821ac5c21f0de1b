"""The node's active critical conditions, kept by the agent for ``ftd health`` and preflight.

What: every event the agent publishes passes :meth:`ConditionBook.observe`. A critical event opens
a *condition* keyed by kind and subject (the GPU's PCI address or UUID, the mount, the job), and so
does a watcher that should watch and cannot (``agent_health`` with ``problem =
"watcher_unavailable"``, keyed by the watcher: NVML broken on a node with GPUs, whose state is then
unknown, never healthy); it stays active until what it is about says it is over:

* ``fs_fill``: the watcher reports the mount's level back at ``ok`` or ``warning``;
* any kind: an ``info`` event of the same kind and subject (a ``fabric`` or ``pcie_link`` event names
  its own ``subject``: one counter of one port, one PCIe link) (a GPU reset's ``reset_ok`` /
  ``healthy`` on that GPU also ends its ``xid`` / ``gpu_fallen_off_bus`` / ``gpu_health``
  conditions: the reset is what resolves them; not a GPU past the SRAM replacement threshold, an
  ``ecc`` condition with ``signal = "sram_threshold"``: its count is over the GPU's life, a reset
  does not lower it);
* ``job_leftover`` (GPU processes a job left behind, from the Epilog): once none of those processes
  is alive any more (checked on each read);
* a passing preflight (:meth:`clear_all`, hardware conditions only) or a reboot: the book is saved
  in ``state_dir`` with the kernel's boot id and forgotten when the boot id changes (an Xid 79 stays
  a reason to keep the node out across an agent restart, not across a reboot). ``fs_fill`` and
  ``agent_health`` conditions are not saved: their watchers report them again when they start.

Why: Slurm's ``HealthCheckProgram`` (``ftd health --slurm``) must keep a node out of service on its
own, even while the coordinator is down, and must answer in well under a second: it asks the agent
over the local socket for this list instead of probing anything itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftd.events import Event, Kind, Severity
from ftd.fileio import write_atomic
from ftd.logs import get_logger

log = get_logger(__name__)

MAX_CONDITIONS = 256
BOOT_ID = "/proc/sys/kernel/random/boot_id"
_GPU_KINDS = frozenset({Kind.XID, Kind.GPU_FALLEN_OFF_BUS, Kind.GPU_HEALTH, Kind.ECC, Kind.ROW_REMAP})
_RESET_DONE = frozenset({"reset_ok", "healthy"})
_NOT_SAVED = frozenset({Kind.FS_FILL, Kind.AGENT_HEALTH})  # their watchers report them again at start
WATCHER_UNAVAILABLE = "watcher_unavailable"  # agent_health problem that is a condition
_LIFETIME_SIGNALS = frozenset({"sram_threshold"})  # a reset does not end these (lifetime counters)
_SUBJECT_KINDS = frozenset({Kind.FABRIC, Kind.PCIE_LINK})  # their data names its own subject


@dataclass
class Condition:
    key: str
    kind: str
    reason: str
    since: float
    event_id: str = ""
    subject: str = ""
    pids: list[int] = field(default_factory=list)
    signal: str = ""  # the event's data.signal, when it had one

    def to_dict(self) -> dict[str, Any]:
        # A shallow copy, not dataclasses.asdict: the book saves every condition on each change, and
        # asdict's recursive copy made a 256-condition save 3.1 ms (0.33 ms this way), which a burst
        # of distinct Xid lines turned into seconds of blocked event loop under load (issue #31).
        return {**vars(self), "pids": list(self.pids)}


def boot_id(path: str = BOOT_ID) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _subject(event: Event) -> str:
    data = event.data
    if event.kind == Kind.AGENT_HEALTH and isinstance(data.get("watcher"), str):
        return str(data["watcher"])
    if event.kind == Kind.FS_FILL:
        return str(data.get("path") or "-")
    if event.kind == Kind.JOB_LEFTOVER:
        return str(data.get("job") or "-")
    if event.kind in _SUBJECT_KINDS and isinstance(data.get("subject"), str) and data["subject"]:
        return str(data["subject"])  # one counter of one port, one PCIe link (ftd.agent.watchers.fabric)
    for name in ("pci", "uuid"):
        value = data.get(name)
        if isinstance(value, str) and value:
            return value
    return "node"


def reason_of(event: Event) -> str:
    """One short line saying what is wrong (the drain reason ``ftd health`` gives Slurm); a drill's
    (``ftd inject``: ``data.drill``) ends with `` (drill)``, so everyone who sees it knows."""
    reason = _reason(event)
    return f"{reason} (drill)" if event.data.get("drill") is True else reason


def _reason(event: Event) -> str:
    data = event.data
    kind = str(event.kind)
    subject = _subject(event)
    if event.kind == Kind.XID:
        where = f" on {subject}" if subject != "node" else ""
        name = data.get("name") or data.get("mnemonic") or ""
        return f"xid {data.get('code')}{where}" + (f" {name}" if name else "")
    if event.kind == Kind.FS_FILL:
        return f"fs {subject} {data.get('used_pct', '?')}% full ({data.get('resource', 'bytes')})"
    if event.kind == Kind.GPU_MISSING:
        if "expected" in data:
            return f"gpu missing: {data.get('found')} of {data.get('expected')} GPUs"
        return f"gpu missing: {data.get('reason') or subject}"
    if event.kind == Kind.AGENT_HEALTH and isinstance(data.get("reason"), str):
        return str(data["reason"])[:300]
    if event.kind == Kind.JOB_LEFTOVER:
        return f"job {subject} left GPU processes {','.join(str(p) for p in data.get('gpu_pids', []))}"
    if event.kind == Kind.FABRIC and data.get("check") == "counter":
        return (
            f"fabric {data.get('counter')} on {data.get('device')} port {data.get('port', '-')}: "
            f"{data.get('per_hour')}/h, {data.get('per_s')}/s ({data.get('threshold')}, {data.get('class')})"
        )
    detail = data.get("signal") or data.get("problem") or data.get("reason") or ""
    return f"{kind} {subject}" + (f" {detail}" if detail else "")


class ConditionBook:
    """Active critical conditions of this node; ``path`` (or None) is where they are saved."""

    def __init__(
        self,
        path: Path | None = None,
        *,
        boot: str | None = None,
        proc_root: str = "/proc",
        clock: Any = time.time,
    ) -> None:
        self.path = path
        self.boot = boot_id() if boot is None else boot
        self.proc_root = proc_root
        self._clock = clock
        self._active: dict[str, Condition] = {}
        self._load()

    # --- persistence -------------------------------------------------------------------------

    def _load(self) -> None:
        if self.path is None:
            return
        try:
            saved = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("conditions_unreadable", path=str(self.path), error=str(exc)[:200])
            return
        if not isinstance(saved, dict) or saved.get("boot") != self.boot:
            log.info("conditions_forgotten_after_reboot", path=str(self.path))
            return
        for item in saved.get("conditions", []):
            try:
                cond = Condition(**item)
            except TypeError:
                continue
            self._active[cond.key] = cond

    def _save(self) -> None:
        if self.path is None:
            return
        keep = [c.to_dict() for c in self._active.values() if c.kind not in _NOT_SAVED]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # No fsync: the book is forgotten after a reboot anyway (the boot id changes).
            write_atomic(self.path, json.dumps({"boot": self.boot, "conditions": keep}), fsync=False)
        except OSError as exc:  # a full disk must not stop the agent: the book stays in memory
            log.warning("conditions_not_saved", path=str(self.path), error=str(exc)[:200])

    # --- updates -----------------------------------------------------------------------------

    def observe(self, event: Event) -> bool:
        """Fold one published event in; True when the active set changed."""
        changed = False
        subject = _subject(event)
        key = f"{event.kind}:{subject}"
        data = event.data
        if event.kind == Kind.FS_FILL and data.get("level") in ("ok", "warning"):
            changed = self._drop(key)
        elif event.kind == Kind.GPU_HEALTH and data.get("result") in _RESET_DONE:
            ids = {v for v in (data.get("pci"), data.get("uuid")) if isinstance(v, str) and v}
            for cond in list(self._active.values()):
                if cond.signal in _LIFETIME_SIGNALS:
                    continue
                if Kind(cond.kind) in _GPU_KINDS and (cond.subject in ids or cond.subject == "node"):
                    changed = self._drop(cond.key) or changed
        elif event.severity == Severity.INFO:
            changed = self._drop(key)
        elif event.kind == Kind.AGENT_HEALTH and data.get("problem") == WATCHER_UNAVAILABLE:
            changed = self._set(event, key, subject, [])  # a watcher that should watch and cannot
        elif event.kind == Kind.JOB_LEFTOVER:
            pids = [p for p in data.get("gpu_pids", []) if isinstance(p, int)]
            if pids:
                changed = self._set(event, key, subject, pids)
        elif event.severity == Severity.CRITICAL:
            changed = self._set(event, key, subject, [])
        if changed:
            self._save()
        return changed

    def _set(self, event: Event, key: str, subject: str, pids: list[int]) -> bool:
        old = self._active.get(key)
        reason = reason_of(event)
        if old is not None and old.reason == reason and old.pids == pids:
            return False
        if old is None and len(self._active) >= MAX_CONDITIONS:
            return False
        self._active[key] = Condition(
            key=key,
            kind=str(event.kind),
            reason=reason,
            since=old.since if old is not None else event.ts,
            event_id=event.id,
            subject=subject,
            pids=pids,
            signal=signal if isinstance(signal := event.data.get("signal"), str) else "",
        )
        log.info("condition_active", key=key, reason=reason)
        return True

    def _drop(self, key: str) -> bool:
        if self._active.pop(key, None) is None:
            return False
        log.info("condition_cleared", key=key)
        return True

    def clear_all(self, *, why: str, kinds: frozenset[str] | None = None) -> list[str]:
        """Forget every condition (of ``kinds`` when given): a passing preflight, an operator."""
        gone = [k for k, c in self._active.items() if kinds is None or c.kind in kinds]
        for key in gone:
            del self._active[key]
        if gone:
            log.info("conditions_cleared", keys=gone, why=why)
            self._save()
        return gone

    # --- reads -------------------------------------------------------------------------------

    def _alive(self, pid: int) -> bool:
        return os.path.exists(os.path.join(self.proc_root, str(pid)))

    def active(self) -> list[Condition]:
        """The active conditions, oldest first (leftover processes that exited are dropped first)."""
        changed = False
        for cond in list(self._active.values()):
            if cond.pids and not any(self._alive(p) for p in cond.pids):
                changed = self._drop(cond.key) or changed
        if changed:
            with contextlib.suppress(Exception):
                self._save()
        return sorted(self._active.values(), key=lambda c: (c.since, c.key))


HARDWARE_KINDS = frozenset(str(k) for k in (*_GPU_KINDS, Kind.GPU_MISSING, Kind.SXID, Kind.PCIE_AER))

__all__ = ["HARDWARE_KINDS", "Condition", "ConditionBook", "boot_id", "reason_of"]
