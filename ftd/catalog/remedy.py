"""What ftd does about an Xid: one table from NVIDIA's bucket to ftd's plan, read by the rule and by
``ftd xid explain`` alike (so the explanation and the decision cannot drift apart).

============================  =======  ========  =============================================================
bucket                        plan     hardware  what ftd does
============================  =======  ========  =============================================================
RESTART_APP                   restart  no        checkpoint_restart of the job in place (rule ``app_faults``
                                                 policy: crash-loop backoff, then notify, no more restarts)
XID_154_EVAL                  restart  no        same (unless an Xid 154 announces another action)
RESET_GPU                     reset    yes       checkpoint_restart excluding the node, then gpu_reset after
                                                 the save (refused: asked again; impossible: scheduler
                                                 reboot, then drain for RMA if the GPU is still bad)
WORKFLOW_NVLINK_ERR           reset    yes       same
WORKFLOW_XID_48               reset    yes       same; drain_node when Xid 63/64 is in the same incident
WORKFLOW_NVLINK5_ERR          nvlink5  decoded   fatal (the message says Fatal, or Xid 150): reset; non-fatal:
                                                 notify
RESTART_BM, RESTART_VM,       drain    yes       checkpoint_restart excluding the node, then drain_node
CHECK_MECHANICALS                                (reboot or hands-on service)
XID_154                       -        -         the recovery action the driver announces (``data.action``)
CONTACT_SUPPORT, UPDATE_SWFW, notify   no        notify (a human looks; an unexpected code alone drains
CHECK_UVM, unknown code                          nothing)
IGNORE, WORKFLOW_XID_45       none     no        nothing (recorded; a follow-on's cause is acted on)
============================  =======  ========  =============================================================

``hardware`` is what the repeat-offender rule counts: only an incident that implicates the GPU or
node (plan reset or drain) makes a node a repeat offender; application faults never do.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ftd.catalog import ACTIONS, XidCatalog, load_xid_catalog

__all__ = [
    "PLANS",
    "BucketPlan",
    "Remedy",
    "bucket_plan",
    "nvlink5_fatal",
    "resolve_xid",
]

RESTART, RESET, DRAIN, NOTIFY, NONE = "restart", "reset", "drain", "notify", "none"


@dataclass(frozen=True)
class BucketPlan:
    """ftd's plan for one NVIDIA bucket."""

    plan: str  # restart | reset | drain | notify | none | nvlink5 | announce
    implicates_hardware: bool
    does: str  # what ftd does, in words (``ftd xid explain`` prints it)


_RESET_TEXT = (
    "checkpoint_restart of the node's jobs excluding the node, then gpu_reset of the GPU after the save "
    "(a refused reset is asked again once the GPU is free; a reset that cannot be done: reboot through "
    "the scheduler, then drain for RMA if the GPU is still bad)"
)
_DRAIN_TEXT = "checkpoint_restart of the node's jobs excluding the node, then drain_node (reboot / service)"

PLANS: Mapping[str, BucketPlan] = {
    "RESTART_APP": BucketPlan(
        RESTART,
        False,
        "checkpoint_restart of the job in place, the node stays in service (rule app_faults: crash-loop "
        "backoff; after the limit of restarts of the same fault: notify and stop restarting); never drains",
    ),
    "XID_154_EVAL": BucketPlan(
        RESTART, False, "as RESTART_APP unless an Xid 154 announces another recovery action"
    ),
    "RESET_GPU": BucketPlan(RESET, True, _RESET_TEXT),
    "WORKFLOW_NVLINK_ERR": BucketPlan(RESET, True, _RESET_TEXT),
    "WORKFLOW_XID_48": BucketPlan(
        RESET,
        True,
        f"{_RESET_TEXT}; drain_node instead when Xid 63/64 comes in the same incident",
    ),
    "WORKFLOW_NVLINK5_ERR": BucketPlan(
        "nvlink5",
        True,
        "decoded per message: a fatal NVLink5 error (the message says Fatal, or Xid 150) gets "
        f"{_RESET_TEXT}; a non-fatal one a notify",
    ),
    "RESTART_BM": BucketPlan(DRAIN, True, _DRAIN_TEXT),
    "RESTART_VM": BucketPlan(DRAIN, True, _DRAIN_TEXT),
    "CHECK_MECHANICALS": BucketPlan(DRAIN, True, _DRAIN_TEXT),
    "XID_154": BucketPlan(
        "announce", False, "follows the recovery action the driver announces; none announced: nothing"
    ),
    "CONTACT_SUPPORT": BucketPlan(
        NOTIFY, False, "notify: a human looks (an unexpected code alone drains nothing)"
    ),
    "UPDATE_SWFW": BucketPlan(NOTIFY, False, "notify: update driver and firmware"),
    "CHECK_UVM": BucketPlan(NOTIFY, False, "notify: reset the GPU by hand if UVM or vGPU is in use"),
    "IGNORE": BucketPlan(NONE, False, "nothing: recorded in the ledger only"),
    "WORKFLOW_XID_45": BucketPlan(
        NONE, False, "nothing: a follow-on of another Xid, whose own plan runs (recorded only)"
    ),
}
_UNKNOWN = BucketPlan(NOTIFY, False, "notify: a code ftd does not know (no drain on it alone)")

