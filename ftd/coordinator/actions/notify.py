"""notify: POST a notification about an action to each configured webhook (aiohttp client).

Destinations: ``coordinator.notify.webhook_url`` or ``url_file`` (with ``format`` and
``min_severity``) and every ``[[coordinator.notify.destinations]]`` table. Each gets the body in its
own ``format`` (:mod:`ftd.coordinator.actions.notify_formats`: ``generic`` ftd JSON, ``slack``
text + blocks, ``alertmanager`` webhook payload), and only notifications at or above its
``min_severity`` (a notify's ``params.severity``, else its event's, else warning).

The generic body (``Content-Type: application/json``)::

    {"source": "ftd", "action_id": ..., "action": "drain_node" | "notify" | ..., "target": ...,
     "node": ... | null, "job": ... | null, "reason": ..., "rule": ..., "event_id": ... | null,
     "event": {...} | null, "params": {...}, "ts": ..., "severity": ..., "drill": true | false,
     "text": "ftd: <action> <target>: <reason>"}

``action`` is ``params["action"]`` when a rule notifies *about* another action, else ``"notify"``;
``event`` is ``params["event"]`` (a rule's summary of the triggering event), else null.

Delivery: each attempt has ``timeout_s``; a connection error, a timeout, a 429 or a 5xx is retried
up to ``retries`` times with exponential backoff (0.5 s doubling, capped at 10 s, full jitter; a
``Retry-After`` in seconds is honoured within the cap); any other 4xx fails at once (retrying a
rejected request does not help). Every attempt carries ``Idempotency-Key: <action id>`` so a
receiver can drop the repeat a resumed action (coordinator restarted mid-send) may cause.

Outcome: every chosen destination delivered: *succeeded* (detail ``delivered``: destination,
format, status, attempts; with one destination its keys are also at the top). Some delivered, some
not: *escalated* (``undelivered`` says which and why). None delivered: *failed*. Nowhere to send
(no destination configured, or every destination's ``min_severity`` above this one's): one
``notification`` warning line in the coordinator's log (JSON in the journal: action, target, node,
job, rule, reason) and the action ends **logged** (``{"channel": "log"}``), never *succeeded*: the
ledger, API and ``ftd status`` show that nobody was told. ``logged`` is final, like succeeded.

Secrets: the URL usually embeds a token (Slack's path, ``?token=``). It is never logged nor put in the
action's detail: logs and errors name only ``scheme://host``, and any text that could echo the URL
(exception messages) is scrubbed. With ``url_file`` the URL is read at each send (rotation without a
restart) and never held in the config.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from ftd.config import ConfigError, NotifyConfig, NotifyDestinationConfig, read_secret_file
from ftd.coordinator.actions import notify_formats as formats
from ftd.coordinator.model.state import ClusterState
from ftd.logs import get_logger
from ftd.plugin.actions import ActionRecord, ActionState

log = get_logger(__name__)

_BACKOFF_FIRST_S = 0.5
_BACKOFF_MAX_S = 10.0


class NotifyError(RuntimeError):
    """The webhook could not be delivered; the message never contains the URL."""


def redact(text: str, url: str) -> str:
    """``text`` with the URL and its secret-bearing parts (path, query) replaced."""
    parts = urlsplit(url)
    for secret in (url, parts.path + ("?" + parts.query if parts.query else ""), parts.query, parts.path):
        if secret and secret != "/":
            text = text.replace(secret, "<redacted>")
    return text


def safe_origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or '?'}" + (f":{parts.port}" if parts.port else "")


class Notify:
    def __init__(
        self,
        config: NotifyConfig,
        state: ClusterState | None = None,
        *,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self.config = config
        self._state = state
        self._sleep = sleep

    def _url(self, dest: NotifyDestinationConfig | None = None) -> str:
        """The destination's URL (the top-level webhook when ``dest`` is None)."""
        if dest is None:
            dests = self.config.all_destinations()
            if not dests:
                raise NotifyError("no webhook configured (coordinator.notify.webhook_url or url_file)")
            dest = dests[0]
        if dest.webhook_url:
            return dest.webhook_url
        if dest.url_file:  # read at each send, so a rotated URL needs no restart
            try:
                url = read_secret_file(dest.url_file, "coordinator.notify.url_file").strip()
            except ConfigError as exc:
                raise NotifyError(str(exc)) from None
            if url:
                return url
            raise NotifyError("coordinator.notify.url_file is empty")
        raise NotifyError("no webhook configured (coordinator.notify.webhook_url or url_file)")

    def payload(self, record: ActionRecord) -> dict[str, Any]:
        """The generic body (the facts every format is made from)."""
        is_job = self._state is not None and record.request.target in self._state.jobs
        return formats.summary(record, is_job=is_job)

    def _log_only(self, record: ActionRecord, body: dict[str, Any], why: str) -> dict[str, Any]:
        # Nowhere to send: the journal is the channel (one warning line an alerting rule can match),
        # and the action ends "logged", so nobody mistakes it for a message someone received.
        log.warning(
            "notification",
            action_id=record.id,
            action=body["action"],
            target=body["target"],
            node=body["node"],
            job=body["job"],
            rule=body["rule"],
            reason=body["reason"],
            severity=body["severity"],
            channel="log",
            why=why,
        )
        return {"channel": "log", "why": why, "state": str(ActionState.LOGGED)}

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        body = self.payload(record)
        dests = self.config.all_destinations()
        if not dests:
            return self._log_only(record, body, "no notify destination configured")
        rank = formats.SEVERITY_RANK
        chosen = [d for d in dests if rank[body["severity"]] >= rank.get(d.min_severity, 0)]
        if not chosen:
            return self._log_only(record, body, f"every destination wants more than {body['severity']}")
        delivered: list[dict[str, Any]] = []
        undelivered: list[dict[str, str]] = []
        for index, dest in enumerate(chosen):
            name = dest.name or f"destinations[{index}]"
            try:
                delivered.append(await self._deliver(record, dest, name, body))
            except NotifyError as exc:
                log.warning("notification_undelivered", action_id=record.id, destination=name, error=str(exc))
                undelivered.append({"destination": name, "error": str(exc)})
        if not delivered:
            raise NotifyError("; ".join(f"{u['destination']}: {u['error']}" for u in undelivered))
        detail: dict[str, Any] = {"delivered": delivered}
        if len(chosen) == 1:
            detail.update(delivered[0])
        if undelivered:
            detail["undelivered"] = undelivered
            detail["state"] = str(ActionState.ESCALATED)
        return detail

    async def _deliver(
        self, record: ActionRecord, dest: NotifyDestinationConfig, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        url = self._url(dest)
        origin = safe_origin(url)
        payload = formats.render(body, dest.format, receiver=name)
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_s)
        headers = {"Idempotency-Key": record.id, "User-Agent": "ftd-coordinator"}
        attempts = self.config.retries + 1
        last_error = ""
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for attempt in range(1, attempts + 1):
                retry_after: float | None = None
                try:
                    async with session.post(
                        url, json=payload, headers=headers, allow_redirects=False
                    ) as resp:
                        await resp.read()
                        if resp.status < 300:
                            log.info(
                                "webhook_delivered", action_id=record.id, webhook=origin, status=resp.status
                            )
                            return {
                                "destination": name,
                                "format": dest.format,
                                "webhook": origin,
                                "status": resp.status,
                                "attempts": attempt,
                            }
                        last_error = f"HTTP {resp.status}"
                        if resp.status != 429 and resp.status < 500:
                            raise NotifyError(f"webhook {origin} refused the notification: {last_error}")
                        retry_after = _retry_after(resp.headers.get("Retry-After"))
                except (aiohttp.ClientError, TimeoutError) as exc:
                    last_error = redact(f"{type(exc).__name__}: {exc}", url)
                if attempt < attempts:
                    delay = min(_BACKOFF_MAX_S, _BACKOFF_FIRST_S * 2 ** (attempt - 1))
                    delay = retry_after if retry_after is not None else random.uniform(delay / 2, delay)
                    log.warning(
                        "webhook_failed_retrying",
                        action_id=record.id,
                        webhook=origin,
                        error=last_error,
                        attempt=attempt,
                        retry_in_s=round(delay, 3),
                    )
                    await self._sleep(min(delay, _BACKOFF_MAX_S))
        raise NotifyError(f"webhook {origin} failed after {attempts} attempt(s): {last_error}")


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
