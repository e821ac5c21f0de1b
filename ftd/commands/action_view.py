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
- :func:`verdict_lines`: a ``diagnose_hang``'s verdict (issue #33): the sentence, the culprit, each
  piece of evidence with its source, who did not answer, the merged stack tree and where each node
  kept its raw files.

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
    for key in ("error", "policy", "not_resumed", "exclude_refused", "pinned", "why", "escalation", "note"):
        value = detail.get(key)
        if value:
            if key == "escalation" and isinstance(value, str):
                return ESCALATIONS.get(value, f"escalated: {value}")
            return sentence(value)
    undelivered = detail.get("undelivered")
    if isinstance(undelivered, list) and undelivered:
        return "; ".join(
            f"{u.get('destination')}: {u.get('error')}" for u in undelivered if isinstance(u, dict)
        )
    if detail.get("save_missing") or detail.get("save_failed"):
        missing, failed = detail.get("save_missing") or [], detail.get("save_failed") or {}
        return f"save: no ack from ranks {missing}, failed {failed}"
    return ""


#: What a GPU reset's ``detail["escalation"]`` words mean (:mod:`ftd.coordinator.actions.gpu_reset`).
ESCALATIONS = {
    "reboot": "the reset did not clear the fault, so ftd asked the scheduler to reboot the node",
    "drain": "the reset did not clear the fault, so ftd drained the node",
    "reboot+drain": "the fault was still there after the reboot, so ftd drained the node for repair",
}


def sentence(value: Any) -> str:
    """A detail's value as words for one line: a record's own ``why`` sentence (the exclusion a
    pinned job refused, a hold), ``key value`` pairs otherwise; never a Python ``repr``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        said = value.get("why")
        if isinstance(said, str) and said:
            return said
        pairs = [(k, v) for k, v in value.items() if v not in (None, "")]
        return "; ".join(f"{k.replace('_', ' ')} {sentence(v)}" for k, v in pairs)
    if isinstance(value, list | tuple):
        return ", ".join(sentence(v) for v in value)
    return str(value)


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


def verdict_lines(action: dict[str, Any]) -> list[str]:
    """A diagnose_hang's verdict as lines ([] for any other action, or before the verdict)."""
    detail = _detail(action)
    verdict = detail.get("verdict")
    if not isinstance(verdict, dict):
        return []
    sure = "confident" if verdict.get("confident") else "not confident"
    lines = [f"{verdict.get('kind')} ({sure}): {verdict.get('why')}"]
    if verdict.get("culprit_nodes") or verdict.get("culprit_ranks"):
        nodes = ", ".join(str(n) for n in verdict.get("culprit_nodes") or []) or "-"
        ranks = ", ".join(str(r) for r in verdict.get("culprit_ranks") or []) or "-"
        lines.append(f"culprit nodes {nodes}; ranks {ranks}")
    for item in verdict.get("evidence") or []:
        if isinstance(item, dict):
            where = " ".join(f"{k} {item[k]}" for k in ("node", "rank") if item.get(k) is not None)
            side = "against" if item.get("against", True) else "clears"
            lines.append(f"  [{item.get('source')}] {side} {where or 'the job'}: {item.get('says')}")
    if verdict.get("unanswered"):
        lines.append("did not answer: " + ", ".join(str(u) for u in verdict["unanswered"]))
    for error in verdict.get("errors") or []:
        lines.append(f"  ! {error}")
    evidence = detail.get("node_evidence")
    if isinstance(evidence, dict):
        for node, ev in sorted(evidence.items()):
            if isinstance(ev, dict):
                kept = sum(len(r.get("files") or []) for r in ev.get("ranks") or [] if isinstance(r, dict))
                lines.append(f"raw files on {node}: {ev.get('path')} ({kept} files)")
    tree = detail.get("tree")
    if isinstance(tree, str) and tree:
        lines += ["merged stacks (main threads):", *("  " + line for line in tree.splitlines())]
    return lines
