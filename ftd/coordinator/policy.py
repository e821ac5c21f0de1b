"""The policy gate: the last word before any action runs.

Checks, in order, each recorded with its reason when it says no:

1. **dedupe** — an action with the same key (kind + target) is pending or running;
2. **cooldown** — the same key finished less than ``cooldown_s`` ago (a flapping GPU must not be
   drained, resumed and drained again every minute);
3. **dry-run** — globally, or for the proposing rule: the action is recorded as ``dry_run``.

The gate is a pure object over its own memory plus a clock; the engine restores that memory from
the ledger at start-up so a restart does not reset cooldowns.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ftd.coordinator.model import ActionRecord, ActionRequest, ActionState


@dataclass(frozen=True)
class Verdict:
    state: ActionState  # PENDING (go), SUPPRESSED or DRY_RUN
    reason: str = ""

    @property
    def allowed(self) -> bool:
        return self.state == ActionState.PENDING


class PolicyGate:
    def __init__(
        self,
        *,
        cooldown_s: float = 600.0,
        dry_run: bool = False,
        dry_run_rules: Iterable[str] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cooldown_s = cooldown_s
        self.dry_run = dry_run
        self.dry_run_rules = frozenset(dry_run_rules)
        self._clock = clock
        self._active: dict[str, str] = {}  # key -> action id
        self._finished_at: dict[str, float] = {}  # key -> when the last one finished

    def restore(self, records: Iterable[ActionRecord]) -> None:
        for record in records:
            key = record.request.key
            if record.state in (ActionState.PENDING, ActionState.RUNNING):
                self._active[key] = record.id
            elif record.state in (ActionState.SUCCEEDED, ActionState.ESCALATED, ActionState.FAILED):
                self._finished_at[key] = max(self._finished_at.get(key, 0.0), record.updated)

    def decide(self, request: ActionRequest) -> Verdict:
        key = request.key
        if key in self._active:
            return Verdict(
                ActionState.SUPPRESSED, f"duplicate: {key} already in progress ({self._active[key]})"
            )
        finished = self._finished_at.get(key)
        if finished is not None:
            remaining = self.cooldown_s - (self._clock() - finished)
            if remaining > 0:
                return Verdict(
                    ActionState.SUPPRESSED, f"cooldown: {key} finished {self.cooldown_s - remaining:.0f}s ago"
                )
        if self.dry_run:
            return Verdict(ActionState.DRY_RUN, "dry-run: coordinator in dry-run mode")
        if request.rule in self.dry_run_rules:
            return Verdict(ActionState.DRY_RUN, f"dry-run: rule {request.rule} is in shadow mode")
        return Verdict(ActionState.PENDING)

    def started(self, record: ActionRecord) -> None:
        self._active[record.request.key] = record.id

    def finished(self, record: ActionRecord) -> None:
        key = record.request.key
        if self._active.get(key) == record.id:
            del self._active[key]
        self._finished_at[key] = self._clock()
