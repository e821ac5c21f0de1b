"""Parsers of the clouds' interruption notices (issue #37): metadata-server bytes -> Interruptions.

What: one pure function per documented endpoint, each taking the response body (bytes, anything at
all), the time it was read and the limits, and returning a :class:`Parsed`: the interruptions it
announces (often none) or a one-word error reason. They never raise; the watcher
(:mod:`ftd.agent.watchers.cloud`) does the I/O, counts the errors and publishes the notices.

Why a gate here: a notice asks the coordinator to save (and maybe stop) the jobs on the node before
the deadline, so a bogus one costs real work. A deadline already past by more than ``past_slack_s``
or further ahead than ``max_ahead_s`` is refused (``deadline_past`` / ``deadline_far``), as are
bodies over ``max_body`` bytes, undecodable text and JSON of the wrong shape.

The payloads (as documented by each provider):

* AWS IMDS ``/latest/meta-data/spot/instance-action``: ``{"action": "terminate"|"stop"|"hibernate",
  "time": "<ISO 8601 UTC>"}`` (404 when none) -> ``aws_spot``, deadline = ``time``;
  ``/latest/meta-data/events/recommendations/rebalance``: ``{"noticeTime": "<ISO 8601 UTC>"}`` ->
  ``aws_rebalance``; a rebalance recommendation has no deadline of its own, so the deadline is
  ``noticeTime + rebalance_horizon_s`` (the site's guess, said so in ``detail``).
* GCP ``/computeMetadata/v1/instance/preempted``: ``TRUE`` / ``FALSE`` -> ``gcp_preempt``, deadline =
  first seen + 30 s (the documented preemption window; the body carries no time);
  ``/instance/maintenance-event``: ``NONE`` or an event name such as
  ``TERMINATE_ON_HOST_MAINTENANCE`` -> ``gcp_maintenance``, deadline = first seen + 60 s (the value
  changes 60 s before the maintenance).
* Azure ``/metadata/scheduledevents``: ``{"DocumentIncarnation": n, "Events": [{"EventId",
  "EventType", "EventStatus", "Resources": [...], "NotBefore": "<RFC 1123>", ...}]}`` ->
  ``azure_scheduled`` per ``Scheduled`` event of a known type naming this VM (or no VM),
  deadline = ``NotBefore``, ``ref`` = ``EventId``.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import json
import re
from dataclasses import dataclass
from typing import Any

from ftd.events import Interruption, InterruptionSource

__all__ = [
    "AZURE_EVENT_TYPES",
    "GCP_MAINTENANCE_WINDOW_S",
    "GCP_PREEMPT_WINDOW_S",
    "Limits",
    "Parsed",
    "parse_aws_rebalance",
    "parse_aws_spot",
    "parse_azure_scheduled",
    "parse_gcp_maintenance",
    "parse_gcp_preempted",
]

GCP_PREEMPT_WINDOW_S = 30.0
GCP_MAINTENANCE_WINDOW_S = 60.0
AWS_SPOT_ACTIONS = ("terminate", "stop", "hibernate")
AZURE_EVENT_TYPES = ("Preempt", "Reboot", "Redeploy", "Freeze", "Terminate")
_GCP_EVENT = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
_MAX_TEXT = 256  # longest string field copied into an Interruption


@dataclass(frozen=True, slots=True)
class Limits:
    """What makes a notice believable: a body no larger than ``max_body`` bytes and a deadline no
    earlier than ``now - past_slack_s`` and no later than ``now + max_ahead_s``."""

    max_body: int = 65536
    past_slack_s: float = 10.0
    max_ahead_s: float = 86400.0
    rebalance_horizon_s: float = 600.0


@dataclass(frozen=True, slots=True)
class Parsed:
    """The notices a body announces, or why it was refused (``error``: a snake_case reason)."""

    notices: tuple[Interruption, ...] = ()
    error: str = ""
    detail: str = ""


def _refuse(error: str, detail: str = "") -> Parsed:
    return Parsed(error=error, detail=detail[:_MAX_TEXT])


def _gate(deadline: float, now: float, limits: Limits) -> str:
    """The reason a deadline is not believable, or ``""``."""
    if deadline != deadline or deadline in (float("inf"), float("-inf")):
        return "bad_time"
    if deadline < now - limits.past_slack_s:
        return "deadline_past"
    if deadline > now + limits.max_ahead_s:
        return "deadline_far"
    return ""


def _iso_time(value: object) -> float | None:
    """Epoch seconds of an ISO 8601 UTC time (``2026-12-04T20:00:00Z``), else ``None``."""
    if not isinstance(value, str) or not 0 < len(value) <= 64:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:  # IMDS times are UTC; a zone-less one is read as UTC too
        parsed = parsed.replace(tzinfo=dt.UTC)
    try:
        return parsed.timestamp()
    except (OverflowError, OSError, ValueError):
        return None


def _rfc1123_time(value: object) -> float | None:
    """Epoch seconds of an RFC 1123 time (``Fri, 04 Dec 2026 20:05:00 GMT``), else ``None``."""
    if not isinstance(value, str) or not 0 < len(value) <= 64:
        return None
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    try:
        return parsed.timestamp()
    except (OverflowError, OSError, ValueError):
        return None


def _json(body: bytes, limits: Limits) -> tuple[Any, Parsed | None]:
    """The decoded JSON of ``body``, or the refusal."""
    if len(body) > limits.max_body:
        return None, _refuse("too_large", f"{len(body)} bytes")
    try:
        return json.loads(body.decode("utf-8")), None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return None, _refuse("malformed", str(exc))


def _text(body: bytes, limits: Limits) -> tuple[str, Parsed | None]:
    if len(body) > limits.max_body:
        return "", _refuse("too_large", f"{len(body)} bytes")
    try:
        return body.decode("ascii").strip(), None
    except UnicodeDecodeError as exc:
        return "", _refuse("malformed", str(exc))


def _one(
    source: InterruptionSource, deadline: float, now: float, limits: Limits, ref: str, detail: str
) -> Parsed:
    reason = _gate(deadline, now, limits)
    if reason:
        return _refuse(reason, f"{source} deadline {deadline!r} at {now!r}")
    notice = Interruption(source=source, deadline=deadline, notice_at=now, ref=ref[:_MAX_TEXT], detail=detail)
    return Parsed(notices=(notice,))


def parse_aws_spot(body: bytes, now: float, limits: Limits) -> Parsed:
    """``spot/instance-action`` -> one ``aws_spot`` interruption (deadline = its ``time``)."""
    doc, refused = _json(body, limits)
    if refused:
        return refused
    if not isinstance(doc, dict):
        return _refuse("malformed", "not a JSON object")
    action, when = doc.get("action"), doc.get("time")
    if action not in AWS_SPOT_ACTIONS:
        return _refuse("malformed", f"action {str(action)[:40]!r}")
    deadline = _iso_time(when)
    if deadline is None:
        return _refuse("bad_time", f"time {str(when)[:64]!r}")
    return _one("aws_spot", deadline, now, limits, f"{action}@{when}", f"spot {action}")


def parse_aws_rebalance(body: bytes, now: float, limits: Limits) -> Parsed:
    """``events/recommendations/rebalance`` -> one ``aws_rebalance`` interruption."""
    doc, refused = _json(body, limits)
    if refused:
        return refused
    if not isinstance(doc, dict):
        return _refuse("malformed", "not a JSON object")
    when = doc.get("noticeTime")
    notice = _iso_time(when)
    if notice is None:
        return _refuse("bad_time", f"noticeTime {str(when)[:64]!r}")
    if notice > now + limits.past_slack_s:
        return _refuse("deadline_far", f"noticeTime {when!r} is in the future")
    deadline = max(notice, now - limits.past_slack_s) + limits.rebalance_horizon_s
    detail = f"rebalance recommendation; no deadline of its own: notice + {limits.rebalance_horizon_s:g} s"
    return _one("aws_rebalance", deadline, now, limits, f"rebalance@{when}", detail)


def parse_gcp_preempted(body: bytes, now: float, limits: Limits) -> Parsed:
    """``instance/preempted``: ``TRUE`` -> one ``gcp_preempt`` (deadline now + 30 s), ``FALSE`` -> none."""
    text, refused = _text(body, limits)
    if refused:
        return refused
    if text == "FALSE":
        return Parsed()
    if text != "TRUE":
        return _refuse("malformed", f"preempted {text[:40]!r}")
    return _one(
        "gcp_preempt", now + GCP_PREEMPT_WINDOW_S, now, limits, "preempted", "preemption (30 s window)"
    )


def parse_gcp_maintenance(body: bytes, now: float, limits: Limits) -> Parsed:
    """``instance/maintenance-event``: ``NONE`` -> none, an event name -> one ``gcp_maintenance``."""
    text, refused = _text(body, limits)
    if refused:
        return refused
    if text == "NONE":
        return Parsed()
    if not _GCP_EVENT.fullmatch(text):
        return _refuse("malformed", f"maintenance-event {text[:40]!r}")
    return _one("gcp_maintenance", now + GCP_MAINTENANCE_WINDOW_S, now, limits, text, f"maintenance {text}")


def parse_azure_scheduled(body: bytes, now: float, limits: Limits, *, resource: str = "") -> Parsed:
    """Scheduled Events -> one ``azure_scheduled`` per ``Scheduled`` event of a known type whose
    ``Resources`` name ``resource`` (or that names no VM, or when ``resource`` is empty). An event
    already ``Started`` is not a notice any more; a malformed event refuses the whole document (the
    error names it) but the well-formed ones are still returned."""
    doc, refused = _json(body, limits)
    if refused:
        return refused
    if not isinstance(doc, dict) or not isinstance(doc.get("Events"), list):
        return _refuse("malformed", "no Events list")
    notices: list[Interruption] = []
    error, detail = "", ""
    for item in doc["Events"][:64]:
        if not isinstance(item, dict):
            error, detail = "malformed", "an event is not an object"
            continue
        event_id, kind, status = item.get("EventId"), item.get("EventType"), item.get("EventStatus")
        if not isinstance(event_id, str) or not event_id or len(event_id) > _MAX_TEXT:
            error, detail = "malformed", "an event without EventId"
            continue
        if kind not in AZURE_EVENT_TYPES or status != "Scheduled":
            continue  # another kind of event, or one already under way
        resources = item.get("Resources")
        if resource and isinstance(resources, list) and resources and resource not in resources:
            continue  # for another VM of the availability set
        deadline = _rfc1123_time(item.get("NotBefore"))
        if deadline is None:
            error, detail = "bad_time", f"{event_id}: NotBefore {str(item.get('NotBefore'))[:64]!r}"
            continue
        one = _one("azure_scheduled", deadline, now, limits, event_id, f"{kind}")
        if one.error:
            error, detail = one.error, f"{event_id}: {one.detail}"
        notices.extend(one.notices)
    return Parsed(notices=tuple(notices), error=error, detail=detail[:_MAX_TEXT])
