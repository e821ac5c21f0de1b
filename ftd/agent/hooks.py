"""What the agent answers on its local socket: job presence, the node's hooks, the ranks' acks.

What: :class:`NodeHooks`, the callbacks the local API (:mod:`ftd.agent.local_api`) is built with:

* :meth:`~NodeHooks.presence`: a job's ranks here changed: its retained presence goes out (with the
  Prolog's ``allocation`` and the rank supervisor, if any; an empty payload once nothing of it is
  left here), and a job that just arrived is told to the filesystem watchers (a still-full
  filesystem must not take it);
* :meth:`~NodeHooks.hook`: the Slurm Prolog/Epilog (``job_start`` / ``job_end``, and the leftover
  processes an Epilog found, as an event), ``ftd health``'s question (the node's active conditions),
  ``ftd preflight`` through the agent, and ``ftd inject``'s drill event (published like any other);
* :meth:`~NodeHooks.ack`: a rank's acknowledgement, queued for the coordinator;
* :meth:`~NodeHooks.burn_in_now` and :meth:`~NodeHooks.rma_bundle_now`: the node directives'
  burn-in (never while a job the Prolog reported or a registered rank is here) and repair bundle.

Why apart from the daemon (:mod:`ftd.agent.app`): the app only runs the parts
:mod:`ftd.agent.wiring` builds; what a job's arrival or a hook means on this node is this module's
one job. Events leave through the agent's one door (:mod:`ftd.agent.door`) like all others.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from ftd.agent.conditions import HARDWARE_KINDS, ConditionBook
from ftd.agent.job_checks.checker import JobPathChecks
from ftd.agent.jobs import (
    ENDED_JOBS_DIR,
    ConditionsMsg,
    HookMsg,
    JobEndMsg,
    JobStartMsg,
    SchedulerJobs,
    leftover_event,
)
from ftd.agent.local_api import LocalApi
from ftd.agent.local_api.inject import INJECT, DrillError, InjectMsg, injected_event
from ftd.agent.local_api.inject import reply as inject_reply
from ftd.agent.pair_tests.service import PairTestService, training_jobs
from ftd.agent.preflight.burn_in import PairTest
from ftd.agent.rma.bundle import Bundle
from ftd.agent.spool import Outbox, Outgoing
from ftd.agent.watchers.fs import FsWatcher
from ftd.agent.watchers.nvml.backend import NvmlBackend
from ftd.bus import topics
from ftd.client import protocol
from ftd.config import AgentConfig
from ftd.config.schema import HardwareConfig
from ftd.events import Ack, Event, JobPresence, RankInfo, encode
from ftd.logs import get_logger
from ftd.platform.burn_in import BurnInReport

__all__ = ["NodeHooks"]

log = get_logger(__name__)

Emit = Callable[[Event], Awaitable[None]]


class NodeHooks:
    """The local API's callbacks for one node; see the module docstring."""

    def __init__(
        self,
        cfg: AgentConfig,
        node: str,
        *,
        outbox: Outbox,
        emit: Emit,
        local_api: LocalApi,
        scheduler_jobs: SchedulerJobs,
        conditions: ConditionBook,
        fs_watchers: Sequence[FsWatcher] = (),
        nvml_backend: NvmlBackend | None = None,
        job_checks: JobPathChecks | None = None,
    ) -> None:
        self.cfg = cfg
        self.node = node
        self._outbox = outbox
        self._emit = emit
        self._local_api = local_api
        self._scheduler_jobs = scheduler_jobs
        self._conditions = conditions
        self._fs_watchers = list(fs_watchers)
        self._nvml_backend = nvml_backend  # preflight asks the same NVML the watcher does
        self._jobs_here: set[str] = set()  # jobs with something of theirs on this node
        self.job_checks = job_checks  # a job's RDMA path at its start (issue #36); closed with the agent
        self.pair_tests: PairTestService | None = None  # the burn-in's pair step (set by the wiring)

    async def presence(self, job: str, ranks: list[RankInfo]) -> None:
        """Publish ``job``'s presence on this node (retained; empty once nothing of it is here)."""
        topic = topics.node_job(self.node, job)
        allocation = self._scheduler_jobs.get(job)  # the Prolog's word: the job runs here, client or not
        supervisor = self._local_api.supervisor(job)  # its rank supervisor here (ftd run), if any
        here = bool(ranks) or allocation is not None or supervisor is not None
        payload = (
            encode(
                JobPresence(
                    job=job,
                    node=self.node,
                    ranks=ranks,
                    ts=time.time(),
                    allocation=allocation,
                    supervisor=supervisor,
                )
            )
            if here
            else b""
        )
        # Not durable: replaying a stale presence after a restart would resurrect a gone job.
        self._outbox.put(Outgoing(topic, payload, retain=True, priority=3, durable=False))
        if not here:
            self._jobs_here.discard(job)
        elif job not in self._jobs_here:  # a job arrived: a still-full filesystem must not take it
            self._jobs_here.add(job)
            for watcher in self._fs_watchers:
                await watcher.job_arrived(job)

    async def republish(self) -> None:
        """Every job the Prolog reported (kept across an agent restart): its presence again."""
        for job in self._scheduler_jobs.all():
            await self.presence(job, self._local_api.jobs().get(job, []))

    async def ended_while_away(self) -> None:
        """End the jobs whose Epilog could not reach us (files in ``state_dir/ended-jobs``)."""
        for job in self._scheduler_jobs.ended_while_away(Path(self.cfg.state_dir) / ENDED_JOBS_DIR):
            log.info("job_ended_while_away", job=job)
            await self.presence(job, self._local_api.jobs().get(job, []))

    async def hook(self, msg: HookMsg | InjectMsg) -> dict[str, Any]:
        """A node hook over the local socket (:mod:`ftd.agent.jobs`, :mod:`ftd.agent.local_api.inject`)."""
        if isinstance(msg, InjectMsg):
            try:
                event = injected_event(self.node, msg)
            except DrillError as exc:  # bad input: a sentence back, nothing sent
                return dict(protocol.error(INJECT, str(exc)))
            log.info("event_injected", kind=str(event.kind), severity=str(event.severity), id=event.id)
            await self._emit(event)
            return inject_reply(event)
        if isinstance(msg, JobStartMsg):
            self._scheduler_jobs.start(msg)
            self._local_api.job_started(msg.job)  # directives pending for an earlier run are stale
            await self.presence(msg.job, self._local_api.jobs().get(msg.job, []))
            return dict(protocol.ok(protocol.JOB_START))
        if isinstance(msg, JobEndMsg):
            self._scheduler_jobs.end(msg.job)
            self._local_api.job_ended(msg.job)  # a supervisor of it lost here is forgotten
            await self.presence(msg.job, self._local_api.jobs().get(msg.job, []))
            if msg.leftover:
                await self._emit(leftover_event(self.node, msg))
            return dict(protocol.ok(protocol.JOB_END))
        if isinstance(msg, ConditionsMsg):
            return {
                "v": protocol.PROTOCOL_VERSION,
                "op": protocol.CONDITIONS,
                "node": self.node,
                "conditions": [c.to_dict() for c in self._conditions.active()],
            }
        return await self.preflight_now()

    async def preflight_now(self, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Run the node's preflight checks now (:mod:`ftd.agent.preflight`); a pass clears hardware
        faults. ``params["pair_peer"]`` (the coordinator's return to service names a known-good idle
        peer): a ``pair_test`` check runs first, judged like the burn-in's pair step; without a peer
        it is skipped, saying why (issue #35: a pair test runs in preflight)."""
        from ftd.agent.job_checks.node_check import rdma_node_check
        from ftd.agent.preflight.burn_in import node_profile
        from ftd.agent.preflight.runner import run_preflight

        extra: dict[str, Callable[[], tuple[str, str]]] = {}
        if self.cfg.job_checks.enabled:
            extra["rdma"] = partial(rdma_node_check, self.cfg.job_checks)
        profile, _ = await asyncio.to_thread(node_profile, HardwareConfig(), self._nvml_backend)
        pair = self._pair_step(params or {}, profile)
        if pair is not None:
            done = await pair()
            verdict = {"pass": "pass", "skip": "skip"}.get(done.status, "fail")
            extra["pair_test"] = lambda: (verdict, done.reason)
        else:
            why = (
                "pair tests are off on this node"
                if self.pair_tests is None
                else "no peer named to test against"
            )
            extra["pair_test"] = lambda: ("skip", why)
        report = await asyncio.to_thread(run_preflight, self.cfg, self._nvml_backend, extra=extra)
        if report.ok:
            self._conditions.clear_all(why="preflight passed", kinds=HARDWARE_KINDS)
        return {"v": protocol.PROTOCOL_VERSION, "op": protocol.PREFLIGHT, **report.to_dict()}

    async def burn_in_now(self, params: Mapping[str, Any] | None = None) -> BurnInReport:
        """The burn-in (:mod:`ftd.agent.preflight.burn_in`), its report saved under ``state_dir``. The
        profile comes from the GPU name NVML reports (the agent is not given ``hardware``); the fleet's
        figure from ``params["fleet_tflops"]`` (the coordinator's, per profile) when it has one for this
        profile, else ``agent.preflight.burn_in_fleet_tflops``; the pair step tests the peer the
        coordinator named (:meth:`_pair_step`)."""
        from ftd.agent.preflight.burn_in import node_profile, plan_for, run_burn_in, save_report

        hardware = HardwareConfig()
        profile, _ = await asyncio.to_thread(node_profile, hardware, self._nvml_backend)
        fleet = (params or {}).get("fleet_tflops")  # the coordinator's: profile -> the fleet's TFLOPS
        figure = fleet.get(profile) if isinstance(fleet, dict) and profile else None
        extra = {"fleet_tflops": float(figure)} if isinstance(figure, int | float) and figure > 0 else {}
        plan = plan_for(self.cfg, hardware, profile, **extra)

        def training() -> list[str]:
            # no supervisor exception here: a burn-in loads the GPUs, never beside an idle job's slots
            return training_jobs(self._local_api.jobs(), self._scheduler_jobs.all())

        pair = self._pair_step(params or {}, profile)
        report = await run_burn_in(self.node, plan, training=training, pair_test=pair, profile=profile)
        if report.verdict != "refused":
            try:
                await asyncio.to_thread(save_report, report, Path(self.cfg.state_dir) / "burn-in")
            except OSError as exc:
                log.warning("burn_in_report_not_saved", error=str(exc)[:200])
        return report

    def _pair_step(self, params: Mapping[str, Any], profile: str | None) -> PairTest | None:
        """The burn-in's pair step: a pair test against the known-good peer the coordinator named
        (``params["pair_peer"]``), judged like any pair test (:func:`~ftd.agent.pair_tests.check.
        pair_check`: ``pair.toml`` for the node's profile and the fleet's baselines,
        ``params["pair_baseline_gbps"]`` and ``params["pair_rtt_baseline_ms"]``); None (the step
        skipped, saying so) when pair tests are off here or no peer was named."""
        from ftd.agent.pair_tests.check import pair_check

        peer = params.get("pair_peer")
        service = self.pair_tests
        if service is None or not isinstance(peer, Mapping):
            return None

        def positive(raw: Any) -> float | None:
            ok = isinstance(raw, int | float) and not isinstance(raw, bool) and math.isfinite(raw) and raw > 0
            return float(raw) if ok else None

        baseline, rtt = (
            positive(params.get("pair_baseline_gbps")),
            positive(params.get("pair_rtt_baseline_ms")),
        )
        return partial(pair_check, service, peer, profile, baseline, rtt_baseline_ms=rtt)

    async def rma_bundle_now(self, params: Mapping[str, Any]) -> Bundle:
        """The repair bundle (:mod:`ftd.agent.rma.bundle`); ``params`` from the coordinator: its
        ``evidence``, ``kmsg_window_s`` and ``bug_report_timeout_s``."""
        from ftd.agent.diagnostics import _run
        from ftd.agent.rma.bundle import collect_bundle

        def number(key: str, default: float) -> float:
            value = params.get(key)
            ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 86400
            return float(value) if ok else default  # type: ignore[arg-type]

        evidence = params.get("evidence")
        return await collect_bundle(
            self.node,
            Path(self.cfg.state_dir),
            run=_run,
            kmsg_path=self.cfg.kmsg_path,
            kmsg_window_s=number("kmsg_window_s", 3600.0),
            nvml=self._nvml_backend,
            evidence={"reason": params.get("reason", ""), **(evidence if isinstance(evidence, dict) else {})},
            bug_report_timeout_s=number("bug_report_timeout_s", 600.0),
        )

    async def close(self) -> None:
        """Stop what the hooks started that may still run (the job path checks' probes)."""
        if self.job_checks is not None:
            await self.job_checks.close()

    async def ack(self, ack: Ack) -> None:
        """A rank's acknowledgement of a directive, for the coordinator."""
        self._outbox.put(Outgoing(topics.node_acks(self.node), encode(ack), priority=3))
