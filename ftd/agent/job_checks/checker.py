"""A job's communication path checked when its ranks appear here, and again when NCCL says more.

What: :class:`JobPathChecks` reads the facts of :mod:`ftd.agent.job_checks.facts` for a job as soon
as the local API reports ranks of it with pids (the ranks register with the client at start; the
Prolog alone gives no process), judges them (:func:`ftd.platform.rdma.judge`) and, when there is
something to say (a cause, or a fact that could not be read) that it has not said for the job yet,
emits a ``platform`` event: ``job``, ``verdict`` (``slow_path`` | ``unknown`` | ``ok``), ``causes`` (names),
``details`` (a sentence per cause), ``evidence``, ``unknown`` (fact -> why) and ``passed``. Severity:
error when a cause is an error, warning for warnings only, info otherwise.

NCCL's own word arrives later, in the training logs (``NCCL_DEBUG=INFO``): the log watcher's
``nccl_net_*`` patterns (ftd/catalog/log_patterns.toml) match the transport lines and their events
pass through :meth:`JobPathChecks.log_event`; the job is judged again and a new event goes out when
the verdict's causes changed. A log line is the job's when it is the only one with ranks here;
otherwise it is judged for every job here that has not seen NCCL's word yet (and says so).

Why at the rank's registration: the target is an event within 10 s of the job's start; the reads
are a few small files, run off the loop, judged at once. The rendezvous port is probed beside it
(:meth:`JobPathChecks._probe`): ranks register before their process group listens, so a refused port
is tried again every ``connect_retry_s`` up to ``connect_attempts`` times before it is a cause, and
its answer is judged when it comes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from ftd.agent.job_checks import facts
from ftd.config.schema import JobChecksConfig
from ftd.events import Event, Kind, RankInfo, Severity, make_event
from ftd.logs import get_logger
from ftd.platform.nccl_init import NcclTransport, sighting
from ftd.platform.rdma import NO_NCCL_LINE, Fact, PathFacts, PathVerdict, Thresholds, judge

__all__ = ["JobPathChecks", "Roots"]

log = get_logger(__name__)

Emit = Callable[[Event], Awaitable[None]]
MAX_JOBS = 256
MAX_PIDS = 64  # per job: the ranks of one node
RENDEZVOUS_PENDING = "not answered yet (probing)"
NOT_APPLICABLE = (
    NO_NCCL_LINE,
    RENDEZVOUS_PENDING,
    facts.NO_DEVICE,
    facts.NO_RENDEZVOUS,
    "turned off",
)
"""Unknowns that say a fact does not apply (yet, or here), not that it could not be read."""


@dataclass(frozen=True)
class Roots:
    """Where the facts are read (tests point them at trees written by a real process)."""

    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    modules: Path = Path("/proc/modules")
    cmdline: Path = Path("/proc/cmdline")


@dataclass
class _Job:
    pids: set[int] = field(default_factory=set)
    facts: PathFacts = field(default_factory=PathFacts)
    nccl: NcclTransport = field(default_factory=NcclTransport)
    sent: tuple[str, tuple[str, ...], tuple[str, ...]] | None = None  # (verdict, causes, unread) last said
    probe: asyncio.Task[None] | None = None  # the rendezvous probe


class JobPathChecks:
    """See the module docstring. ``profile_ib``: the node is (not) on IB, whatever sysfs shows
    (default: ``cfg.infiniband``; ``auto`` reads /sys/class/infiniband)."""

    def __init__(
        self,
        cfg: JobChecksConfig,
        node: str,
        emit: Emit,
        *,
        roots: Roots | None = None,
        profile_ib: bool | None = None,
    ) -> None:
        self.cfg = cfg
        self.node = node
        self._emit = emit
        self._roots = roots or Roots()
        said = {"yes": True, "no": False}.get(cfg.infiniband)
        self._profile_ib = profile_ib if profile_ib is not None else said
        self._jobs: dict[str, _Job] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self._limits = Thresholds(
            min_memlock_bytes=int(cfg.min_memlock_mib * (1 << 20)),
            min_shm_bytes=int(cfg.min_shm_mib * (1 << 20)),
        )

    def presence(self, job: str, ranks: list[RankInfo]) -> None:
        """The local API's presence callback's share: check in a task of its own, so a slow read or
        connect never holds up the acks queued behind the presence."""
        if not self.cfg.enabled:
            return
        task = asyncio.create_task(self._locked(job, ranks), name=f"ftd-job-checks-{job}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _locked(self, job: str, ranks: list[RankInfo]) -> None:
        try:
            async with self._lock:
                await self.ranks(job, ranks)
        except Exception:
            log.exception("job_path_check_failed", job=job)

    async def ranks(self, job: str, ranks: list[RankInfo]) -> PathVerdict | None:
        """The local API's presence of ``job``: check the ranks whose pids are new. None when nothing
        new was checked (no pid, or all seen); the verdict otherwise (its event emitted)."""
        if not self.cfg.enabled:
            return None
        if not ranks:
            self._jobs.pop(job, None)
            return None
        pids = {r.pid for r in ranks if r.pid is not None}
        state = self._jobs.get(job)
        if state is None:
            if len(self._jobs) >= MAX_JOBS:
                self._jobs.pop(next(iter(self._jobs)))
            state = self._jobs[job] = _Job()
        new = sorted(pids - state.pids)[:MAX_PIDS]
        if not new:
            return None
        state.pids.update(new)
        state.facts, where = await self._read(state, new)
        verdict = await self._judge(job, state)
        if where is not None and state.probe is None:  # the rendezvous, in its own time (below)
            state.probe = asyncio.create_task(self._probe(job, state, *where), name=f"ftd-rendezvous-{job}")
            self._tasks.add(state.probe)
            state.probe.add_done_callback(self._tasks.discard)
        return verdict

    async def _probe(self, job: str, state: _Job, host: str, port: int) -> None:
        """Connect to the job's rendezvous until it answers or the attempts run out: a refused port
        may only mean rank 0 does not listen yet (the ranks register before their process group), so
        it is retried every ``connect_retry_s``; the verdict is judged again with the answer."""
        result = "no attempt"
        try:
            for attempt in range(self.cfg.connect_attempts):
                if attempt:
                    await asyncio.sleep(self.cfg.connect_retry_s)
                result = await facts.rendezvous(host, port, self.cfg.connect_timeout_s)
                if result == "ok":
                    break
            async with self._lock:
                if self._jobs.get(job) is not state:
                    return  # the job ended here meanwhile
                state.facts.rendezvous = Fact(result)
                await self._judge(job, state)
        except Exception:
            log.exception("job_rendezvous_check_failed", job=job)

    async def settle(self) -> None:
        """Wait for the checks and rendezvous probes started so far (tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def log_event(self, event: Event) -> None:
        """A log watcher's event: a ``nccl_net_*`` match feeds the NCCL transport of the job(s) here."""
        if not self.cfg.enabled or event.kind != Kind.LOG_PATTERN:
            return
        if not str(event.data.get("pattern", "")).startswith("nccl_net_"):
            return
        seen = sighting(str(event.data.get("text", "")))
        if seen is None:
            return
        targets = (
            list(self._jobs)
            if len(self._jobs) == 1
            else [j for j, s in self._jobs.items() if not s.nccl.known]
        )
        for job in targets:
            state = self._jobs[job]
            if state.nccl.add(seen):
                state.facts.nccl = state.nccl
                await self._judge(job, state, shared=len(self._jobs) > 1)

    async def close(self) -> None:
        """Cancel the checks and rendezvous probes still running (the agent stops)."""
        tasks, self._tasks = list(self._tasks), set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def verdict(self, job: str) -> PathVerdict | None:
        """The job's verdict on what is known now (None: no rank of it checked here)."""
        state = self._jobs.get(job)
        return None if state is None else judge(state.facts, self._limits)

    def forget(self, job: str) -> None:
        self._jobs.pop(job, None)

    async def _read(self, state: _Job, new: list[int]) -> tuple[PathFacts, tuple[str, int] | None]:
        """The facts with the new ranks', and the rendezvous to probe (None: known, absent or off)."""
        roots, old = self._roots, state.facts

        def node_and_ranks() -> PathFacts:
            got = PathFacts(
                ib_cluster=facts.ib_node(roots.sys, self._profile_ib),
                peermem=facts.peermem(roots.modules),
                memlock={**old.memlock, **{p: facts.memlock(p, roots.proc) for p in new}},
                shm={**old.shm, **{p: facts.shm_size(p, roots.proc) for p in new}},
                acs=facts.acs_ports(roots.sys) if self.cfg.acs else Fact.unknown("turned off (acs = false)"),
                iommu=facts.iommu_mode(roots.sys, roots.cmdline),
                nccl=state.nccl,
            )
            return got

        got = await asyncio.to_thread(node_and_ranks)
        if not self.cfg.rendezvous:
            got.rendezvous = Fact.unknown("turned off (rendezvous = false)")
            return got, None
        if old.rendezvous.known or old.rendezvous_addr:  # one answer per job: the ranks share it
            got.rendezvous, got.rendezvous_addr = old.rendezvous, old.rendezvous_addr
            return got, None
        found = [facts.rendezvous_address(pid, roots.proc) for pid in new]
        where = next((w for w in found if not isinstance(w, str)), found[0])
        if isinstance(where, str):
            got.rendezvous = Fact.unknown(where)
            return got, None
        got.rendezvous_addr = f"{where[0]}:{where[1]}"
        got.rendezvous = Fact.unknown(RENDEZVOUS_PENDING)
        return got, where

    async def _judge(self, job: str, state: _Job, *, shared: bool = False) -> PathVerdict:
        """Judge ``state``; emit when there is something to say (a cause, or a fact that could not be
        read) that differs from what was last said for the job. Unknowns that only say a fact does not
        apply yet or here (NCCL not heard from yet, no GPU or IB device, no MASTER_ADDR, a check turned
        off) are in every event but do not make one on their own."""
        verdict = judge(state.facts, self._limits)
        unread = sorted(k for k, why in verdict.unknown.items() if not why.startswith(NOT_APPLICABLE))
        key = (verdict.verdict, tuple(c.name for c in verdict.causes), tuple(unread))
        log.info("job_path_checked", job=job, verdict=verdict.verdict, causes=list(key[1]), unread=unread)
        if (not verdict.causes and not unread) or key == state.sent:
            return verdict
        state.sent = key
        data = {"job": job, "pids": sorted(state.pids)[:MAX_PIDS], **verdict.to_dict()}
        if shared:
            data["nccl_job_guessed"] = "several jobs here: the NCCL line's job is not known"
        if state.nccl.known:
            data["nccl"] = state.nccl.to_dict()
        await self._emit(
            make_event(
                self.node,
                Kind.PLATFORM,
                severity=Severity(verdict.severity),
                source="job_checks",
                data=data,
            )
        )
        return verdict
