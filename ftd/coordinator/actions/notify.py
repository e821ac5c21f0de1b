"""notify: POST one JSON document about an action to a webhook (aiohttp client).

The body (``Content-Type: application/json``)::

    {"source": "ftd", "action_id": ..., "action": "drain_node" | "notify" | ..., "target": ...,
     "node": ... | null, "job": ... | null, "reason": ..., "rule": ..., "event_id": ... | null,
     "event": {...} | null, "params": {...}, "ts": ..., "text": "ftd: <action> <target>: <reason>"}

``action`` is ``params["action"]`` when a rule notifies *about* another action, else ``"notify"``;
``event`` is ``params["event"]`` (a rule's summary of the triggering event), else null. ``text`` makes
the body readable by Slack/Mattermost-style incoming webhooks as it is.

Delivery: each attempt has ``timeout_s``; a connection error, a timeout, a 429 or a 5xx is retried
up to ``retries`` times with exponential backoff (0.5 s doubling, capped at 10 s, full jitter; a
``Retry-After`` in seconds is honoured within the cap); any other 4xx fails at once (retrying a
rejected request does not help). Every attempt carries ``Idempotency-Key: <action id>`` so a
receiver can drop the repeat a resumed action (coordinator restarted mid-send) may cause.

Without a webhook (neither ``webhook_url`` nor ``url_file``) the notification is one ``notification``
warning line in the coordinator's log (JSON in the journal: action, target, node, job, rule, reason)
and the action succeeds with ``{"channel": "log"}``.

Secrets: the URL usually embeds a token (Slack's path, ``?token=``). It is never logged nor put in the
action's detail: logs and errors name only ``scheme://host``, and any text that could echo the URL
(exception messages) is scrubbed. With ``url_file`` the URL is read at each send (rotation without a
restart) and never held in the config.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from ftd.config import ConfigError, NotifyConfig, read_secret_file
from ftd.coordinator.model.state import ClusterState
from ftd.logs import get_logger
from ftd.plugin.actions import ActionRecord

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

    def _url(self) -> str:
        if self.config.webhook_url:
            return self.config.webhook_url
        if self.config.url_file:  # read at each send, so a rotated URL needs no restart
            try:
                url = read_secret_file(self.config.url_file, "coordinator.notify.url_file").strip()
            except ConfigError as exc:
                raise NotifyError(str(exc)) from None
            if url:
                return url
            raise NotifyError("coordinator.notify.url_file is empty")
        raise NotifyError("no webhook configured (coordinator.notify.webhook_url or url_file)")

    def payload(self, record: ActionRecord) -> dict[str, Any]:
        req = record.request
        params = dict(req.params)
        target = req.target
        is_job = self._state is not None and target in self._state.jobs
        action = str(params.get("action") or req.kind)
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
            "ts": time.time(),
            "text": f"ftd: {action} {target}: {req.reason}",
        }

    async def __call__(self, record: ActionRecord) -> dict[str, Any]:
        if not (self.config.webhook_url or self.config.url_file):
            # No webhook: the journal is the channel (one warning line an alerting rule can match);
            # the action succeeds, so a site without a webhook does not see every notify "failed".
            body = self.payload(record)
            log.warning(
                "notification",
                action_id=record.id,
                action=body["action"],
                target=body["target"],
                node=body["node"],
                job=body["job"],
                rule=body["rule"],
                reason=body["reason"],
            )
            return {"channel": "log"}
        url = self._url()
        origin = safe_origin(url)
        body = self.payload(record)
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_s)
        headers = {"Idempotency-Key": record.id, "User-Agent": "ftd-coordinator"}
        attempts = self.config.retries + 1
        last_error = ""
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for attempt in range(1, attempts + 1):
                retry_after: float | None = None
                try:
                    async with session.post(url, json=body, headers=headers, allow_redirects=False) as resp:
                        await resp.read()
                        if resp.status < 300:
                            log.info(
                                "webhook_delivered", action_id=record.id, webhook=origin, status=resp.status
                            )
                            return {"webhook": origin, "status": resp.status, "attempts": attempt}
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
