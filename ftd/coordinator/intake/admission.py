"""Admission: the one way a node's events come in, whether a message holds one event or a batch.

Every event message goes through the same steps, in this order, and nothing here acts on the world:

1. **size** -- a payload over :data:`~ftd.events.MAX_PAYLOAD_BYTES` (a batch: :data:`MAX_BATCH_BYTES`)
   is refused unread (:meth:`Admission.check_size`);
2. **decode** -- strictly; a batch over :data:`WHOLE_BATCH_BYTES` is decoded in chunks of
   :data:`BATCH_CHUNK` events, yielding to the event loop between them, and checked as a whole before
   any of it is admitted (one bad event refuses the whole batch, so a batch is never half-applied);
3. **identity** -- an event naming another node than its topic's is refused (the broker's ACL vouches
   for the topic, not the payload);
4. **placement** -- a heartbeat event (rank lost, straggler) naming a job the scheduler does not run on
   its node is a placement violation: rejected, never evaluated; a job whose placement is not known
   yet raises :class:`~ftd.coordinator.intake.placement.NeedPlacement` before any side effect;
5. **fairness** -- the node's token bucket admits the event or folds it into the node's ``bad_input``
   summary (:mod:`ftd.coordinator.intake.fairness`) -- unless it is critical or the first of its
   signature in the window: novelty is never folded (:mod:`ftd.coordinator.intake.novelty`).

:meth:`Admission.admit` returns a :class:`Verdict`: the events the engine must decide and the ids to
receipt as rejected; the daemon acts on it (the engine, then the receipts). Refusals raise
:class:`Refused`, which the daemon hands to :meth:`Admission.refuse`: counted in ``bad_messages`` and
in the node's summary, never fatal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from ftd.bus.base import Message
from ftd.coordinator.intake.fairness import InputBook, RateLimiter, readable_ids
from ftd.coordinator.intake.novelty import Novelty
from ftd.coordinator.intake.placement import Placement
from ftd.events import MAX_PAYLOAD_BYTES, DecodeError, Event, Kind, decode
from ftd.logs import get_logger

log = get_logger(__name__)

#: Kinds only the coordinator itself writes (a hang's verdict: the rules exclude nodes on it).
COORDINATOR_KINDS = frozenset({Kind.HANG_VERDICT})
MAX_BATCH_BYTES = 4 << 20  # a batched event message larger than this is rejected unread
BATCH_CHUNK = 256  # events of a batch checked or handled between two yields to the event loop
#: A batch up to this size is decoded in one call (well under a millisecond); a larger one in chunks
#: of BATCH_CHUNK events with the loop getting a turn between them.
WHOLE_BATCH_BYTES = 64 << 10

#: Heartbeat events that name a job: they count only from a node the scheduler runs the job on.
HEARTBEAT_KINDS = frozenset({Kind.RANK_HEARTBEAT_LOST, Kind.RANK_STRAGGLER})


class Refused(Exception):
    """A message the coordinator will not take: ``reason`` (a summary key), ``error`` (for the log and
    the rejected receipts) and the ids of the events in it, when they could be read."""

    def __init__(self, reason: str, error: str, ids: list[str] | None = None) -> None:
        super().__init__(error)
        self.reason, self.error, self.ids = reason, error, ids or []


@dataclass
class Verdict:
    """What admission made of one event message: the ``events`` to decide (in order) and the events
    ``rejected`` as placement violations (id -> why), to be receipted as such."""

    node: str
    events: list[Event] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)


class Admission:
    """Size, decode, identity, placement and fairness for event messages; the refusal book for all."""

    def __init__(
        self,
        *,
        placement: Placement,
        limiter: RateLimiter,
        inputs: InputBook,
        novelty: Novelty | None = None,
    ) -> None:
        self.placement = placement
        self.limiter = limiter
        self.inputs = inputs
        self.novelty = novelty if novelty is not None else Novelty(window_s=inputs.window_s)
        self.bad_messages = 0

    # --- steps ---------------------------------------------------------------------------------

    @staticmethod
    def check_size(message: Message, *, events: bool, batch: bool) -> None:
        """Refuse a payload over its limit unread (the ids of its events, when they can be read)."""
        limit = MAX_BATCH_BYTES if batch else MAX_PAYLOAD_BYTES
        if len(message.payload) > limit:
            ids = readable_ids(message.payload, batch=batch) if events else []
            why = f"payload of {len(message.payload)} bytes is over the limit of {limit}"
            raise Refused("oversized", why, ids)

    async def admit(self, node: str, message: Message, *, batch: bool) -> Verdict:
        """The events of ``message`` (one, or a batch) that the engine must decide."""
        events = await self._decode_batch(node, message) if batch else [self._decode_one(node, message)]
        verdict = Verdict(node)
        forged = self._foreign_job_claims(events, verdict.rejected)
        for event in events:  # the coordinator's own kinds: a node cannot speak for it
            if event.kind in COORDINATOR_KINDS:
                forged.add(event.id)
                verdict.rejected[event.id] = f"coordinator_only: {event.kind} comes from the coordinator"
        verdict.events = self.triage([e for e in events if e.id not in forged] if forged else events)
        return verdict

    def triage(self, events: Sequence[Event]) -> list[Event]:
        """Fairness: the events to decide, in order; the others are folded into their node's summary.
        Within its rate a node's events are all decided; over it, only the critical ones and the
        first of each signature in the window (:mod:`ftd.coordinator.intake.novelty`)."""
        decide: list[Event] = []
        for event in events:
            if self.limiter.admit(event.node, event.severity) or self.novelty.must_evaluate(event):
                decide.append(event)
            else:
                self._fold(event)
        return decide

    @staticmethod
    def _decode_one(node: str, message: Message) -> Event:
        try:
            event = decode(message.payload, Event)
        except DecodeError as exc:
            raise Refused("invalid", str(exc), readable_ids(message.payload, batch=False)) from None
        if event.node != node:
            why = f"event for node {event.node!r} published under node {node!r}"
            raise Refused("foreign_node", why, [event.id])
        return event

    @staticmethod
    async def _decode_batch(node: str, message: Message) -> list[Event]:
        """``ftd/v1/nodes/{node}/events/batch``: a JSON list of Events, all of that node."""
        try:
            if len(message.payload) <= WHOLE_BATCH_BYTES:  # an agent's usual flush: one decoder call
                events = decode(message.payload, list[Event], max_bytes=WHOLE_BATCH_BYTES)
                for event in events:
                    if event.node != node:
                        why = f"event for node {event.node!r} in a batch under node {node!r}"
                        raise Refused("foreign_node", why, readable_ids(message.payload, batch=True))
                return events
            raws = decode(message.payload, list[msgspec.Raw], max_bytes=MAX_BATCH_BYTES)
            events = []
            for start in range(0, len(raws), BATCH_CHUNK):
                for raw in raws[start : start + BATCH_CHUNK]:
                    event = decode(bytes(raw), Event)
                    if event.node != node:
                        why = f"event for node {event.node!r} in a batch under node {node!r}"
                        raise Refused("foreign_node", why, readable_ids(message.payload, batch=True))
                    events.append(event)
                await asyncio.sleep(0)
        except DecodeError as exc:
            ids = readable_ids(message.payload, batch=True)
            raise Refused("invalid", f"{exc} (in a batch)", ids) from None
        return events

    def _foreign_job_claims(self, events: Sequence[Event], rejected: dict[str, str]) -> set[str]:
        """Ids of heartbeat events naming a job the scheduler does not run on their node (each a
        placement violation, added to ``rejected``). Raises NeedPlacement for jobs not known yet."""
        claims = [
            (e, str(e.data["job"]))
            for e in events
            if e.kind in HEARTBEAT_KINDS and isinstance(e.data.get("job"), str | int) and str(e.data["job"])
        ]
        if not claims:
            return set()
        node = claims[0][0].node
        denied = set(self.placement.check(node, [job for _, job in claims]))
        forged: set[str] = set()
        for event, job in claims:
            if job in denied:
                forged.add(event.id)
                self.placement.violation(node, job, str(event.kind), f"rank {event.data.get('rank')}")
                rejected[event.id] = f"placement_violation: job {job[:64]} does not run on {node}"
        return forged

    def _fold(self, event: Event) -> None:
        if self.inputs.fold(event):
            log.warning(
                "node_rate_limited",
                node=event.node,
                rate=self.limiter.rate,
                burst=self.limiter.burst,
                summary="events over the rate are folded into a bad_input event",
            )

    # --- refusals ------------------------------------------------------------------------------

    def refuse(
        self, message: Message, node: str | None, reason: str, error: str, ids: list[str] | None = None
    ) -> None:
        """Count a refused message; into its node's summary (and rejected receipts) when it has one."""
        self.bad_messages += 1
        if self.bad_messages <= 20 or self.bad_messages % 1000 == 0:
            log.warning(
                "bad_bus_message_ignored",
                topic=message.topic[:200],
                reason=reason,
                error=error[:300],
                bytes=len(message.payload),
                total=self.bad_messages,
            )
        if node is not None and self.inputs.reject(node, reason, error, len(message.payload), ids):
            log.warning("bad_input_from_node", node=node, reason=reason, summary="bad_input event")
