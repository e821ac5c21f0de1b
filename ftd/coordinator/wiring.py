"""The composition root: :func:`build` assembles a :class:`~ftd.coordinator.daemon.Coordinator`.

Everything the daemon is made of is created here, once, from the configuration, and handed to it:
cluster state and the ack book (``model``, ``actions``), the ledger (``ledger``), intake (placement,
fairness, admission, presence memory), the built-in executors and the rule plugins, the policy gate and
the engine (``decide``), the upkeep loops (reconciliation, return to service) and the services started
with it (the HTTP API). The daemon itself only runs them. The HA runner (:mod:`ftd.coordinator.ha`)
calls :func:`build` for each term it leads; ``ftd coordinator`` calls it once.
"""

from __future__ import annotations

from pathlib import Path

from ftd.bus.base import Bus
from ftd.catalog.hardware_profiles import load_hardware_catalog
from ftd.config import Config
from ftd.coordinator.actions import BuiltinExecutors, ExecutorContext
from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.directive import SentDirectives
from ftd.coordinator.actions.scheduler import Scheduler
from ftd.coordinator.api.server import start_api
from ftd.coordinator.daemon import Coordinator, coordinator_will
from ftd.coordinator.decide.engine import Engine
from ftd.coordinator.decide.plugins import (
    collect_executors,
    describe_plugins,
    disabled_plugins,
    make_plugin_manager,
)
from ftd.coordinator.decide.policy import PolicyGate
from ftd.coordinator.intake.admission import Admission
from ftd.coordinator.intake.fairness import (
    NODE_BURST,
    NODE_RATE,
    URGENT_RESERVE,
    WINDOW_S,
    InputBook,
    RateLimiter,
)
from ftd.coordinator.intake.inventory import InventoryIntake
from ftd.coordinator.intake.placement import Placement
from ftd.coordinator.intake.presence_memory import PresenceMemory
from ftd.coordinator.ledger.sqlite import Ledger, as_store
from ftd.coordinator.ledger.store import LedgerStore
from ftd.coordinator.model.state import ClusterState
from ftd.coordinator.upkeep.fabric_tests import FabricTests
from ftd.coordinator.upkeep.reconcile import Reconciler
from ftd.coordinator.upkeep.return_service import ReturnToService
from ftd.coordinator.upkeep.rma_bundles import RmaBundles
from ftd.events import Event
from ftd.logs import get_logger
from ftd.plugin.settings import RuleSettings

log = get_logger(__name__)

__all__ = ["build", "coordinator_will", "make_scheduler"]


def make_scheduler(config: Config) -> Scheduler | None:
    """The scheduler ``coordinator.scheduler`` selects (None: detect and notify only)."""
    cfg = config.coordinator
    if cfg.scheduler == "kubernetes":
        from ftd.coordinator.actions.kubernetes import KubernetesScheduler

        return KubernetesScheduler.from_config(cfg.kubernetes)
    if cfg.scheduler == "none" or not cfg.slurm.enabled:
        return None
    from ftd.coordinator.actions.slurm import SlurmScheduler

    return SlurmScheduler(
        scontrol=cfg.slurm.scontrol, slurm_conf=cfg.slurm.slurm_conf, timeout_s=cfg.slurm.timeout_s
    )


