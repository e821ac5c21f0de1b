"""Executors: the only code that acts on the world (scheduler, bus directives, webhooks, ...).

:func:`build_executors` assembles the built-in executors for a coordinator from its configuration;
rule plugins may add more through the ``ftd_register_actions`` hook.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ftd.config import Config
from ftd.coordinator.acks import AckBook
from ftd.coordinator.actions.drain import DrainNode, ResumeNode
from ftd.coordinator.actions.scheduler import Scheduler
from ftd.coordinator.actions.trainer import CheckpointRestart
from ftd.coordinator.hookspecs import Executor
from ftd.coordinator.model import ActionKind
from ftd.coordinator.state import ClusterState


@dataclass(frozen=True)
class ExecutorContext:
    """Everything an executor may use: configuration, state, the bus (publish only), the scheduler."""

    config: Config
    state: ClusterState
    acks: AckBook
    publish: Callable[[str, bytes], Awaitable[None]]
    scheduler: Scheduler | None


def build_executors(ctx: ExecutorContext) -> dict[str, Executor]:
    cfg = ctx.config.coordinator
    executors: dict[str, Executor] = {
        ActionKind.CHECKPOINT_RESTART: CheckpointRestart(
            publish=ctx.publish,
            state=ctx.state,
            acks=ctx.acks,
            scheduler=ctx.scheduler,
            save_deadline_s=cfg.save_deadline_s,
            stop_deadline_s=cfg.stop_deadline_s,
        ),
    }
    if ctx.scheduler is not None:
        executors[ActionKind.DRAIN_NODE] = DrainNode(ctx.scheduler, ctx.state)
        executors[ActionKind.RESUME_NODE] = ResumeNode(ctx.scheduler, ctx.state)
    return executors
