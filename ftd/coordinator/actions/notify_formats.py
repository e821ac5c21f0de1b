"""The bodies a ``notify`` posts: ftd's generic JSON, a Slack-compatible message, an Alertmanager alert.

What: :func:`summary` gathers the facts of one notification (action, target, node, job, reason,
rule, event, severity) once; :func:`render` shapes them for a destination's ``format``:

- ``generic``: ftd's own document (``source``, ``action_id``, ``action``, ``target``, ``node``,
  ``job``, ``reason``, ``rule``, ``event_id``, ``event``, ``params``, ``ts``, ``severity``,
  ``drill``, ``text``), as it always was (plus ``severity`` and ``drill``: true for a rehearsal,
  ``ftd inject``);
- ``slack``: ``text`` (the fallback line every Slack/Mattermost incoming webhook shows) and
  ``blocks`` (a section with the message, a context line with node, job, rule and action id);
- ``alertmanager``: the JSON Alertmanager itself posts to webhook receivers (``version`` "4",
  ``status`` "firing", ``receiver``, ``groupKey``, ``groupLabels``, ``commonLabels``,
  ``commonAnnotations``, ``externalURL``, ``truncatedAlerts`` and one alert with ``labels``
  (``alertname`` ftd_<action>, ``severity``, ``node``, ``job``, ``rule``, ``source`` ftd, ``drill``
  "true" for a rehearsal),
  ``annotations`` (``summary``, ``description``), ``startsAt`` (RFC 3339), ``endsAt`` zero,
  ``generatorURL``, ``fingerprint``), so a site can point ftd at a receiver it already feeds
  from Alertmanager (a paging bridge, a ticket system).

Why a module of its own: the payloads are pure functions of one record, tested without a network;
the executor (:mod:`ftd.coordinator.actions.notify`) only chooses destinations and delivers.
"""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime
from typing import Any

from ftd.plugin.actions import ActionRecord

FORMATS = ("generic", "slack", "alertmanager")
SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2, "critical": 3}
DEFAULT_SEVERITY = "warning"
_ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's "no end yet"


def severity_of(record: ActionRecord) -> str:
    """``params.severity``, else the triggering event's (``params.event.severity``), else warning."""
    params = record.request.params
    event = params.get("event")
    for value in (params.get("severity"), event.get("severity") if isinstance(event, dict) else None):
        if isinstance(value, str) and value in SEVERITY_RANK:
            return value
    return DEFAULT_SEVERITY


def summary(record: ActionRecord, *, is_job: bool, now: float | None = None) -> dict[str, Any]:
    """ftd's generic notification document (the ``generic`` format). ``node`` is a node's name or
    null, never a job id: ``params.node`` when given, else the target unless it is a job (``is_job``:
    a job the state knows, or the one ``params.job`` names)."""
    req = record.request
    params = dict(req.params)
    target = req.target
    action = str(params.get("action") or req.kind)
    # A notification about a job names it in params.job; its target is then the job, never a node,
    # even when the job is not in the state any more (pending after ftd requeued it, ended).
    is_job = is_job or (isinstance(params.get("job"), str) and params.get("job") == target)
    return {
        "source": "ftd",
        "action_id": record.id,
        "action": action,
        "target": target,
        "node": params.get("node") or (None if is_job else target),
        "job": params.get("job") or (target if is_job else None),
        "reason": req.reason,
        "rule": req.rule,
        "event_id": req.event_id,
        "event": params.get("event"),
        "params": params,
        "ts": time.time() if now is None else now,
        "severity": severity_of(record),
        "drill": params.get("drill") is True,  # a rehearsal (ftd inject): the reason starts "drill:"
        "text": f"ftd: {action} {target}: {req.reason}",
    }


def slack(body: dict[str, Any]) -> dict[str, Any]:
    """A Slack-compatible incoming-webhook message (Mattermost reads ``text`` and ``blocks`` alike)."""
    facts = [f"*{k}* {body[k]}" for k in ("node", "job", "rule", "severity") if body.get(k)]
    if body.get("drill"):
        facts.insert(0, "*drill*")
    facts.append(f"action `{body['action_id']}`")
    return {
        "text": body["text"],
        "blocks": [
            {
                "type": "section",
                "text": {
                    "type": "mrkdwn",
                    "text": f"*ftd: {body['action']} {body['target']}*\n{body['reason']}",
                },
            },
            {"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(facts)}]},
        ],
    }


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def alertmanager(body: dict[str, Any], *, receiver: str = "ftd") -> dict[str, Any]:
    """Alertmanager's webhook payload (version 4) with one firing alert."""
    labels = {
        "alertname": f"ftd_{body['action']}",
        "severity": body["severity"],
        "source": "ftd",
        "target": body["target"],
    }
    for key in ("node", "job", "rule"):
        if body.get(key):
            labels[key] = str(body[key])
    if body.get("drill"):
        labels["drill"] = "true"
    annotations = {
        "summary": body["text"],
        "description": body["reason"],
        "action_id": body["action_id"],
    }
    if body.get("event_id"):
        annotations["event_id"] = str(body["event_id"])
    fingerprint = hashlib.sha256(
        "\0".join(f"{k}={v}" for k, v in sorted(labels.items())).encode()
    ).hexdigest()[:16]
    group = {"alertname": labels["alertname"]}
    alert = {
        "status": "firing",
        "labels": labels,
        "annotations": annotations,
        "startsAt": _rfc3339(body["ts"]),
        "endsAt": _ZERO_TIME,
        "generatorURL": "",
        "fingerprint": fingerprint,
    }
    return {
        "version": "4",
        "groupKey": "{}:" + "{" + f'alertname="{labels["alertname"]}"' + "}",
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": receiver,
        "groupLabels": group,
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": "",
        "alerts": [alert],
    }


def render(body: dict[str, Any], fmt: str, *, receiver: str = "ftd") -> dict[str, Any]:
    """``body`` (from :func:`summary`) in the destination's format."""
    if fmt == "slack":
        return slack(body)
    if fmt == "alertmanager":
        return alertmanager(body, receiver=receiver)
    if fmt == "generic":
        return body
    raise ValueError(f"unknown notify format {fmt!r} (one of {', '.join(FORMATS)})")
