"""The grace a node gets to come back before its ``offline`` counts as a death.

Why: an agent's status ``offline`` is not a dead node. A ``systemctl restart`` of the agent (an
upgrade, a config change) is gone for seconds; acting at once (``node_death``: save, stop and
requeue every job there, the node excluded) cost a healthy node's jobs their progress (issue #20).
So a node that leaves is *pending*: the coordinator waits, and only a node still gone when its grace
ends becomes a ``node_offline`` event for the rules.

What: :class:`OfflineGrace`, pure bookkeeping on an injected clock (the daemon does the I/O):

- :meth:`OfflineGrace.left`: the node's retained status says it left: ``stopped`` (the agent stopped
  cleanly and said so) waits ``clean_stop_s`` (120 s by default: a restart, an upgrade); ``offline``
  (the broker's Last Will: the agent died, or the node, or its network) waits ``last_will_s``
  (10 s by default: long enough for a crashed agent that systemd restarts, short enough for a real
  death). ``0`` acts at once, as before. A node whose rack broker's bridge to the core went down
  (``why`` :data:`BRIDGE_DOWN`: :mod:`ftd.coordinator.intake.rack_bridges`) waits ``last_will_s``
  too: it is the Last Will its dead rack broker could not fire.
- :meth:`OfflineGrace.alive`: evidence of life cancels the pending offline: the node's ``online``
  status, or any live message from it (events, acks, job presence and the heartbeats it carries;
  not a retained one, which a restarted coordinator reads whether the node lives or not).
- :meth:`OfflineGrace.due`: the nodes whose grace ended, each once.

A coordinator restarted during a grace re-reads the retained status and starts a full grace from
then: it cannot know how long the node has been gone (the Last Will's payload was written when the
agent connected), and acting early on a node that may be back in seconds is the failure this module
exists to prevent; acting at most one grace later than a coordinator that never restarted is the
price. A death already acted on is not acted on twice: the event's id is the node and the status
(``{node}-offline-{ts}``), which the ledger deduplicates, and the actions are idempotent by key.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ftd.config.schema import OfflineGraceConfig

__all__ = ["BRIDGE_DOWN", "LAST_WILL", "STOPPED", "OfflineGrace", "Pending"]

LAST_WILL = "last_will"
STOPPED = "clean_stop"
BRIDGE_DOWN = "bridge_down"


@dataclass(frozen=True)
class Pending:
    """A node that left and is not back yet."""

    node: str
    why: str  # LAST_WILL, STOPPED or BRIDGE_DOWN
    since: float  # when the coordinator saw it leave (its clock)
    deadline: float
    grace_s: float
    status_ts: float  # the status message's own ts (0 for a Last Will)


class OfflineGrace:
    """Nodes whose status said they left, each with the time it may still come back."""

    def __init__(self, cfg: OfflineGraceConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self._clock = clock
        self._pending: dict[str, Pending] = {}

    def left(self, node: str, state: str, status_ts: float = 0.0, *, why: str | None = None) -> Pending:
        """The node's status says it left (``offline`` or ``stopped``; ``why`` names another reason, with
        the Last Will's grace); a node already pending keeps its first deadline (a second status does
        not buy it more time)."""
        current = self._pending.get(node)
        if current is not None:
            return current
        why = why or (STOPPED if state == "stopped" else LAST_WILL)
        grace = self.cfg.clean_stop_s if why == STOPPED else self.cfg.last_will_s
        now = self._clock()
        pending = Pending(node, why, now, now + grace, grace, status_ts)
        self._pending[node] = pending
        return pending

    def alive(self, node: str) -> Pending | None:
        """Evidence the node lives: its pending offline (if any) is cancelled and returned."""
        return self._pending.pop(node, None)

    def pending(self, node: str) -> Pending | None:
        return self._pending.get(node)

    def due(self) -> list[Pending]:
        """The nodes whose grace ended (each returned once, then forgotten)."""
        now = self._clock()
        over = [p for p in self._pending.values() if p.deadline <= now]
        for p in over:
            del self._pending[p.node]
        return over

    def next_deadline(self) -> float | None:
        return min((p.deadline for p in self._pending.values()), default=None)
