"""What to do with a job that must leave a node it is pinned to (issue #31, item 3): a pure decision.

A restart asks to requeue a job *excluding* its bad nodes. A job pinned to one of them (Slurm's
``ReqNodeList``: ``sbatch -w`` / ``--nodelist``) can never run anywhere else, and excluding the node
would leave it pending forever (BadConstraints), so that exclusion is refused. What happens next
depends on the node:

* **wait** -- every pinned node being left is out of service (drained or down: the rule's drain, an
  operator's, a node that died). The job is requeued without the exclusion and waits, pending, for
  the node to return to service: the scheduler will not start it there before.
* otherwise the node stays *in service* with a condition that moves jobs without draining it (a full
  local filesystem): a requeue would start the job on the same node again at once, meet the same
  condition and be stopped again -- a loop of saves and restarts. Instead, by
  ``coordinator.pinned_jobs``:

  - **hold** (the default, when the scheduler can hold jobs: Slurm) -- the job, saved and stopped, is
    requeued *held* (``scontrol requeuehold``) and ftd releases it (``scontrol release``) once the
    kinds of the node's active conditions when it was held are gone
    (:mod:`ftd.coordinator.upkeep.pinned_holds`); with no condition to wait for, it stays held for
    an operator to release;
  - **stop** -- the job is saved and stopped and not requeued: the operator resubmits it.

  A scheduler that cannot hold jobs (Kubernetes) stops instead of holding, and so does a hold the
  scheduler refuses (a ``--no-requeue`` job, an outage: :func:`stop_instead`, the error in the
  sentence). On Kubernetes a requeue's
  exclusion cordons and taints the node itself (node-wide, ``ftd.coordinator.actions.kubernetes``),
  so a pod pinned there through the scheduler (a node selector or affinity on its hostname) waits
  Pending until the node is resumed: it cannot loop. (A template's ``spec.nodeName`` bypasses the
  scheduler, and the kubelet admits such a pod on a cordoned, NoSchedule-tainted node: not covered,
  the operator's guide says so.) Its scheduler reports no pinned nodes; this decision treats a job
  whose pins a scheduler does report exactly as it treats a Slurm job.

Each outcome carries one sentence saying what really happens (logged, kept in the action's
``detail["pinned"]`` and notified), never "waits for the node to return to service" for a node that
never left it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from ftd.config.schema import PINNED_JOB_POLICIES

__all__ = ["DEFAULT_PINNED_POLICY", "PINNED_JOB_POLICIES", "PinnedMove", "decide_pinned", "stop_instead"]

DEFAULT_PINNED_POLICY = "hold"

Outcome = Literal["requeue", "wait", "hold", "stop"]


@dataclass(frozen=True, slots=True)
class PinnedMove:
    """The decision for one requeue: ``requeue`` (not pinned to a node being left: as asked),
    ``wait``, ``hold`` or ``stop`` (module docstring); ``nodes`` the pinned nodes being left, ``keep``
    the exclusions that stay (the others), ``why`` the sentence (empty for ``requeue``); for ``hold``
    and ``stop``, ``situation`` its first half and ``stays`` the pinned nodes in service (what
    :func:`stop_instead` builds on)."""

    action: Outcome
    nodes: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    why: str = ""
    situation: str = ""
    stays: tuple[str, ...] = ()


def decide_pinned(
    job: str,
    *,
    exclude: Sequence[str],
    required: Sequence[str],
    out_of_service: Mapping[str, str | None],
    conditions: Mapping[str, Sequence[str]],
    policy: str,
    can_hold: bool,
    stopped: bool = True,
) -> PinnedMove:
    """The move for ``job`` asked to leave ``exclude`` while pinned to ``required``.

    ``out_of_service``: for each node, why it is out of service (drained, down) or None when it is in
    service; a node missing from it counts as in service (the scheduler could not say: holding or
    stopping is safe, a requeue onto it might loop). ``conditions``: each node's active critical
    conditions (its agent's reasons), named in the sentence and what a hold waits for."""
    pinned = tuple(sorted(set(exclude) & set(required)))
    keep = tuple(n for n in exclude if n not in pinned)
    if not pinned:
        return PinnedMove("requeue", keep=keep)
    names = ", ".join(pinned)
    head = f"job {job} is pinned to {', '.join(sorted(set(required)))} (sbatch -w / --nodelist)"
    in_service = [n for n in pinned if not out_of_service.get(n)]
    if not in_service:
        outs = "; ".join(f"{n}: {out_of_service[n]}" for n in pinned)
        why = (
            f"{head} and {names} is out of service ({outs}): ftd requeued it without excluding "
            f"{names} (that would leave it pending forever) and it waits for {names} to return to "
            "service; resubmit it without the pin to let it run elsewhere"
        )
        return PinnedMove("wait", pinned, keep, why)
    stays = ", ".join(in_service)
    known = [c for n in in_service for c in conditions.get(n, ())]
    what = "; ".join(known) if known else "a condition that moves jobs"
    head = f"{head} and {stays} stays in service with {what}: a requeue would start it there again at once"
    held = PinnedMove("hold", pinned, keep, situation=head, stays=tuple(in_service))
    if policy == "hold" and can_hold:
        if known:
            release = f"ftd releases it when those conditions clear on {stays}"
        else:
            release = "ftd cannot tell when that clears: it stays held until someone releases it"
        why = (
            f"{head}, so ftd stopped it and requeued it held; {release} "
            f"(`scontrol release {job}` releases it now; resubmit without the pin to run it elsewhere)"
        )
        return replace(held, why=why)
    instead = "" if policy == "stop" else "this scheduler cannot hold a job"
    return stop_instead(held, instead, stopped=stopped)


def stop_instead(move: PinnedMove, instead: str = "", *, stopped: bool = True) -> PinnedMove:
    """``move`` (a hold or a stop) as a stop: the job is not requeued; ``instead`` says why it is not
    held (the scheduler cannot hold, the hold failed; empty: the policy asked for a stop);
    ``stopped``: whether ftd's stop reached the job."""
    stays = ", ".join(move.stays)
    why_not = f" ({instead})" if instead else ""
    if stopped:
        done = f"so ftd stopped it and did not requeue it{why_not}"
    else:
        done = (
            f"so ftd did not requeue it{why_not}, but no rank of it answered ftd's stop: it may still "
            f"be running on {stays}; cancel it"
        )
    why = (
        f"{move.situation}, {done}; resubmit it once {stays} is fixed, or without the pin to run it elsewhere"
    )
    return replace(move, action="stop", why=why)
