"""The coordinator's inventories: what each node runs, kept compact, and its drift.

What: :class:`InventoryBook` keeps each node's last ``Kind.INVENTORY`` report
(:class:`~ftd.platform.inventory.Inventory`) and judges drift (:func:`ftd.platform.drift.find_drift`)
per hardware profile. A report marks its profile dirty; :meth:`InventoryBook.refresh` judges the
dirty profiles again (one pass each, so a burst of 10,000 start-up reports costs one pass, not
10,000) and returns the conditions raised and cleared. Readers (:meth:`report`, the API, the spare
choice, preflight) refresh first, so what they see is never older than the last report.

What drift does is ``coordinator.drift.action``: ``warn`` (shown and logged), ``preflight_fail``
(:meth:`refuses_preflight`: the node's preflight fails, so it does not return to service, and it is
no spare either), or ``no_spare`` (:meth:`blocks_spare`: never chosen as a hot spare). A node not
judged (no profile) is never refused for drift: it is shown as unchecked, with the reason.

Why compact: 10,000 nodes' inventories must stay under 50 MB. The same strings and facts repeat on
every node of a profile (driver, VBIOS, firmware, kernel), so every shared :class:`Fact` and NIC
record is interned: each distinct one is stored once, and a node holds references (a GPU's serial,
its own, is not). The table is rebuilt from the live inventories when it doubles, so values no node
reports any more are forgotten.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from ftd.logs import get_logger
from ftd.platform.drift import DriftReport, NodeFacts, find_drift
from ftd.platform.inventory import COMPARED, Fact, GpuFacts, Inventory, NicFacts, inventory_from_data

__all__ = ["DriftChange", "InventoryBook"]

log = get_logger(__name__)

ACTIONS = ("warn", "preflight_fail", "no_spare")
INTERN_MIN = 100_000  # interned values before the table is first rebuilt from the live inventories
DEFAULT_FIELDS = ("driver", "cuda", "vbios", "nic_firmware", "ofed", "kernel", "os")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class DriftChange:
    """A node's drift condition raised (``report.drift`` not empty) or cleared (empty)."""

    node: str
    report: DriftReport
    raised: bool


