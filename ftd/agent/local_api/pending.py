"""Pending directives: what the local API keeps so a rank that registers later still gets it.

What: :class:`PendingDirectives`, the book of directives delivered to this node. A directive is
pushed to every connected rank of its job (all jobs when ``job`` is None) and kept *pending*: a rank
that registers later (a reconnect after an agent or client restart) receives it too, unless that
rank already answered it. It is dropped when its deadline passes (``deadline_s`` counted from when
*this agent* received it: node and coordinator clocks may disagree), after ``pending_ttl_s`` when it
has no deadline, or once every rank it reached has answered it (so a job requeued later onto this
node does not receive a stale ``stop``). A directive id seen before is never delivered again, and
the job of each id seen is remembered (bounded) so an ack can be checked against it.

Directives belong to one run of a job (issue #20): a job restarted in place (a Slurm requeue, a
recreated pod) keeps its id, and a save or stop meant for the run before must never reach the next.
Each pending directive is bound to the runs it was meant for (:attr:`Pending.runs`): the run the
coordinator named (``params["run"]``), else the runs of the job's ranks connected when it arrived
(their clients name their run at registration), else none known. It is never owed to a rank of
another run, and it is dropped (:meth:`PendingDirectives.drop`) when the job's ranks it reached have
all left (they received it; whoever registers next is a new process), when a rank of another run of
the job registers (the job started again), and when the scheduler's Prolog says the job starts
again on this node.

Why apart: the expiry and answered-by-all rules are their own small state machine; the server only
sends the lines and reports who was reached and who answered.

How the server delivers them
----------------------------
:meth:`LocalApi.deliver` pushes a directive to every connected rank of its job (all jobs when
``job`` is None) and keeps it pending for ranks that register later; when a pending directive is
dropped, and why a directive id is never delivered twice, is :mod:`ftd.agent.local_api.pending`.
A directive belongs to one run of its job: it is bound to the run the coordinator named, else to the
runs of the job's ranks connected when it arrived, and never sent to a rank of another run; it is
dropped when a rank of a new run registers and when the Prolog reports the job starting again, and a
stop also when the job's ranks it reached have all left (:meth:`LocalApi.job_started`). Each drop is logged
(``local_api_pending_dropped``, with the reason).
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
    runs: frozenset[str] | None = None  # the runs of its job it is for (None: not known)
    reached: set[RankKey] = field(default_factory=set)
    answered: set[RankKey] = field(default_factory=set)

    def for_job(self, job: str) -> bool:
        return self.directive.job is None or self.directive.job == job

    def for_run(self, run: str | None) -> bool:
        """True unless both the directive's runs and ``run`` are known and ``run`` is not one of
        them (an older client that names no run gets what it always got)."""
        return self.runs is None or run is None or run in self.runs


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

    def add(
        self, directive: Directive, line: bytes, now: float, runs: frozenset[str] | None = None
    ) -> Pending:
        """Keep a new directive (sent as ``line``, meant for ``runs`` of its job: None, not known);
        the oldest is dropped past :data:`MAX_PENDING`."""
        self._seen[directive.id] = directive.job
        while len(self._seen) > MAX_SEEN_IDS:
            self._seen.popitem(last=False)
        self.prune(now)
        ttl = directive.deadline_s if directive.deadline_s is not None else self.ttl_s
        pending = Pending(directive=directive, line=line, expires=now + ttl, runs=runs)
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

    def owed_to(self, job: str, rank: int, now: float, run: str | None = None) -> list[Pending]:
        """What a rank (of ``run``) that just registered must receive: pending for its job and its
        run, not answered by it."""
        self.prune(now)
        key = (job, rank)
        return [
            p for p in self._pending.values() if p.for_job(job) and p.for_run(run) and key not in p.answered
        ]

    def drop(
        self,
        job: str,
        *,
        reached_only: bool = False,
        other_than_run: str | None = None,
        actions: frozenset[str] | None = None,
    ) -> list[Directive]:
        """Forget the pending directives of ``job`` (those addressed to every job stay): all of them,
        or only those that reached a rank (``reached_only``: the ranks they reached have left), or only
        those bound to runs other than ``other_than_run`` (a rank of that run registered); only those
        of ``actions`` when given. Returns what was dropped."""
        dropped = []
        for did, p in list(self._pending.items()):
            if p.directive.job != job:
                continue
            if actions is not None and p.directive.action not in actions:
                continue
            if reached_only and not p.reached:
                continue
            if other_than_run is not None and (p.runs is None or other_than_run in p.runs):
                continue
            del self._pending[did]
            dropped.append(p.directive)
        return dropped

    def answered(self, directive_id: str, job: str, rank: int) -> None:
        """A rank answered: forget the directive once every rank it reached has answered."""
        pending = self._pending.get(directive_id)
        if pending is None:
            return
        pending.answered.add((job, rank))
        if pending.reached and pending.reached <= pending.answered:
            del self._pending[directive_id]
