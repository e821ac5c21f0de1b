"""The composition root: :func:`build_agent` assembles an :class:`~ftd.agent.app.Agent`.

Every part of the agent is created here, once, from the configuration, and handed to it; the app
(:mod:`ftd.agent.app`) only runs them. The flow they make, from the node to the bus:

    watchers (kmsg, heartbeat, NVML, logs, fs, cloud notices, memory, host, save path, extra)
      -> storm control (:mod:`ftd.agent.storm`: first occurrences at once, repeats counted; the
         inventory's reports, sent only on change, go past it)
      -> the one door (:mod:`ftd.agent.door`: every event enriched with the job and rank of the
         process it names and the mount it concerns, then the node's conditions)
      -> the outbox on its spool (:mod:`ftd.agent.spool`) -> the bus

and back: the bus's directives -> the local API (:mod:`ftd.agent.local_api`, to the ranks and rank
supervisors) or the node's actions (:mod:`ftd.agent.node_actions`); what arrives on the local socket
is answered by :mod:`ftd.agent.hooks`. ``ftd agent`` (:mod:`ftd.commands.daemons`), the simulators
and the benchmarks call :func:`build_agent`; so do the tests, with fakes for the seams.

The local API and its hooks answer each other (the hooks read the registered ranks, the API calls the
hooks), so the API is given callbacks that reach the hooks built right after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ftd.agent import save_path
from ftd.agent.app import Agent, AgentParts
from ftd.agent.conditions import ConditionBook
from ftd.agent.door import Door
from ftd.agent.gpu_reset import GpuResetter, Runner
from ftd.agent.hooks import NodeHooks
from ftd.agent.inbound import Inbound
from ftd.agent.inventory.reporter import InventoryReporter
from ftd.agent.job_checks.checker import JobPathChecks
from ftd.agent.jobs import HookMsg, SchedulerJobs
from ftd.agent.local_api import LocalApi
from ftd.agent.local_api.inject import InjectMsg
from ftd.agent.metrics import MetricsServer
from ftd.agent.node_actions import NodeActions
from ftd.agent.node_conditions import NodeConditionWriter
from ftd.agent.pair_tests.service import PairTestService, training
from ftd.agent.spool import Outbox
from ftd.agent.storm import StormControl
from ftd.agent.supervision import Named, WatcherSupervisor, health_reporter
from ftd.agent.watchers.base import Emit, Watcher
from ftd.agent.watchers.cloud import CloudWatcher
from ftd.agent.watchers.fabric import FabricWatcher
from ftd.agent.watchers.fs import FsWatcher
from ftd.agent.watchers.heartbeat import HeartbeatWatcher
from ftd.agent.watchers.host import HostWatcher
from ftd.agent.watchers.kmsg import KmsgWatcher
from ftd.agent.watchers.kmsg_checkpoint import KmsgCheckpoint
from ftd.agent.watchers.logfile import LogWatcher
from ftd.agent.watchers.memory import MemoryWatcher
from ftd.agent.watchers.nvml.backend import NvmlBackend
from ftd.agent.watchers.nvml.real import RealNvml
from ftd.agent.watchers.nvml.watcher import NvmlWatcher
from ftd.bus.base import Bus
from ftd.catalog.hardware_profiles import load_hardware_catalog
from ftd.config import AgentConfig
from ftd.config.schema import HardwareConfig
from ftd.events import Ack, Event, Kind, RankInfo
from ftd.logs import get_logger

__all__ = ["build_agent", "open_outbox"]

log = get_logger(__name__)


def open_outbox(cfg: AgentConfig, bus: Bus) -> tuple[Outbox, list[dict[str, Any]]]:
    """The outbox on its spool, and the problems to report once running. A spool that cannot be
    written (full disk) is no reason to stop: the outbox holds events in memory and the health loop
    reports each outage (``spool_unavailable``) and its end (``spool_recovered``)."""
    spool = cfg.spool
    try:
        outbox = Outbox(
            bus,
            max_entries=cfg.outbox_max,
            path=Path(cfg.state_dir) / "outbox.spool",
            max_bytes=int(spool.max_mb * (1 << 20)),
            fsync=spool.fsync,
        )
    except OSError as exc:  # unreadable spool or state_dir: run, but say loudly that nothing is durable
        log.error("spool_unavailable_memory_only", error=str(exc))
        return Outbox(bus, max_entries=cfg.outbox_max), [{"problem": "spool_unavailable", "error": str(exc)}]
    return outbox, []


def build_agent(
    cfg: AgentConfig,
    *,
    bus: Bus,
    node: str | None = None,
    watchers: Sequence[Watcher] | None = None,
    gpu_runner: Runner | None = None,
    nvml_backend: NvmlBackend | None = None,
    stall_s: float = 120.0,
    health_interval_s: float = 1.0,
    rack_broker: str = "",
    hardware: HardwareConfig | None = None,
) -> Agent:
    """An agent for ``cfg`` on ``bus``. ``node``: its name (default: ``cfg.resolved_node()``);
    ``watchers``: more watchers beside the configured ones; ``gpu_runner`` / ``nvml_backend``: the
    GPU reset's command runner and NVML (fakes in tests); ``stall_s``: a watcher that makes no
    progress this long is restarted; ``rack_broker``: named in every status message; ``hardware``:
    the node's hardware profile and the operator's catalog (the top-level ``[hardware]`` table: the
    inventory's profile, the fabric watcher's thresholds)."""
    node = node or cfg.resolved_node()
    state_dir = Path(cfg.state_dir)
    outbox, startup_problems = open_outbox(cfg, bus)
    # Jobs the Slurm Prolog reported (with or without the client) and the node's active critical
    # conditions (what `ftd health` reports): ftd.agent.jobs, ftd.agent.conditions.
    scheduler_jobs = SchedulerJobs(state_dir / "jobs.json")
    conditions = ConditionBook(state_dir / "conditions.json")
    node_conditions = (  # ftd's view as a Kubernetes node condition (NPD-style)
        NodeConditionWriter(cfg.kubernetes, node, conditions) if cfg.kubernetes.node_conditions else None
    )

    # The local API is built first; what it calls (storm control through emit, the hooks) is built
    # below with it, and these closures reach them once built (before anything runs).
    inventory = _inventory(cfg, node, hardware, nvml_backend)

    async def emit(event: Event) -> None:
        """Every watcher's way in: storm control, then the one door. The inventory reads NCCL's
        version in the log lines that carry it, and NCCL's transport lines (log patterns) reach the
        job path checks (issue #36)."""
        if inventory is not None:
            inventory.observe(event)
        if event.kind is Kind.LOG_PATTERN:
            await job_checks.log_event(event)
        await storm.process(event)

    async def presence(job: str, ranks: list[RankInfo]) -> None:
        await hooks.presence(job, ranks)
        job_checks.presence(job, ranks)  # its own task: the RDMA path of a job that just started

    async def ack(message: Ack) -> None:
        await hooks.ack(message)

    async def hook(msg: HookMsg | InjectMsg) -> dict[str, Any]:
        return await hooks.hook(msg)

    local_api = LocalApi(
        cfg.socket_path,
        node,
        on_presence=presence,
        on_ack=ack,
        socket_mode=cfg.socket_mode,
        socket_group=cfg.socket_group,
        on_hook=hook,
        on_event=emit,  # a rank supervisor lost or failed (ftd run, issue #24)
    )
    job_checks = JobPathChecks(cfg.job_checks, node, emit)
    door = Door(
        node,
        outbox,
        conditions,
        owner_of=local_api.owner_of,
        ranks=local_api.jobs,
        mounts=lambda: save_path.current_mounts(cfg.fs.shared_mounts),
        conditions_changed=node_conditions.poke if node_conditions is not None else lambda: None,
    )
    # The kmsg position file is also storm control's checkpoint: one object, handed to both.
    kmsg_checkpoint = KmsgCheckpoint(state_dir / "kmsg.position", fsync=cfg.spool.fsync)
    storm = StormControl(
        door.send,
        window_s=cfg.storm.window_s,
        follow_window_s=cfg.storm.follow_window_s,
        checkpoint=kmsg_checkpoint,
    )
    health = health_reporter(node, emit)
    kmsg = KmsgWatcher(
        cfg.kmsg_path,
        node,
        emit,
        checkpoint=kmsg_checkpoint,
        from_start=cfg.kmsg_from_start,
        storm=storm,  # it offers its events (and repeats, without the event) to storm control
    )
    pair_tests = PairTestService(
        cfg.pair_tests,
        node,
        busy=training(local_api.jobs, scheduler_jobs.all, local_api.supervisors),
        host=cfg.pair_tests.host,
    )
    all_watchers: list[Watcher] = [
        Named("kmsg", kmsg),
        HeartbeatWatcher(cfg.heartbeat, node, emit, local_api=local_api),
        *configured_watchers(cfg, node, emit, local_api, nvml_backend, hardware),
        # Host state from sysfs/procfs: read-only remounts, md, NVMe, IB ports and counters, EDAC (#23).
        HostWatcher(node, emit),
        # The checkpoint directories the ranks registered: read-only, full, unresponsive (issue #23).
        save_path.SavePathWatcher(
            node,
            emit,
            local_api.jobs,
            interval_s=min(cfg.fs.save_path_interval_s, stall_s / 4),  # never "stalled" between checks
            timeout_s=cfg.fs.save_path_timeout_s,
            shared_mounts=cfg.fs.shared_mounts,
        ),
        # Active pair tests (issue #35): the server peers test against, refusing while a job trains here.
        pair_tests,
        *(watchers or ()),
    ]
    if inventory is not None:  # what this node runs, at start and on change (issue #36)
        # straight to the door: a report is sent only when it differs (or is asked again), never a
        # flood, and one asked again inside storm control's window must not wait for its summary
        inventory.bind(door.send)
        all_watchers.append(inventory)
    if node_conditions is not None:
        all_watchers.append(node_conditions)
    hooks = NodeHooks(
        cfg,
        node,
        outbox=outbox,
        emit=emit,
        local_api=local_api,
        scheduler_jobs=scheduler_jobs,
        conditions=conditions,
        fs_watchers=[w for w in all_watchers if isinstance(w, FsWatcher)],
        nvml_backend=nvml_backend,
        job_checks=job_checks,
    )
    hooks.pair_tests = pair_tests  # the burn-in's pair step tests through the same service
    gpu_resetter = GpuResetter(node, runner=gpu_runner)
    node_actions = NodeActions(
        node,
        outbox=outbox,
        emit=emit,
        gpu_resetter=gpu_resetter,
        jobs=local_api.jobs,
        preflight_now=hooks.preflight_now,
        diagnostics_dir=state_dir / "diagnostics",
        ask_flight=local_api.ask_flight,
        burn_in_now=hooks.burn_in_now,
        rma_bundle_now=hooks.rma_bundle_now,
        pair_test=pair_tests.on_directive,
    )
    parts = AgentParts(
        cfg=cfg,
        node=node,
        rack_broker=rack_broker,
        bus=bus,
        outbox=outbox,
        startup_problems=startup_problems,
        storm=storm,
        door=door,
        emit=emit,
        health=health,
        local_api=local_api,
        hooks=hooks,
        scheduler_jobs=scheduler_jobs,
        conditions=conditions,
        node_conditions=node_conditions,
        kmsg=kmsg,
        watchers=all_watchers,
        supervisor=WatcherSupervisor(stall_s, health),
        gpu_resetter=gpu_resetter,
        node_actions=node_actions,
        inbound=Inbound(
            node,
            bus=bus,
            outbox=outbox,
            local_api=local_api,
            node_actions=node_actions,
            coordinator_online=inventory.resend_soon if inventory is not None else None,
        ),
        health_interval_s=health_interval_s,
    )
    agent = Agent(parts)
    # The collector reads the running agent (its parts, and the watchdog the agent runs over them).
    if cfg.metrics.port:
        agent.metrics = MetricsServer(agent, cfg.metrics)
    return agent


def configured_watchers(
    cfg: AgentConfig,
    node: str,
    emit: Emit,
    local_api: LocalApi,
    nvml_backend: NvmlBackend | None,
    hardware: HardwareConfig | None = None,
) -> list[Watcher]:
    """The configurable watchers (NVML, logs, filesystem, cloud notices, memory, fabric); off or empty
    sections are skipped."""
    found: list[Watcher] = []
    if cfg.nvml.enabled:  # without NVML it logs "disabled" and idles; it never crashes the agent
        found.append(NvmlWatcher(cfg.nvml, node, emit, backend=nvml_backend))
    if cfg.logs.paths:
        found.append(LogWatcher(cfg.logs, node, emit))
    if cfg.fs.mounts:
        found.append(FsWatcher(cfg.fs, node, emit))
    if cfg.cloud.aws or cfg.cloud.gcp or cfg.cloud.azure:  # nothing polled unless enabled
        deadline_file = Path(cfg.socket_path).parent / "deadline"  # ftd.client.deadline reads it there
        found.append(CloudWatcher(cfg.cloud, node, emit, deadline_file=deadline_file))
    if cfg.memory.enabled:

        def trainer_pids() -> dict[int, tuple[str, int]]:
            """pid -> (job, rank) of every registered trainer rank (the memory watcher's RSS)."""
            return {
                rank.pid: (job, rank.rank)
                for job, ranks in local_api.jobs().items()
                for rank in ranks
                if rank.pid is not None
            }

        found.append(MemoryWatcher(cfg.memory, node, emit, pids=trainer_pids))
    if cfg.fabric.enabled:  # counters as rates, PCIe links, port rates (issue #35; docs/fabric.md)
        use_nvml = cfg.fabric.nvml and cfg.nvml.enabled
        backend = (nvml_backend if nvml_backend is not None else RealNvml()) if use_nvml else None
        state = Path(cfg.state_dir) / "fabric.json"
        found.append(
            FabricWatcher(
                cfg.fabric,
                node,
                emit,
                hardware=hardware,
                state_path=state,
                root=Path(cfg.fabric.root),
                backend=backend,
            )
        )
    return found


def _inventory(
    cfg: AgentConfig, node: str, hardware: HardwareConfig | None, nvml_backend: NvmlBackend | None
) -> InventoryReporter | None:
    """The inventory reporter (None when ``agent.inventory.enabled`` is off). Its NVML is the one
    handed in (a fake in tests), else its own :class:`RealNvml` when NVML is on."""
    if not cfg.inventory.enabled:
        return None
    hardware = hardware or HardwareConfig()
    nvml: NvmlBackend | None = nvml_backend
    if nvml is None and cfg.nvml.enabled:
        from ftd.agent.watchers.nvml.real import RealNvml

        nvml = RealNvml()
    try:
        catalog = load_hardware_catalog(Path(hardware.catalog) if hardware.catalog else None)
    except ValueError as exc:  # an operator's file that does not parse: the packaged one, said loudly
        log.error("hardware_catalog_unreadable", error=str(exc))
        catalog = load_hardware_catalog()
    return InventoryReporter(cfg.inventory, node, None, nvml=nvml, profile=hardware.profile, catalog=catalog)