class InventoryBook:
    """Each node's inventory and drift (module docstring)."""

    def __init__(self) -> None:
        self.inventories: dict[str, Inventory] = {}
        self.reported_at: dict[str, float] = {}
        self._facts: dict[str, NodeFacts] = {}
        self._members: dict[str, set[str]] = {}  # profile ("" none) -> nodes
        self._dirty: set[str] = set()
        self._reports: dict[str, DriftReport] = {}
        self.since: dict[str, float] = {}  # node -> when its drift condition was raised
        self._interned: dict[Any, Any] = {}
        self.intern_min = INTERN_MIN
        self._intern_limit = INTERN_MIN
        self.rejected = 0  # reports that were not an inventory (bad input)
        # until configured (wiring): no minimums, warn, the default fields
        self.configure(minimums=lambda _profile: None, action="warn", fields=DEFAULT_FIELDS, min_peers=3)

    def configure(
        self,
        *,
        minimums: Callable[[str], Mapping[str, Any] | None],
        action: str,
        fields: Iterable[str],
        min_peers: int,
        enabled: bool = True,
    ) -> None:
        """The coordinator's settings (``coordinator.drift`` and the catalog's ``versions``)."""
        self._minimums = minimums
        self.action = action if action in ACTIONS else "warn"
        self.fields = tuple(fields)
        self.min_peers = min_peers
        self.enabled = enabled
        self._dirty.update(self._members)

    # --- reports -------------------------------------------------------------------------------------

    def _intern(self, value: _T) -> _T:
        got: _T = self._interned.setdefault(value, value)
        return got

    def _compact(self, inv: Inventory) -> Inventory:
        """``inv`` with every value nodes share interned; serials (one node's own) are kept as they are."""
        i = self._intern
        gpus = [GpuFacts(g.index, i(g.name), g.serial, i(g.vbios)) for g in inv.gpus]
        nics = [i(NicFacts(i(n.device), i(n.fw_ver), i(n.board_id))) for n in inv.nics]
        facts = {name: i(inv.fact(name)) for name in ("profile", *COMPARED)}
        return msgspec.structs.replace(inv, **facts, gpus=gpus, nics=nics)

    def note(self, node: str, data: Any, ts: float | None = None) -> bool:
        """A node's ``inventory`` event data; False (and counted) when it is not an inventory."""
        inventory = inventory_from_data(data)
        if inventory is None:
            self.rejected += 1
            log.warning("inventory_rejected", node=node, reason="not an inventory")
            return False
        self.put(node, inventory, ts)
        return True

    def _collect(self) -> None:
        """Forget interned values no node holds any more: the table is rebuilt from the live
        inventories when it has grown past twice its size at the last rebuild (a node that reports
        ever-new values -- GPUs swapped, or a hostile one -- cannot grow it without bound)."""
        self._interned = {}
        for node, inventory in self.inventories.items():
            compact = self.inventories[node] = self._compact(inventory)
            facts = {name: compact.fact(name) for name in COMPARED}
            self._facts[node] = NodeFacts(profile=compact.profile, facts=self._intern_facts(facts))
        self._intern_limit = max(self.intern_min, 2 * len(self._interned))

    def put(self, node: str, inventory: Inventory, ts: float | None = None) -> None:
        if len(self._interned) > self._intern_limit:
            self._collect()
        compact = self._compact(inventory)
        old = self._facts.get(node)
        if old is not None:
            old_profile = old.profile.value if old.profile.known else ""
            self._members.get(old_profile, set()).discard(node)
            self._dirty.add(old_profile)
        self.inventories[node] = compact
        self.reported_at[node] = ts if ts is not None else time.time()
        facts = {name: compact.fact(name) for name in COMPARED}
        self._facts[node] = NodeFacts(profile=compact.profile, facts=self._intern_facts(facts))
        profile = compact.profile.value if compact.profile.known else ""
        self._members.setdefault(profile, set()).add(node)
        self._dirty.add(profile)

    def _intern_facts(self, facts: dict[str, Fact]) -> dict[str, Fact]:
        """One dict per distinct set of facts (16 identical nodes share one)."""
        key = tuple(facts.values())
        shared: dict[str, Fact] = self._interned.setdefault(("facts", key), facts)
        return shared

    def forget(self, node: str) -> None:
        old = self._facts.pop(node, None)
        if old is None:
            return
        profile = old.profile.value if old.profile.known else ""
        self._members.get(profile, set()).discard(node)
        self._dirty.add(profile)
        self.inventories.pop(node, None)
        self.reported_at.pop(node, None)

    # --- drift ---------------------------------------------------------------------------------------

    @property
    def dirty(self) -> bool:
        return bool(self._dirty)

    def refresh(self) -> list[DriftChange]:
        """Judge the dirty profiles again; the conditions raised and cleared (and changed)."""
        if not self._dirty:
            return []
        dirty, self._dirty = self._dirty, set()
        nodes = {n: self._facts[n] for p in dirty for n in self._members.get(p, ()) if n in self._facts}
        if self.enabled:
            found = find_drift(nodes, self._minimums, fields=self.fields, min_peers=self.min_peers)
        else:
            found = {n: DriftReport(unchecked="drift is disabled (coordinator.drift.enabled)") for n in nodes}
        changes: list[DriftChange] = []
        gone = [n for n in self._reports if n not in self._facts]
        for node in gone:
            if self._reports.pop(node).drift:
                changes.append(DriftChange(node, DriftReport(), raised=False))
            self.since.pop(node, None)
        now = time.time()
        for node, report in found.items():
            previous = self._reports.get(node)
            self._reports[node] = report
            before = previous.drift if previous is not None else ()
            if report.drift and report.drift != before:
                self.since.setdefault(node, now)
                changes.append(DriftChange(node, report, raised=True))
            elif not report.drift and before:
                self.since.pop(node, None)
                changes.append(DriftChange(node, report, raised=False))
        return changes

    def report(self, node: str) -> DriftReport | None:
        """The node's drift (``None``: it never reported an inventory)."""
        if self._dirty:
            self.refresh()
        return self._reports.get(node)

    def drifted(self) -> dict[str, DriftReport]:
        """Every node with drift now."""
        if self._dirty:
            self.refresh()
        return {n: r for n, r in self._reports.items() if r.drift}

    def unchecked(self) -> int:
        """How many reporting nodes could not be judged (no hardware profile, drift disabled)."""
        if self._dirty:
            self.refresh()
        return sum(1 for r in self._reports.values() if r.unchecked)

    def _refusal(self, node: str, *actions: str) -> str | None:
        if self.action not in actions:
            return None
        report = self.report(node)
        if report is None or not report.drift:
            return None
        return f"version drift ({report.summary()})"

    def refuses_preflight(self, node: str) -> str | None:
        """Why ``node`` fails preflight for drift (``coordinator.drift.action = preflight_fail``)."""
        return self._refusal(node, "preflight_fail")

    def blocks_spare(self, node: str) -> str | None:
        """Why ``node`` may not be chosen as a spare (``coordinator.drift.action = no_spare``, or
        ``preflight_fail``: a node failing preflight is no spare either, whatever its agent's own
        preflight said)."""
        return self._refusal(node, "no_spare", "preflight_fail")

    def view(self, node: str) -> dict[str, Any] | None:
        """The node's inventory and drift as plain data (the API, ``ftd status --node``)."""
        inventory = self.inventories.get(node)
        if inventory is None:
            return None
        report = self.report(node)
        if report is None:
            report = DriftReport()
        return {
            "reported_at": self.reported_at.get(node),
            "facts": {name: fact.text() for name, fact in inventory.facts().items()},
            "unknown": {
                name: fact.unknown or "not reported"
                for name, fact in inventory.facts().items()
                if not fact.known
            },
            "gpus": [
                {"index": g.index, "name": g.name.text(), "serial": g.serial.text(), "vbios": g.vbios.text()}
                for g in inventory.gpus
            ],
            "nics": [
                {"device": n.device, "fw_ver": n.fw_ver.text(), "board_id": n.board_id.text()}
                for n in inventory.nics
            ],
            "drift": {
                "action": self.action,
                "fields": list(report.fields),
                "reasons": [d.text() for d in report.drift],
                "since": self.since.get(node),
                "unchecked": report.unchecked,
                "unknown": list(report.unknown),
            },
        }