#: Xid codes that, in the same incident as an Xid 48, turn its reset into a drain (NVIDIA's workflow).
XID_48_ESCALATORS = frozenset({63, 64})


def bucket_plan(bucket: str) -> BucketPlan:
    """ftd's plan for a bucket (unknown buckets: notify)."""
    return PLANS.get(bucket, _UNKNOWN)


_FATAL_WORD = re.compile(r"(?<![-\w])fatal\b", re.IGNORECASE)
_NONFATAL_WORD = re.compile(r"\bnon-?fatal\b", re.IGNORECASE)


def nvlink5_fatal(code: int, data: Mapping[str, Any]) -> bool | None:
    """Whether an NVLink5 Xid (144-150) is fatal: Xid 150 always; else the parser's
    ``extra.fatal`` / ``data.fatal``, else the message's own word (``Fatal`` / ``Nonfatal``);
    None when nothing says."""
    if code == 150:
        return True
    extra = data.get("extra")
    for where in (extra if isinstance(extra, dict) else {}, data):
        value = where.get("fatal")
        if isinstance(value, bool):
            return value
    message = data.get("message")
    if isinstance(message, str):
        if _NONFATAL_WORD.search(message):
            return False
        if _FATAL_WORD.search(message):
            return True
    return None


@dataclass(frozen=True)
class Remedy:
    """What ftd does about one Xid event."""

    code: int
    name: str
    bucket: str  # the resolved bucket (Xid 154: the announced one)
    plan: str  # restart | reset | drain | notify | none
    implicates_hardware: bool
    why: str  # words for the reason text ("nvlink5 fatal", "announced by xid 154", ...)


def resolve_xid(code: int, data: Mapping[str, Any], catalog: XidCatalog | None = None) -> Remedy:
    """The plan for Xid ``code`` with the event's ``data`` (the single decision table).

    Only two things in ``data`` matter: the recovery action an Xid 154 announces (``action``) and,
    for NVLink5 codes, whether the message is fatal; the answer for the packaged catalog is cached on
    those (rules ask for every Xid in a node's history)."""
    info = (catalog or load_xid_catalog()).lookup(code)
    bucket = info.action if info else "UNKNOWN"
    announced = data.get("action") if bucket in ("XID_154", "XID_154_EVAL") else None
    fatal = nvlink5_fatal(code, data) if bucket == "WORKFLOW_NVLINK5_ERR" else None
    key = (code, announced if isinstance(announced, str) else None, fatal)
    if catalog is None:
        return _resolve_cached(*key)
    return _resolve(catalog, *key)


@functools.lru_cache(maxsize=1024)
def _resolve_cached(code: int, announced: str | None, fatal: bool | None) -> Remedy:
    return _resolve(load_xid_catalog(), code, announced, fatal)


def _resolve(catalog: XidCatalog, code: int, announced: str | None, fatal: bool | None) -> Remedy:
    info = catalog.lookup(code)
    name = info.name if info else ""
    bucket = info.action if info else "UNKNOWN"
    why = ""
    if bucket in ("XID_154", "XID_154_EVAL"):
        quiet = ("XID_154", "XID_154_EVAL")
        if announced is not None and announced in ACTIONS and announced not in quiet:
            bucket, why = announced, f"announced {announced}"
        elif bucket == "XID_154":
            return Remedy(code, name, bucket, NONE, False, "no recovery action announced")
    entry = bucket_plan(bucket) if info or why else _UNKNOWN
    plan = entry.plan
    hardware = entry.implicates_hardware
    if plan == "nvlink5":
        plan, hardware = (RESET, True) if fatal else (NOTIFY, False)
        why = "nvlink5 fatal" if fatal else "nvlink5 non-fatal" if fatal is False else "nvlink5 not decoded"
    elif plan == "announce":
        plan, hardware = NONE, False
    return Remedy(code, name, bucket, plan, hardware, why)
