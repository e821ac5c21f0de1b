"""Pending directives: what the local API keeps so a rank that registers later still gets it.

What: :class:`PendingDirectives`, the book of directives delivered to this node. A directive is
pushed to every connected rank of its job (all jobs when ``job`` is None) and kept *pending*: a rank
that registers later (a reconnect after an agent or client restart) receives it too, unless that
rank already answered it. It is dropped when its deadline passes (``deadline_s`` counted from when
*this agent* received it: node and coordinator clocks may disagree), after ``pending_ttl_s`` when it
has no deadline, or once every rank it reached has answered it (so a job requeued later onto this
node does not receive a stale ``stop``). A directive id seen before is never delivered again, and
the job of each id seen is remembered (bounded) so an ack can be checked against it.

Why apart: the expiry and answered-by-all rules are their own small state machine; the server only
sends the lines and reports who was reached and who answered.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from ftd.events import Directive
from ftd.logs import get_logger

log = get_logger(__name__)

__all__ = ["MAX_PENDING", "MAX_SEEN_IDS", "Pending", "PendingDirectives"]

MAX_PENDING = 256
MAX_SEEN_IDS = 8192

RankKey = tuple[str, int]
"""(job, rank)."""


@dataclass(eq=False)
class Pending:
    """A directive kept for ranks that register later, until it expires or all it reached answered."""

    directive: Directive
    line: bytes
    expires: float  # monotonic
    reached: set[RankKey] = field(default_factory=set)
    answered: set[RankKey] = field(default_factory=set)

    def for_job(self, job: str) -> bool:
        return self.directive.job is None or self.directive.job == job


class PendingDirectives:
    """Directives still pending on this node, and the ids (with their job) seen so far."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._pending: OrderedDict[str, Pending] = OrderedDict()
        self._seen: OrderedDict[str, str | None] = OrderedDict()  # directive id -> its job

    def seen(self, directive_id: str) -> bool:
        return directive_id in self._seen

    def job_of(self, directive_id: str, default: str | None) -> str | None:
        """The job a directive seen here was for (``default`` for an id not seen, or forgotten)."""
        return self._seen.get(directive_id, default)

    def add(self, directive: Directive, line: bytes, now: float) -> Pending:
        """Keep a new directive (sent as ``line``); the oldest is dropped past :data:`MAX_PENDING`."""
        self._seen[directive.id] = directive.job
        while len(self._seen) > MAX_SEEN_IDS:
            self._seen.popitem(last=False)
        self.prune(now)
        ttl = directive.deadline_s if directive.deadline_s is not None else self.ttl_s
        pending = Pending(directive=directive, line=line, expires=now + ttl)
        self._pending[directive.id] = pending
        while len(self._pending) > MAX_PENDING:
            dropped_id, _ = self._pending.popitem(last=False)
            log.warning("local_api_pending_overflow", dropped=dropped_id)
        return pending

    def prune(self, now: float) -> None:
        """Drop the directives whose time is up."""
        for did in [d for d, p in self._pending.items() if p.expires <= now]:
            del self._pending[did]

    def directives(self, now: float) -> list[Directive]:
        self.prune(now)
        return [p.directive for p in self._pending.values()]

    def owed_to(self, job: str, rank: int, now: float) -> list[Pending]:
        """What a rank that just registered must receive: pending for its job, not answered by it."""
        self.prune(now)
        key = (job, rank)
        return [p for p in self._pending.values() if p.for_job(job) and key not in p.answered]

    def answered(self, directive_id: str, job: str, rank: int) -> None:
        """A rank answered: forget the directive once every rank it reached has answered."""
        pending = self._pending.get(directive_id)
        if pending is None:
            return
        pending.answered.add((job, rank))
        if pending.reached and pending.reached <= pending.answered:
            del self._pending[directive_id]
