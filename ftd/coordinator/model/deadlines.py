"""How long an action of each kind may run before it counts as stuck.

What: :func:`stuck_after_s` sums the deadlines an action's phases are given in the coordinator's
configuration (a checkpoint_restart: its save, its stop, the start of a new generation inside the
allocation and, when the job is followed after its restart, the resume watch), plus a margin for the
scheduler and bus calls between them. Past that time an action that is still running has lost track
of something: the ``ftd_actions_stuck`` gauge counts it, the FtdActionStuck alert fires, and the
operator looks at ``ftd actions show``.

Why here: the executors enforce each phase's own deadline; this is the outside view of all of them
together, in one place, so the metrics and the operator's tools agree on what "stuck" means.
"""

from __future__ import annotations

from ftd.config.schema import CoordinatorConfig
from ftd.plugin.actions import ActionKind

#: Time between and around phases (scheduler calls, bus round trips, retries).
MARGIN_S = 120.0
#: Actions with no phase deadline of their own (drain, resume, notify, a plugin's kinds): their
#: executors make a few bounded calls with retries.
DEFAULT_S = 600.0


def stuck_after_s(kind: str, cfg: CoordinatorConfig) -> float:
    """Seconds an action of ``kind`` may run before it is stuck (see the module docstring)."""
    if cfg.stuck_after_s is not None:  # the operator's own bound, for every kind
        return cfg.stuck_after_s
    if kind in (ActionKind.CHECKPOINT_RESTART, ActionKind.CHECKPOINT):
        after = cfg.restart_deadline_s + cfg.resume_deadline_s
        restart = after if kind == ActionKind.CHECKPOINT_RESTART else 0.0
        return cfg.save_deadline_s + cfg.stop_deadline_s + restart + MARGIN_S
    if kind == ActionKind.GPU_RESET:
        return cfg.gpu_reset_deadline_s + cfg.return_to_service.preflight_deadline_s + MARGIN_S
    if kind == ActionKind.COLLECT_DIAGNOSTICS:
        return cfg.diagnostics_deadline_s + MARGIN_S
    if kind == ActionKind.DIAGNOSE_HANG:
        return cfg.hang_evidence_deadline_s + MARGIN_S
    return DEFAULT_S
