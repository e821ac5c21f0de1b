"""How the CLI shows one action: its phase, the ranks' acks, its deadline and why it ended as it did.

What: pure functions over the API's JSON (``ActionOut``, ``JobOut``, ``/v1/summary``'s
``deadlines``), shared by ``ftd status`` and ``ftd actions``:

- :func:`phase`: the phase under way (``detail.phase``, set by the engine at each phase), else
  the last one done;
- :func:`acks`: ranks that acked the save / ranks asked (``detail.saved`` with ``save_missing``
  and ``save_failed`` once the save is over; ``?/N`` while it is waiting, N the job's ranks);
- :func:`deadline`: when a running action counts as stuck (the coordinator's ``deadlines``);
- :func:`why`: the failure, suppression, escalation or log-only reason, one line;
- :func:`state_text`: ``running: <what it waits for>`` or the state;
- :func:`resumed_from`: the checkpoint a restart resumes from, its level and why (issue #34).

Why one module: the two commands must agree on what they show.
"""

from __future__ import annotations

import time
from typing import Any

IN_FLIGHT = ("pending", "running", "awaiting_approval")
TROUBLE = ("failed", "escalated")
JOB_KINDS = ("checkpoint_restart", "checkpoint")


def _detail(action: dict[str, Any]) -> dict[str, Any]:
    detail = action.get("detail")
    return detail if isinstance(detail, dict) else {}


def phase(action: dict[str, Any]) -> str:
    detail = _detail(action)
    current = detail.get("phase")
    if isinstance(current, str) and current:
        return current
    done = detail.get("phases_done")
    return str(done[-1]) if isinstance(done, list) and done else "-"


def acks(action: dict[str, Any], jobs: dict[str, dict[str, Any]] | None = None) -> str:
    """``acked/expected`` for a save (a checkpoint or a restart's), ``-`` for other kinds."""
    if action.get("kind") not in JOB_KINDS:
        return "-"
    detail = _detail(action)
    saved = detail.get("saved")
    if isinstance(saved, dict):
        missing = detail.get("save_missing") or []
        failed = detail.get("save_failed") or {}
        return f"{len(saved)}/{len(saved) + len(missing) + len(failed)}"
    if detail.get("save_skipped"):
        return "skipped"
    job = (jobs or {}).get(str(action.get("target")))
    if action.get("state") in IN_FLIGHT and job is not None:
        live = action.get("acked")  # the coordinator's count while the save waits
        return f"{live if isinstance(live, int) else '?'}/{len(job.get('ranks') or [])}"
    return "-"


def deadline(action: dict[str, Any], deadlines: dict[str, float] | None = None) -> str:
    ts = (deadlines or {}).get(str(action.get("id")))
    if not isinstance(ts, int | float) or action.get("state") not in IN_FLIGHT:
        return "-"
    left = ts - time.time()
    when = time.strftime("%H:%M:%S", time.localtime(ts))
    return f"{when} (passed)" if left < 0 else f"{when} ({int(left)} s)"


def why(action: dict[str, Any]) -> str:
    """The one line that says why the action did not simply succeed ('' when it did)."""
    detail = _detail(action)
    for key in ("error", "policy", "not_resumed", "exclude_refused", "why", "escalation", "note"):
        value = detail.get(key)
        if value:
            return value if isinstance(value, str) else str(value)
    undelivered = detail.get("undelivered")
    if isinstance(undelivered, list) and undelivered:
        return "; ".join(
            f"{u.get('destination')}: {u.get('error')}" for u in undelivered if isinstance(u, dict)
        )
    if detail.get("save_missing") or detail.get("save_failed"):
        missing, failed = detail.get("save_missing") or [], detail.get("save_failed") or {}
        return f"save: no ack from ranks {missing}, failed {failed}"
    return ""


def state_text(action: dict[str, Any]) -> str:
    """The state, with what a running one is waiting for (a restart following its job)."""
    waiting = _detail(action).get("waiting")
    if action.get("state") == "running" and isinstance(waiting, str) and waiting:
        return f"running: {waiting}"
    return str(action.get("state"))


def running_text(action: dict[str, Any], jobs: dict[str, dict[str, Any]], deadlines: dict[str, float]) -> str:
    """``ftd status``'s state column: a running action with its phase, acks and deadline."""
    text = state_text(action)
    if action.get("state") != "running":
        return text
    parts = [f"phase {phase(action)}"]
    if (got := acks(action, jobs)) != "-":
        parts.append(f"acks {got}")
    if (due := deadline(action, deadlines)) != "-":
        parts.append(f"deadline {due}")
    return f"{text} ({', '.join(parts)})"


def resumed_from(action: dict[str, Any]) -> str:
    """``step 1200 (partner): why`` for a restart that chose a verified checkpoint; ``step 1200 (the
    save's acknowledgements)`` for one that did not; "" when the action has no resume step."""
    detail = _detail(action)
    chosen = detail.get("resume")
    if isinstance(chosen, dict) and chosen.get("step") is not None:
        return f"step {chosen['step']} ({chosen.get('level') or '?'}): {chosen.get('why') or ''}".rstrip(": ")
    if isinstance(chosen, dict):
        return f"no verified checkpoint: {chosen.get('why') or ''}".rstrip(": ")
    step = detail.get("resume_step")
    return f"step {step} (the save's acknowledgements)" if step is not None else ""