def build(
    config: Config,
    *,
    bus: Bus,
    scheduler: Scheduler | None,
    ledger: LedgerStore | Ledger | None = None,
    extra_plugins: tuple[object, ...] = (),
    node_rate: float = NODE_RATE,
    node_burst: float = NODE_BURST,
    urgent_reserve: float = URGENT_RESERVE,
    summary_window_s: float = WINDOW_S,
    api: bool = True,
) -> Coordinator:
    """A coordinator for ``config`` on ``bus``. ``node_rate`` / ``node_burst`` / ``urgent_reserve``:
    each node's token bucket, ``summary_window_s`` the span of one ``bad_input`` summary
    (:mod:`ftd.coordinator.intake.fairness`); ``api`` False: no HTTP API whatever the config says."""
    cfg = config.coordinator
    state = ClusterState()
    # Inventories and drift (issue #36): the minimums per hardware profile, the operator's file laid over.
    catalog = load_hardware_catalog(Path(config.hardware.catalog) if config.hardware.catalog else None)
    state.inventory.configure(
        minimums=lambda profile: catalog.section("versions", profile),
        action=cfg.drift.action,
        fields=cfg.drift.fields,
        min_peers=cfg.drift.min_peers,
        enabled=cfg.drift.enabled,
    )
    acks = AckBook()
    store: LedgerStore = as_store(ledger or Ledger(cfg.ledger_path))
    place = cfg.placement
    placement = Placement(
        scheduler,
        enforce=place.enforce,
        ttl_s=place.ttl_s,
        refresh_s=place.refresh_s,
        lookup_timeout_s=place.lookup_timeout_s,
        retry_s=place.retry_s,
    )
    if not placement.enforced:
        why = "disabled in config" if scheduler is not None else "no scheduler"
        log.warning("placement_not_enforced", reason=why, effect="any node may speak for any job")
    limits = {"rate": node_rate, "burst": node_burst, "urgent_reserve": urgent_reserve}
    admission = Admission(
        placement=placement,
        limiter=RateLimiter(node_rate, node_burst, urgent_reserve),
        inputs=InputBook(window_s=summary_window_s, limits=limits),
    )
    directives = SentDirectives(bus.publish)
    engines: list[Engine] = []  # the engine, once built: diagnose_hang hands its verdict event to it

    async def to_engine(event: Event) -> object:
        return await engines[0].handle_event(event)

    builtin = BuiltinExecutors(
        ExecutorContext(
            config=config,
            state=state,
            acks=acks,
            publish=bus.publish,
            send_to_node=directives.send,
            scheduler=scheduler,
            job_moved=placement.forget,
            save_action=store.save_action,
            emit_event=to_engine,
        )
    )
    plugins = make_plugin_manager(
        disabled=cfg.disabled_rules,
        extra=(builtin, *extra_plugins),
        rule_dirs=cfg.rule_dirs,
        rules_file=cfg.rules_file,
    )
    executors = collect_executors(plugins)
    loaded = describe_plugins(plugins)
    log.info(
        "rules_loaded",
        rules=[f"{p.name} ({p.source}: {', '.join(p.hooks)})" for p in loaded],
        disabled=disabled_plugins(plugins),
    )
    engine = Engine(
        state=state,
        ledger=store,
        gate=PolicyGate.from_config(cfg),
        plugins=plugins,
        executors=executors,
        rule_settings=RuleSettings.from_policy(cfg.policy),
    )
    engines.append(engine)
    # ftd's drains from the ledger before any event is decided; kept in step with the scheduler
    reconciler = Reconciler(
        state=state,
        ledger=store,
        scheduler=scheduler,
        engine=engine,
        interval_s=cfg.reconcile_interval_s,
        pending_alert_s=cfg.pending_alert_s,
        unacted_retry_s=cfg.unacted_retry_s,
        unacted_retry_max_s=cfg.unacted_retry_max_s,
    )
    engine.observe(reconciler.observe, ("action",))
    engine.observe(InventoryIntake(state, settle_s=cfg.drift.settle_s).observe, ("event",))
    return_to_service = None
    if cfg.return_to_service.rules:  # opt-in per rule: reset -> preflight -> resume or RMA
        return_to_service = ReturnToService(
            engine.submit,
            rules=cfg.return_to_service.rules,
            state=state,
            require_burn_in=cfg.return_to_service.require_burn_in,
            pair_gate=cfg.fabric.enabled and cfg.fabric.return_gate,
        )
        engine.observe(return_to_service.observe, ("action",))
        unknown = sorted(set(cfg.return_to_service.rules) - {p.name for p in loaded})
        if unknown:  # a typo would silently keep those resets out of return to service
            log.warning(
                "return_to_service_rules_not_loaded", rules=unknown, loaded=sorted(p.name for p in loaded)
            )
    if cfg.rma.enabled:  # a node drained for repair gets its diagnostic bundle (issue #36)
        engine.observe(RmaBundles(engine.submit, reasons=cfg.rma.reasons).observe, ("action",))
    fabric_tests = None
    if cfg.fabric.enabled:  # bisections by pair tests on idle or drained nodes (issue #35)
        fabric_tests = FabricTests(
            engine.submit,
            state,
            hardware=config.hardware,
            deadline_s=cfg.fabric.deadline_s,
            auto=cfg.fabric.auto_bisect,
            cooldown_s=cfg.fabric.bisect_cooldown_s,
        )
        engine.observe(fabric_tests.observe, ("action", "event") if cfg.fabric.auto_bisect else ("action",))
    return Coordinator(
        config,
        bus=bus,
        scheduler=scheduler,
        state=state,
        acks=acks,
        ledger=store,
        engine=engine,
        admission=admission,
        placement=placement,
        presence_memory=PresenceMemory(store, state),
        directives=directives,
        reconciler=reconciler,
        return_to_service=return_to_service,
        fabric_tests=fabric_tests,
        services=(start_api,) if api else (),
    )
