"""Inventory intake: drift judged once a burst of ``inventory`` reports has settled, and said.

What: :class:`InventoryIntake` is an engine observer of events (the engine has already folded each
``inventory`` event into :class:`~ftd.coordinator.model.inventory.InventoryBook` through
``ClusterState.apply_event``, as it does when replaying the ledger at start-up). After the first
report of a burst it waits ``coordinator.drift.settle_s``, then judges drift for the profiles
reported since (:meth:`ClusterState.refresh_drift`) and logs each condition raised
(``drift_condition``, warning, naming the fields and why) and cleared (``drift_cleared``).

Why a settle: 10,000 agents starting together send 10,000 reports within seconds; one pass after
them costs well under a second, one pass per report would cost minutes. Readers never wait for it:
the book refreshes before it answers.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ftd.coordinator.model.inventory import DriftChange
from ftd.coordinator.model.state import ClusterState
from ftd.events import Event, Kind
from ftd.logs import get_logger

__all__ = ["InventoryIntake"]

log = get_logger(__name__)


class InventoryIntake:
    """Judges drift after each settled burst of inventory reports (module docstring)."""

    def __init__(self, state: ClusterState, *, settle_s: float = 1.0) -> None:
        self.state = state
        self.settle_s = settle_s
        self._pending: asyncio.TimerHandle | None = None
        self.passes = 0

    def observe(self, what: str, payload: Any) -> None:
        if what != "event" or not isinstance(payload, Event) or payload.kind != Kind.INVENTORY:
            return
        if self._pending is None:
            self._pending = asyncio.get_running_loop().call_later(self.settle_s, self.judge)

    def judge(self) -> list[DriftChange]:
        """One pass now (also what the timer runs); the changes, each logged."""
        self._pending = None
        changes = self.state.refresh_drift()
        self.passes += 1
        for change in changes:
            if change.raised:
                log.warning(
                    "drift_condition",
                    node=change.node,
                    fields=list(change.report.fields),
                    why=change.report.summary(),
                    action=self.state.inventory.action,
                )
            else:
                log.info("drift_cleared", node=change.node)
        return changes

    def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
