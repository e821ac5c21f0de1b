"""Authority follows placement: a node speaks for a job's ranks only if the scheduler runs the job there.

The broker's ACL vouches for *which node* published a message (its topic), never for what the node
says about a job. Without this check any node's valid credentials could claim a job running
elsewhere (forged presence: the real trainer then receives save and stop), or acknowledge a save
for another node's rank (forged ack: the action succeeds on a checkpoint that was never written).
So the coordinator accepts presence, acknowledgements and heartbeat-derived events
(``rank_heartbeat_lost``, ``rank_straggler``) for a job only from a node the scheduler says runs it
(:meth:`~ftd.coordinator.actions.scheduler.Scheduler.job_nodes`: Slurm's ``scontrol show job``
NodeList expanded by ``scontrol show hostnames``; Kubernetes' pod ``nodeName``). A node clearing its
own presence (ranks gone) is always accepted: it can only remove that node's own claim.

Cache: a job's node list is kept ``ttl_s`` seconds. A node not in a cached list is looked up again
(the job may just have been requeued onto it) at most once per ``refresh_s`` per job, so a forger
cannot turn its forgeries into a scontrol storm; a node's cache misses are also rate-limited (a
token bucket) so made-up job ids cannot either. A job ftd requeues itself is forgotten at once
(:meth:`Placement.forget`): its ranks restarting elsewhere within ``refresh_s`` are no forgery.

Scheduler errors: **fail closed, with a bounded retry**. A message whose job cannot be checked because
the scheduler does not answer (error or ``lookup_timeout_s``) is never accepted unverified: that
would let forgeries through exactly when the scheduler is down. It is not refused at once either:
a genuine ack or presence would then be lost for good (presence is retained, but the broker sends
it only once). It is *held* in memory (at most ``max_held`` messages) and handled again once a
lookup succeeds, retried with backoff for up to ``retry_s``; after that it is refused as
``placement_unverified`` (counted, logged). After a failed lookup the scheduler is not asked again
for ``failure_hold_s``, so a dead scheduler costs the bus pump at most one ``lookup_timeout_s`` wait
per hold period, never one per message.

A node-level answer (an ack of rank ``NODE_RANK`` to a gpu_reset or diagnostics directive) is
checked by the coordinator against the node the directive was sent to; a mismatch is booked here as
a ``node_ack`` violation.

Violations are counted (:attr:`Placement.violations`), logged (``placement_violation``) and summed
per node and window into one ``security`` event of severity error (:class:`SecurityBook`), which
the coordinator commits to the ledger like its ``bad_input`` summaries: what was claimed (kind of
message, job, rank), never the payload itself.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from ftd.coordinator.intake.fairness import TokenBucket
from ftd.events import Event, Kind, Severity
from ftd.logs import get_logger

log = get_logger(__name__)

T = TypeVar("T")

MAX_JOBS_LISTED = 20  # job ids named in one security summary (the count covers the rest)
MAX_CACHED_JOBS = 20_000
WHERE_CONCURRENCY = 16  # scheduler lookups at once in Placement.where


class NodeSource(Protocol):
    """What placement needs from a scheduler (every :class:`Scheduler` has it)."""

    name: str

    async def job_nodes(self, job: str) -> tuple[str, ...]: ...


class Verdict(enum.Enum):
    ALLOWED = "allowed"
    DENIED = "denied"
    UNKNOWN = "unknown"  # not cached (or stale): look it up
    UNVERIFIED = "unverified"  # the scheduler cannot answer now


class NeedPlacement(Exception):
    """Raised by a message handler before any side effect: these jobs must be looked up first."""

    def __init__(self, node: str, jobs: Iterable[str]) -> None:
        self.node, self.jobs = node, tuple(dict.fromkeys(jobs))
        super().__init__(f"placement of job(s) {', '.join(self.jobs)} not known for node {node}")


@dataclass
class _Entry:
    nodes: frozenset[str]
    fetched: float


class Placement:
    """The cache of which nodes run which job, and the verdicts drawn from it (module docstring)."""

    def __init__(
        self,
        scheduler: NodeSource | None,
        *,
        enforce: bool = True,
        ttl_s: float = 30.0,
        refresh_s: float = 2.0,
        lookup_timeout_s: float = 3.0,
        failure_hold_s: float = 2.0,
        retry_s: float = 60.0,
        max_held: int = 1000,
        miss_rate: float = 5.0,
        miss_burst: float = 50.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scheduler = scheduler
        self.enforced = enforce and scheduler is not None
        self.ttl_s, self.refresh_s = ttl_s, refresh_s
        self.lookup_timeout_s, self.failure_hold_s = lookup_timeout_s, failure_hold_s
        self.retry_s, self.max_held = retry_s, max_held
        self.miss_rate, self.miss_burst = miss_rate, miss_burst
        self.clock = clock
        self._cache: dict[str, _Entry] = {}
        self._inflight: dict[str, asyncio.Task[tuple[str, ...]]] = {}
        self._misses: dict[str, TokenBucket] = {}
        self._failed_until = 0.0
        self._held: set[asyncio.Task[None]] = set()
        #: Every running job's nodes, as the last successful warm-up (:meth:`warm`) got them; None
        #: until one succeeded.
        self.running: dict[str, frozenset[str]] | None = None
        self.lookups = 0
        self.lookup_failures = 0
        self.violations = 0
        self.unverified = 0
        self.security = SecurityBook()

    # --- verdicts ------------------------------------------------------------------------------

    def verdict(self, node: str, job: str) -> Verdict:
        if not self.enforced:
            return Verdict.ALLOWED
        now = self.clock()
        entry = self._cache.get(job)
        if entry is not None and now - entry.fetched < self.ttl_s:
            if node in entry.nodes:
                return Verdict.ALLOWED
            if now - entry.fetched < self.refresh_s:
                return Verdict.DENIED
        if now < self._failed_until:
            return Verdict.UNVERIFIED
        return Verdict.UNKNOWN

    def check(self, node: str, jobs: Iterable[str]) -> list[str]:
        """The jobs (of ``jobs``) ``node`` may not speak for; raises :class:`NeedPlacement` when one
        is not known yet (the caller looks it up with :meth:`lookup` and handles the message again)."""
        denied: list[str] = []
        unknown: list[str] = []
        for job in dict.fromkeys(jobs):
            verdict = self.verdict(node, job)
            if verdict is Verdict.DENIED:
                denied.append(job)
            elif verdict is not Verdict.ALLOWED:
                unknown.append(job)
        if unknown:
            raise NeedPlacement(node, unknown)
        return denied

    # --- lookups -------------------------------------------------------------------------------

    async def lookup(self, node: str, jobs: Iterable[str]) -> bool:
        """Ask the scheduler where ``jobs`` run (one request per job however many callers wait);
        True when every one of them is cached now, False when the scheduler could not answer or
        ``node`` is over its budget of cache misses."""
        if self.scheduler is None:
            return True
        now = self.clock()
        if now < self._failed_until:
            return False
        bucket = self._misses.get(node)
        if bucket is None:
            if len(self._misses) > 10_000:
                self._misses.clear()
            bucket = self._misses[node] = TokenBucket(self.miss_rate, self.miss_burst, 0.0, now)
        ok = True
        for job in dict.fromkeys(jobs):
            task = self._inflight.get(job)
            if task is None:
                if not bucket.take(now):
                    log.warning("placement_lookup_budget_exceeded", node=node, job=job[:128])
                    return False
                task = self._inflight[job] = asyncio.create_task(self._fetch(job), name=f"placement:{job}")
                task.add_done_callback(self._fetched)
            try:
                nodes = await asyncio.shield(task)
            except Exception as exc:  # SchedulerError, a timeout, anything: fail closed for now
                self.lookup_failures += 1
                self._failed_until = self.clock() + self.failure_hold_s
                log.error("placement_lookup_failed", job=job[:128], error=str(exc)[:300])
                ok = False
                break
            self._store(job, nodes)
        return ok

    def _fetched(self, task: asyncio.Task[tuple[str, ...]]) -> None:
        for job, running in list(self._inflight.items()):
            if running is task:
                del self._inflight[job]
        if not task.cancelled():
            task.exception()  # retrieved here too: a failure no caller awaited is not "never retrieved"

    async def warm(self) -> int:
        """Fill the cache with every running job in one scheduler call, when the scheduler offers
        ``running_job_nodes`` (Slurm; Kubernetes jobs are looked up one by one): a starting
        coordinator gets every job's retained presence at once, and one lookup per job would hold up
        the bus pump behind them (a resumed checkpoint_restart must see the job's ranks). Returns
        the number of jobs cached; a failure is logged and leaves the per-job lookups to do the work."""
        bulk = getattr(self.scheduler, "running_job_nodes", None)
        if not self.enforced or bulk is None:
            return 0
        try:
            async with asyncio.timeout(max(self.lookup_timeout_s, 10.0)):
                jobs = await bulk()
        except Exception as exc:
            log.warning("placement_warm_up_failed", error=str(exc)[:300])
            return 0
        for job, nodes in jobs.items():
            self._store(str(job), nodes)
        self.running = {str(job): frozenset(nodes) for job, nodes in jobs.items()}
        self.lookups += 1
        log.info("placement_warmed", jobs=len(jobs))
        return len(jobs)

    async def where(self, jobs: Iterable[str]) -> dict[str, frozenset[str]] | None:
        """Where each of ``jobs`` runs now (empty: nowhere), one lookup per job, a few side by side --
        for a scheduler without the bulk call of :meth:`warm`; None when the scheduler cannot answer."""
        if self.scheduler is None:
            return None
        wanted = list(dict.fromkeys(jobs))
        gate = asyncio.Semaphore(WHERE_CONCURRENCY)

        async def fetch(job: str) -> tuple[str, ...]:
            async with gate:
                return await self._fetch(job)

        answers = await asyncio.gather(*(fetch(job) for job in wanted), return_exceptions=True)
        found: dict[str, frozenset[str]] = {}
        for job, answer in zip(wanted, answers, strict=True):
            if isinstance(answer, BaseException):
                log.warning("placement_lookup_failed", job=job[:128], error=str(answer)[:300])
                return None
            self._store(job, answer)
            found[job] = frozenset(answer)
        return found

    async def _fetch(self, job: str) -> tuple[str, ...]:
        assert self.scheduler is not None
        self.lookups += 1
        async with asyncio.timeout(self.lookup_timeout_s):
            return await self.scheduler.job_nodes(job)

    def _store(self, job: str, nodes: Iterable[str]) -> None:
        now = self.clock()
        if len(self._cache) >= MAX_CACHED_JOBS:
            for stale in [j for j, e in self._cache.items() if now - e.fetched >= self.ttl_s]:
                del self._cache[stale]
            if len(self._cache) >= MAX_CACHED_JOBS:
                self._cache.clear()
        self._cache[job] = _Entry(frozenset(nodes), now)

    def forget(self, job: str) -> None:
        """Drop ``job``'s cached node list (ftd requeued it: it will run elsewhere); the next claim
        for it is looked up, whatever ``refresh_s`` says."""
        self._cache.pop(job, None)

    def nodes_of(self, job: str) -> frozenset[str] | None:
        """The cached node list of ``job`` (None: not cached); for tests and the API."""
        entry = self._cache.get(job)
        return entry.nodes if entry is not None else None

    # --- held messages -------------------------------------------------------------------------

    def hold(
        self,
        item: T,
        node: str,
        jobs: Iterable[str],
        again: Callable[[T], Awaitable[object]],
        give_up: Callable[[T], None],
    ) -> bool:
        """Keep ``item`` until the scheduler answers for ``jobs``, then ``again(item)``; after
        ``retry_s`` without an answer, ``give_up(item)``. False (nothing held) when ``max_held``
        items are held already: the caller refuses it now."""
        if len(self._held) >= self.max_held:
            return False
        held = _Held(item, node, tuple(jobs), again, give_up)
        task = asyncio.create_task(self._retry(held), name="placement-held")
        self._held.add(task)
        task.add_done_callback(self._held.discard)
        return True

    @property
    def held(self) -> int:
        return len(self._held)

    async def _retry(self, held: _Held[T]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retry_s
        delay = max(0.05, self.failure_hold_s / 2)
        while True:
            await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
            if await self.lookup(held.node, held.jobs):
                await held.again(held.item)
                return
            if loop.time() >= deadline:
                self.unverified += 1
                held.give_up(held.item)
                return
            delay = min(delay * 2, 10.0)

    async def close(self) -> None:
        tasks = [*self._held, *self._inflight.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- violations ----------------------------------------------------------------------------

    def violation(self, node: str, job: str, what: str, detail: str = "") -> None:
        """Count, log and book one message from ``node`` speaking for ``job`` it does not run."""
        self.violations += 1
        entry = self._cache.get(job)
        if self.violations <= 20 or self.violations % 1000 == 0:
            log.error(
                "placement_violation",
                node=node,
                job=job[:128],
                message=what,
                detail=detail[:200],
                scheduler_nodes=sorted(entry.nodes)[:16] if entry is not None else None,
                total=self.violations,
            )
        self.security.record(node, job, what)


@dataclass
class _Held(Generic[T]):
    item: T
    node: str
    jobs: tuple[str, ...]
    again: Callable[[T], Awaitable[object]]
    give_up: Callable[[T], None]


@dataclass
class _Window:
    id: str
    start: float
    updated: float = 0.0
    total: int = 0
    by_message: Counter[str] = field(default_factory=Counter)
    jobs: Counter[str] = field(default_factory=Counter)
    dirty: bool = False


class SecurityBook:
    """One ``security`` event per node and window summing its placement violations: the event's
    ``count`` is the total, ``data`` says by kind of message and names up to :data:`MAX_JOBS_LISTED`
    jobs. Committed with :meth:`~ftd.coordinator.ledger.sqlite.Ledger.record_summary` (same id while the
    window is open, so the stored event grows instead of multiplying)."""

    def __init__(self, *, window_s: float = 60.0, clock: Callable[[], float] = time.time) -> None:
        self.window_s = window_s
        self.clock = clock
        self._open: dict[str, _Window] = {}

    def record(self, node: str, job: str, what: str) -> None:
        now = self.clock()
        window = self._open.get(node)
        if window is None or (not window.dirty and now - window.start >= self.window_s):
            window = self._open[node] = _Window(id=f"{node}-security-{int(now * 1000):x}", start=now)
        window.updated = now
        window.total += 1
        window.by_message[what] += 1
        if job in window.jobs or len(window.jobs) < MAX_JOBS_LISTED:
            window.jobs[job[:128]] += 1
        window.dirty = True

    @property
    def dirty(self) -> bool:
        return any(w.dirty for w in self._open.values())

    def pending(self) -> list[Event]:
        return [self._event(node, w) for node, w in self._open.items() if w.dirty]

    def committed(self) -> None:
        now = self.clock()
        for node, window in list(self._open.items()):
            window.dirty = False
            if now - window.start >= self.window_s:
                del self._open[node]

    def _event(self, node: str, window: _Window) -> Event:
        return Event(
            id=window.id,
            ts=window.start,
            node=node,
            kind=Kind.SECURITY,
            severity=Severity.ERROR,
            source="coordinator",
            count=window.total,
            data={
                "problem": "placement_violation",
                "detail": "messages for jobs the scheduler does not run on this node were refused",
                "window_start": window.start,
                "updated": window.updated,
                "window_s": self.window_s,
                "violations": window.total,
                "by_message": dict(window.by_message),
                "jobs": dict(window.jobs),
            },
        )
