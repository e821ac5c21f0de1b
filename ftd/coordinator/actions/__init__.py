"""Executors: the only code that acts on the world (scheduler, bus directives, webhooks, ...).

:func:`build_executors` assembles the built-in executors for a coordinator from its configuration;
:class:`BuiltinExecutors` offers them through the ``ftd_register_actions`` hook, exactly as a plugin
offers its own, so the coordinator has one way to learn executors (and a plugin that claims a kind
already taken fails start-up the same way, whoever came first).

Always registered: ``checkpoint_restart``, ``gpu_reset``, ``collect_diagnostics`` and ``diagnose_hang``
(bus directives to agents; diagnose_hang hands its verdict to the rules through ``emit_event``).
``drain_node`` / ``resume_node`` go through whichever scheduler ``coordinator.scheduler``
selects (Slurm, Kubernetes) and are absent with none. ``notify`` is always registered: it posts to
each webhook configured (``coordinator.notify``: ``webhook_url``/``url_file`` and ``destinations``, in
its format), else it writes one ``notification`` warning line to the log and the action ends ``logged``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

from ftd.config import Config
from ftd.config.schema import SlurmConfig
from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.burn_in import BURN_IN, BurnIn
from ftd.coordinator.actions.checkpoint_restart import CheckpointRestart
from ftd.coordinator.actions.diagnose_hang import DiagnoseHang, EmitEvent
from ftd.coordinator.actions.diagnostics import CollectDiagnostics
from ftd.coordinator.actions.directive import NodeSend
from ftd.coordinator.actions.drain import DrainNode, ResumeNode
from ftd.coordinator.actions.gpu_reset import GpuReset
from ftd.coordinator.actions.notify import Notify
from ftd.coordinator.actions.pair_test import PAIR_TEST, PairTest, burn_in_peer
from ftd.coordinator.actions.preflight import PREFLIGHT, Preflight
from ftd.coordinator.actions.rma import RMA_BUNDLE, RmaBundle
from ftd.coordinator.actions.scheduler import Scheduler
from ftd.coordinator.actions.slurm_signal import SlurmSignalFallback
from ftd.coordinator.actions.spare_tests import SpareTests
from ftd.coordinator.model.state import ClusterState
from ftd.plugin.actions import ActionKind, ActionRecord
from ftd.plugin.hookspecs import Executor, hookimpl


@dataclass(frozen=True)
class ExecutorContext:
    """Everything an executor may use: configuration, state, the bus (publish only), the scheduler."""

    config: Config
    state: ClusterState
    acks: AckBook
    publish: Callable[[str, bytes], Awaitable[None]]  # job directives (one topic per node of the job)
    send_to_node: NodeSend  # node directives: the node is passed along with the directive
    scheduler: Scheduler | None
    #: Told the job ftd just requeued (its nodes change): the coordinator's placement cache forgets
    #: the old list, so the ranks that start elsewhere are believed, not reported as forgeries.
    job_moved: Callable[[str], None] = lambda job: None
    #: Persist an action record mid-phase (the ledger): checkpoint_restart records each generation it
    #: starts inside an allocation before sending it, so a restarted coordinator resumes that one.
    save_action: Callable[[ActionRecord], Awaitable[None]] | None = None
    #: Hand a coordinator-sourced event to the rules (the engine's handle_event): diagnose_hang's verdict.
    emit_event: EmitEvent | None = None


def build_executors(ctx: ExecutorContext) -> dict[str, Executor]:
    cfg = ctx.config.coordinator
    checkpoint_restart = CheckpointRestart(
        publish=ctx.publish,
        state=ctx.state,
        acks=ctx.acks,
        scheduler=ctx.scheduler,
        job_moved=ctx.job_moved,
        save_deadline_s=cfg.save_deadline_s,
        stop_deadline_s=cfg.stop_deadline_s,
        save_rank_lost_grace_s=cfg.save_rank_lost_grace_s,
        stop_margin_s=cfg.interruption_stop_margin_s,
        last_will_grace_s=cfg.offline_grace.last_will_s,
        save_step_margin=cfg.save_step_margin,
        save_step_lead_s=cfg.save_step_lead_s,
        resume_deadline_s=cfg.resume_deadline_s,
        restart_deadline_s=cfg.restart_deadline_s,
        persist=ctx.save_action,
        allow_unchecked_spares=cfg.restart_unchecked_spares,
        pinned_policy=cfg.pinned_jobs,
    )
    if ctx.scheduler is not None and ctx.scheduler.name == "slurm" and cfg.slurm.clientless.enabled:
        checkpoint_restart.clientless = clientless_fallback(cfg.slurm)
    executors: dict[str, Executor] = {
        ActionKind.CHECKPOINT_RESTART: checkpoint_restart,
        ActionKind.CHECKPOINT: checkpoint_restart,  # save only: the executor skips stop and requeue
        ActionKind.GPU_RESET: GpuReset(
            send=ctx.send_to_node,
            acks=ctx.acks,
            deadline_s=cfg.gpu_reset_deadline_s,
            scheduler=ctx.scheduler,
            state=ctx.state,
            retry_s=cfg.gpu_reset_retry_s,
            retry_backoff_s=cfg.gpu_reset_backoff_s,
            reboot_deadline_s=cfg.gpu_reboot_deadline_s,
        ),
        ActionKind.COLLECT_DIAGNOSTICS: CollectDiagnostics(
            send=ctx.send_to_node, state=ctx.state, acks=ctx.acks, deadline_s=cfg.diagnostics_deadline_s
        ),
        ActionKind.DIAGNOSE_HANG: DiagnoseHang(
            send=ctx.send_to_node,
            state=ctx.state,
            acks=ctx.acks,
            deadline_s=cfg.hang_evidence_deadline_s,
            emit=ctx.emit_event,
            unclear=cfg.hang_unclear,
        ),
    }
    executors[ActionKind.NOTIFY] = Notify(cfg.notify, ctx.state)  # without a webhook: the log
    # Return to service (ftd.coordinator.upkeep.return_service): the node's agent runs its preflight checks.
    executors[PREFLIGHT] = Preflight(
        send=ctx.send_to_node,
        acks=ctx.acks,
        deadline_s=cfg.return_to_service.preflight_deadline_s,
        refuse=ctx.state.inventory.refuses_preflight,  # version drift, when it fails preflight (#36)
    )
    # Issue #36: a drained or new node's burn-in; a node drained for repair gets its bundle.
    executors[BURN_IN] = BurnIn(
        send=ctx.send_to_node,
        acks=ctx.acks,
        deadline_s=cfg.return_to_service.burn_in_deadline_s,
        pair_peer=partial(burn_in_peer, ctx.state, cfg.fabric.port) if cfg.fabric.enabled else None,
        pair_baseline=ctx.state.pairs.baseline,
        pair_rtt_baseline=ctx.state.pairs.rtt_baseline,
    )
    if cfg.rma.enabled:
        executors[RMA_BUNDLE] = RmaBundle(
            send=ctx.send_to_node,
            acks=ctx.acks,
            deadline_s=cfg.rma.deadline_s,
            kmsg_window_s=cfg.rma.kmsg_window_s,
            bug_report_timeout_s=cfg.rma.bug_report_timeout_s,
            state=ctx.state,
        )
    # Pair tests (issue #35): a node's agent tests the pair it forms with an idle peer.
    pair_test = PairTest(
        send=ctx.send_to_node,
        acks=ctx.acks,
        state=ctx.state,
        hardware=ctx.config.hardware,
        port=cfg.fabric.port,
        deadline_s=cfg.fabric.deadline_s,
    )
    executors[PAIR_TEST] = pair_test
    if cfg.fabric.enabled and cfg.fabric.test_spares:  # a spare tested against the job's nodes first
        checkpoint_restart.in_allocation.spare_tests = SpareTests(
            pair_test, peers=cfg.fabric.spare_test_peers, busy_wait_s=cfg.fabric.spare_busy_wait_s
        )
    if ctx.scheduler is not None:
        executors[ActionKind.DRAIN_NODE] = DrainNode(ctx.scheduler, ctx.state)
        executors[ActionKind.RESUME_NODE] = ResumeNode(ctx.scheduler, ctx.state)
    return executors


def clientless_fallback(slurm: SlurmConfig) -> SlurmSignalFallback:
    """checkpoint_restart's way to move a Slurm job that has no rank registered (no ftd.client)."""
    cl = slurm.clientless
    return SlurmSignalFallback(
        slurm_conf=slurm.slurm_conf,
        scancel=cl.scancel,
        scontrol=slurm.scontrol,
        signal=cl.signal,
        mode=cl.mode,
        partition_modes={p.name: p.mode for p in cl.partitions},
        grace_s=cl.grace_s,
        poll_s=cl.poll_s,
        timeout_s=slurm.timeout_s,
    )


class BuiltinExecutors:
    """The built-in executors as a plugin (registered by the coordinator as ``builtin_executors``)."""

    plugin_name = "builtin_executors"

    def __init__(self, ctx: ExecutorContext) -> None:
        self._ctx = ctx

    @hookimpl
    def ftd_register_actions(self) -> dict[str, Executor]:
        return build_executors(self._ctx)
