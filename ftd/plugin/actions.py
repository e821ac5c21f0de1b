"""The action model of the rule contract: what rules return and what the ledger records.

A rule never performs I/O; it returns :class:`ActionRequest` values. The engine passes each through
the policy gate and, if allowed, hands it to the executor registered for its ``kind``. The ``key``
(kind + target) is what dedupe and cooldown work on: two rules asking to drain the same node ask for
the same action.

Order: the requests a rule (or several rules) return for one event are run as one plan
(:mod:`ftd.coordinator.model.plan`): a job's save and stop (``checkpoint_restart``, ``checkpoint``) before
node actions (``gpu_reset``, ``drain_node``), those before the job's requeue. A rule just returns
them; it need not order them or say what depends on what.

Params the built-in executors honour (anything else is kept in the ledger as the rule's context):

==========================  ==========================================================================
kind                        params
==========================  ==========================================================================
``checkpoint_restart``      ``exclude`` (nodes the requeued job may not use), ``stop`` (false: save
                            only), ``delay_s`` (crash-loop backoff: wait this long after the stop
                            before the requeue), ``node`` (the faulty node: part of the cooldown key)
``checkpoint``              as above; ``stop`` defaults to false
``gpu_reset``               ``pci`` / ``uuid`` / ``index`` (the GPU); refused resets are retried, then
                            escalated to a reboot, then a drain (``coordinator.gpu_reset_*``)
``drain_node``              none (the reason is the request's ``reason``)
==========================  ==========================================================================
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec


class ActionKind(enum.StrEnum):
    DRAIN_NODE = "drain_node"
    RESUME_NODE = "resume_node"
    CHECKPOINT_RESTART = "checkpoint_restart"
    CHECKPOINT = "checkpoint"  # save without stopping: checkpoint_restart with params["stop"] = False
    GPU_RESET = "gpu_reset"
    NOTIFY = "notify"
    COLLECT_DIAGNOSTICS = "collect_diagnostics"
    DIAGNOSE_HANG = "diagnose_hang"  # a hung job's evidence from every node, the verdict (issue #33)

    @property
    def targets_job(self) -> bool:
        """True for kinds whose ``target`` is a job id (the others name a node)."""
        return self in _JOB_KINDS

    @classmethod
    def kind_targets_job(cls, kind: str) -> bool:
        """:attr:`targets_job` for any kind string; a plugin's own kinds target nodes."""
        try:
            return cls(kind).targets_job
        except ValueError:
            return False


_JOB_KINDS = frozenset({ActionKind.CHECKPOINT_RESTART, ActionKind.CHECKPOINT, ActionKind.DIAGNOSE_HANG})


class ActionState(enum.StrEnum):
    PENDING = "pending"  # allowed, recorded, not started yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    ESCALATED = "escalated"  # finished, but not as planned (e.g. a rank never acked its save)
    FAILED = "failed"
    SUPPRESSED = "suppressed"  # stopped by the policy gate; ``detail`` says why
    DRY_RUN = "dry_run"  # would have run; dry-run mode recorded it instead
    AWAITING_APPROVAL = "awaiting_approval"  # held for a human: Engine.approve / Engine.reject
    # finished, but only written to the coordinator's log: a notify with no destination to send to
    # (terminal like succeeded; never retried)
    LOGGED = "logged"

    @property
    def finished(self) -> bool:
        return self not in (ActionState.PENDING, ActionState.RUNNING, ActionState.AWAITING_APPROVAL)


class ActionRequest(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    target: str  # a node name for node actions, a job id for job actions
    reason: str
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    rule: str = ""  # filled in by the engine with the proposing rule's name
    event_id: str | None = None

    @property
    def targets_job(self) -> bool:
        return ActionKind.kind_targets_job(self.kind)

    @property
    def key(self) -> str:
        """What dedupe works on: one action of a kind per target at a time. A notification is also
        per rule: one rule's message (a hot GPU) must not hold back another's (a crash loop)."""
        if self.kind == ActionKind.NOTIFY and self.rule:
            return f"{self.kind}:{self.target}:{self.rule}"
        return f"{self.kind}:{self.target}"

    @property
    def cooldown_key(self) -> str:
        """What cooldown works on. For a job action caused by a node's fault it names that node too:
        another fault on the same bad node is not acted on twice, but a fault on a *different* node of
        the requeued job is a new reason to act, however soon it comes."""
        node = self.params.get("node")
        if self.targets_job and isinstance(node, str) and node:
            return f"{self.key}@{node}"
        return self.key


class ActionRecord(msgspec.Struct, kw_only=True):
    id: str
    request: ActionRequest
    state: ActionState
    detail: dict[str, Any] = msgspec.field(default_factory=dict)
    created: float = 0.0
    updated: float = 0.0
