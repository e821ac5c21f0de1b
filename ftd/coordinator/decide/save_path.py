"""Never ask a job to save onto a filesystem that cannot take the save (issue #23).

What: :func:`guard` looks at every job request (``checkpoint_restart``, ``checkpoint``) before the
policy gate. When the job's save would land on a filesystem that is read-only, full or unresponsive
(:func:`ftd.plugin.save_path.save_trouble`: the job's ranks' registered ``checkpoint_dir`` under
the event's mount, or the agent naming the job in the event), it rewrites the request:

* every rank declared the same ``fallback_checkpoint_dir`` and that one is not in trouble: the save
  goes there (``params["save_path"]``, relayed in the save directive, ``Client.save_path``);
* else: no save (``params["save"] = False``, ``params["no_save_reason"]``): a ``checkpoint_restart``
  stops the job at once and requeues it (it resumes from its last checkpoint); a save-only
  ``checkpoint`` asks nothing of the job.

Either way the reason says so, so the ledger, ``ftd status`` and ``ftd rules test`` show it. A shared
filesystem's outage seen on any node pauses saves of every job on it, until its ``recovered``
events come. Why before the gate: manual actions (``ftd restart``) go through here too.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ftd.coordinator.model.state import ClusterState
from ftd.plugin.actions import ActionKind, ActionRequest
from ftd.plugin.save_path import save_trouble, trouble_under

__all__ = ["guard"]

_SAVES = frozenset({ActionKind.CHECKPOINT_RESTART, ActionKind.CHECKPOINT})


def guard(request: ActionRequest, state: ClusterState, now: float) -> ActionRequest:
    """``request`` as it may run: unchanged, saving to the fallback, or without a save."""
    if request.kind not in _SAVES or request.params.get("save") is False:
        return request
    job = request.target
    record = state.jobs.get(job)
    infos = [r for rs in record.ranks_by_node.values() for r in rs] if record else []
    dirs = sorted({r.checkpoint_dir for r in infos if r.checkpoint_dir})
    trouble = save_trouble(state, job, now, dirs)
    if trouble is None:
        return request
    fallbacks = {r.fallback_checkpoint_dir for r in infos}
    fallback = next(iter(fallbacks)) if len(fallbacks) == 1 else None
    if fallback and trouble_under(state, job, fallback, now) is None:
        why = (
            f"the checkpoint directory of job {job} is unusable ({trouble.text}): "
            f"saving to its fallback {fallback}"
        )
        params: dict[str, Any] = {**request.params, "save_path": fallback, "save_path_reason": why}
        return msgspec.structs.replace(request, reason=f"{request.reason}; {why}", params=params)
    stop = request.kind == ActionKind.CHECKPOINT_RESTART and request.params.get("stop", True) is not False
    then = (
        "stopped without a save: it resumes from its last checkpoint"
        if stop
        else "no save asked (the job keeps training)"
    )
    why = f"no save: the checkpoint directory of job {job} is unusable ({trouble.text}); {then}"
    params = {**request.params, "save": False, "no_save_reason": why, "save_trouble": trouble.state}
    return msgspec.structs.replace(request, reason=f"{request.reason}; {why}", params=params)
