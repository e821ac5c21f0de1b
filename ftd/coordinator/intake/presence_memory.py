"""Which job runs where, remembered in the ledger, so a coordinator that starts -- a restart, or a
new HA leader -- decides knowing it before the broker has re-sent the retained job presence.

Why: the coordinator's MQTT session is persistent. Events published while it was down wait at the
broker and arrive the moment it reconnects; the retained presence comes only after it subscribes
again, behind them (and Mosquitto lets just 20 unacknowledged messages be in flight, so they cannot
be held back until it arrives). Decided in that order, an Xid 79 queued for a restarting coordinator
found no job on its node: the node was drained and its job neither saved nor requeued
(``tests/contract/test_coordinator_restart_order.py``, on a real Mosquitto).

What is kept: a job's *membership* on a node -- its ranks (rank, local rank, pid), the Prolog's
allocation and its rank supervisor (``ftd run``: role, slot, generation, state; a hot spare has only
that, and a restart right after start-up must know the job's spares) -- never the step or heartbeat
time, which are stale by the time they are read back and which the retained presence refreshes
within a second. It is written only when the membership
changes (a job starts, a rank joins or leaves, a job ends), not on every heartbeat. At start,
:meth:`PresenceMemory.load` puts it into the cluster state; once the scheduler has said which jobs
run (the placement warm-up, or one lookup per remembered job for a scheduler without the bulk
call), :meth:`PresenceMemory.forget_stopped` drops what it no longer runs (a job that ended while
the coordinator was down, a node it left). A scheduler that cannot answer then leaves it as it is:
the placement check still stands between it and any claim, and the broker's queued and retained
presence corrects it as it arrives.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from ftd.coordinator.ledger.store import LedgerStore
from ftd.coordinator.model.state import ClusterState
from ftd.events import JobAllocation, JobPresence, RankInfo, SupervisorInfo
from ftd.logs import get_logger

log = get_logger(__name__)

Membership = tuple[tuple[RankInfo, ...], JobAllocation | None, SupervisorInfo | None]


def membership(presence: JobPresence) -> JobPresence:
    """``presence`` without what goes stale (steps, heartbeat times): what the ledger keeps."""
    ranks = [RankInfo(rank=r.rank, local_rank=r.local_rank, pid=r.pid) for r in presence.ranks]
    supervisor = presence.supervisor
    if supervisor is not None:
        supervisor = msgspec.structs.replace(supervisor, ts=0.0)
    return msgspec.structs.replace(presence, ranks=ranks, supervisor=supervisor)


def _key(presence: JobPresence) -> Membership:
    """What a write is worth making for: the membership's ranks, the allocation, the supervisor."""
    kept = membership(presence)
    return tuple(kept.ranks), presence.allocation, kept.supervisor


class PresenceMemory:
    """The ledger's copy of the job presence the coordinator accepted (module docstring)."""

    def __init__(self, ledger: LedgerStore, state: ClusterState) -> None:
        self.ledger = ledger
        self.state = state
        self._kept: dict[tuple[str, str], Membership] = {}  # (node, job) -> what the ledger has
        self.writes = 0

    async def load(self) -> int:
        """Put the remembered presence into the cluster state; returns how many (node, job) pairs."""
        remembered = await self.ledger.presences()
        for presence in remembered:
            self.state.apply_presence(presence.node, presence.job, presence)
            self._kept[(presence.node, presence.job)] = _key(presence)
        if remembered:
            log.info("presence_remembered", pairs=len(remembered), jobs=len({p.job for p in remembered}))
        return len(remembered)

    async def observe(self, node: str, job: str, presence: JobPresence | None) -> None:
        """Keep the ledger in step with presence the coordinator just applied (None or no ranks, no
        allocation and no supervisor: the job left the node)."""
        here = (node, job)
        left = presence is None or (
            not presence.ranks and presence.allocation is None and presence.supervisor is None
        )
        if presence is None or left:
            if self._kept.pop(here, None) is not None:
                await self.ledger.drop_presence(node, job)
                self.writes += 1
            return
        key = _key(presence)
        if self._kept.get(here) == key:
            return  # a heartbeat: same ranks, newer steps
        await self.ledger.save_presence(membership(presence))
        self._kept[here] = key
        self.writes += 1

    def jobs(self) -> set[str]:
        """The jobs remembered on some node."""
        return {job for _, job in self._kept}

    async def forget_stopped(self, nodes_of: Callable[[str], frozenset[str] | None]) -> int:
        """Drop the remembered pairs whose job the scheduler no longer runs on that node (``nodes_of``:
        the nodes it runs a job on, None when it runs it nowhere); returns how many."""
        stale = [(node, job) for node, job in self._kept if node not in (nodes_of(job) or ())]
        for node, job in stale:
            self.state.apply_presence(node, job, None)
            del self._kept[(node, job)]
            await self.ledger.drop_presence(node, job)
        if stale:
            log.info("presence_forgotten", pairs=len(stale), why="the scheduler no longer runs them there")
        return len(stale)
