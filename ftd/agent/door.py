"""The one door: every event this agent publishes leaves through :meth:`Door.send`, which enriches it.

Where it stands: it is storm control's downstream (:class:`~ftd.agent.storm.StormControl` hands it
what it lets through), so it sees every event whatever produced it: the watchers' events that
the agent's ``emit`` offers (:mod:`ftd.agent.wiring`), the kernel-log watcher's, which it offers to
storm control itself (its fast path), storm control's summaries of repeats and the events it
re-publishes from its checkpoint after a restart, the local API's (a rank supervisor lost or
failed), ``ftd inject``'s drills, leftover processes after a job, and the agent's own health.

Why one door (issue #31): the enrichment used to live in ``Agent.emit``, which the kernel-log watcher
does not call, so a segfault in ``libnccl`` inside a training rank never carried its job and the
coordinator's ``host`` rule could not take the application-fault path from a real agent.

What it adds (:func:`enriched`, nothing it would overwrite):

* to a ``segfault`` (:data:`RANK_KINDS`): the ``job`` and ``rank`` of the trainer rank whose process
  the event names (``data.pid``), a rank registered now or one whose connection closed a short while
  ago (:meth:`LocalApi.owner_of <ftd.agent.local_api.LocalApi.owner_of>`). Other kinds that name a pid
  (an Xid's ``pid=``, an OOM kill's victim) are left as they are: the ``xid_catalog`` rule would then
  restart only the named job instead of every job on the node, a rule's decision not made here;
* to a filesystem's event (:data:`~ftd.agent.save_path.FS_KINDS`): its mount, the filesystem type,
  whether it is shared and the jobs whose ranks save there (:func:`ftd.agent.save_path.relate`).

Then it counts the event by kind (the metrics), lets the node's conditions see it
(:class:`~ftd.agent.conditions.ConditionBook`; ``conditions_changed`` is called when they changed),
queues it in the outbox (spooled before it is sent, kept until the coordinator's receipt) and logs it.
When the conditions changed, their summary goes out too (:meth:`Door.publish_conditions`, retained).
Enriching at the door and not before storm control also means a storm of repeats costs nothing here:
only the events storm control lets through are looked at.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import msgspec

from ftd.agent.conditions import ConditionBook
from ftd.agent.save_path import FS_KINDS, Mount, relate
from ftd.agent.spool import Outbox, Outgoing
from ftd.bus import topics
from ftd.events import Event, Kind, NodeConditions, RankInfo, encode
from ftd.logs import get_logger

__all__ = ["RANK_KINDS", "Door", "enriched"]

log = get_logger(__name__)

#: The kinds whose ``data.pid`` is looked up among the trainer ranks (see the module docstring).
RANK_KINDS = frozenset({Kind.SEGFAULT})

OwnerOf = Callable[[int], tuple[str, int] | None]
"""(job, rank) of the trainer rank whose process a pid is, or None."""
Ranks = Callable[[], Mapping[str, list[RankInfo]]]
"""The registered ranks by job."""
Mounts = Callable[[], list[Mount]]
"""The node's mounts (read again at most once a second: :func:`ftd.agent.save_path.current_mounts`)."""


def enriched(event: Event, *, owner_of: OwnerOf, ranks: Ranks, mounts: Mounts) -> Event:
    """``event`` with what this node knows about it added (see the module docstring); the same object
    when nothing applies. The sources are asked only for the kinds that need them."""
    if event.kind in FS_KINDS:
        return relate(event, ranks(), mounts())
    if event.kind in RANK_KINDS:
        pid = event.data.get("pid")
        if "job" in event.data or not isinstance(pid, int) or isinstance(pid, bool):
            return event
        owner = owner_of(pid)
        if owner is None:
            return event
        job, rank = owner
        return msgspec.structs.replace(event, data={**event.data, "job": job, "rank": rank})
    return event


class Door:
    """The agent's one way out for events: :meth:`send` (storm control's downstream)."""

    def __init__(
        self,
        node: str,
        outbox: Outbox,
        conditions: ConditionBook,
        *,
        owner_of: OwnerOf,
        ranks: Ranks,
        mounts: Mounts,
        conditions_changed: Callable[[], None],
    ) -> None:
        self.node = node
        self._outbox = outbox
        self._conditions = conditions
        self._owner_of = owner_of
        self._ranks = ranks
        self._mounts = mounts
        self._conditions_changed = conditions_changed
        self.events_by_kind: dict[str, int] = {}  # published, after storm control (the metrics)
        self._conditions_published: list[str] | None = None

    async def send(self, event: Event) -> None:
        """Enrich ``event``, let the node's conditions see it and queue it for the bus."""
        event = enriched(event, owner_of=self._owner_of, ranks=self._ranks, mounts=self._mounts)
        self.events_by_kind[event.kind] = self.events_by_kind.get(event.kind, 0) + 1
        if self._conditions.observe(event):
            self.publish_conditions()
            self._conditions_changed()
        self._outbox.put(
            Outgoing(
                topics.node_event(self.node, event.kind),
                encode(event),
                priority=event.severity.rank,
                receipt_id=event.id,  # leaves the spool on the coordinator's receipt, not on PUBACK
            )
        )
        log.info(
            "event",
            kind=str(event.kind),
            severity=str(event.severity),
            id=event.id,
            code=event.data.get("code"),
            pci=event.data.get("pci"),
            count=event.count,
            caused_by=event.data.get("caused_by"),
            job=event.data.get("job"),
        )

    def publish_conditions(self) -> None:
        """Publish the node's active critical conditions (retained ``conditions/ftd``) when they
        changed since the last time: the coordinator shows them (API, ``ftd status``)."""
        active = self._conditions.active()[:64]
        reasons = [c.reason for c in active]
        if reasons == self._conditions_published:
            return
        self._conditions_published = reasons
        summary = NodeConditions(
            node=self.node, ts=time.time(), conditions=reasons, kinds=[c.kind for c in active]
        )
        topic = topics.node_condition(self.node, topics.FTD_CONDITIONS)
        self._outbox.put(Outgoing(topic, encode(summary), retain=True, priority=3, durable=False))
