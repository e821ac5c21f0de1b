"""notify executor against a local aiohttp webhook receiver: body, retries with backoff, no leaked secret."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
from aiohttp import web

from ftd.config import NotifyConfig
from ftd.coordinator.actions.notify import Notify, NotifyError
from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState

SECRET = "T0KEN-s3cr3t"


class Receiver:
    def __init__(self) -> None:
        self.bodies: list[Any] = []
        self.headers: list[dict[str, str]] = []
        self.statuses: list[int] = []  # answers to give, in order; then 200
        self.delay_s = 0.0

    async def handle(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/json"
        self.bodies.append(await request.json())
        self.headers.append(dict(request.headers))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        status = self.statuses.pop(0) if self.statuses else 200
        return web.json_response({"ok": status < 300}, status=status)


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    r = Receiver()
    app = web.Application()
    app.router.add_post(f"/hooks/{SECRET}", r.handle)
    runner = web.AppRunner(app, access_log=None)  # the receiver's own log would show the URL
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield r, f"http://127.0.0.1:{port}/hooks/{SECRET}?token={SECRET}"
    finally:
        await runner.cleanup()


def _record() -> ActionRecord:
    req = ActionRequest(
        kind="notify",
        target="node-7",
        reason="xid 79 on GPU 3",
        params={"action": "drain_node", "event": {"kind": "xid", "code": 79}},
        rule="xid_catalog",
        event_id="node-7-abc",
    )
    return ActionRecord(id="act-1", request=req, state=ActionState.RUNNING)


async def test_posts_json_summary(receiver: tuple[Receiver, str]) -> None:
    r, url = receiver
    detail = await Notify(NotifyConfig(webhook_url=url))(_record())
    assert detail["status"] == 200 and detail["attempts"] == 1
    assert SECRET not in str(detail)
    body = r.bodies[0]
    assert body["action"] == "drain_node" and body["node"] == "node-7" and body["job"] is None
    assert body["reason"] == "xid 79 on GPU 3" and body["event"] == {"kind": "xid", "code": 79}
    assert body["action_id"] == "act-1" and body["rule"] == "xid_catalog" and body["event_id"] == "node-7-abc"
    assert r.headers[0]["Idempotency-Key"] == "act-1"


async def test_retries_5xx_with_backoff_then_succeeds(
    receiver: tuple[Receiver, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    r, url = receiver
    r.statuses = [503, 500]
    url_file = tmp_path / "url"
    url_file.write_text(url + "\n")
    sleeps: list[float] = []

    async def sleep(s: float) -> None:
        sleeps.append(s)

    caplog.set_level(logging.DEBUG)
    with structlog.testing.capture_logs() as logs:
        detail = await Notify(NotifyConfig(url_file=str(url_file), retries=3), sleep=sleep)(_record())
    assert detail["attempts"] == 3 and len(r.bodies) == 3
    assert len(sleeps) == 2 and 0.25 <= sleeps[0] <= 0.5 and 0.5 <= sleeps[1] <= 1.0
    assert [e["event"] for e in logs].count("webhook_failed_retrying") == 2  # ftd did log the failures...
    out = capsys.readouterr()
    assert SECRET not in str(logs) + caplog.text + out.out + out.err  # ...without the URL's secret


async def test_gives_up_after_retries_without_leaking_url(
    receiver: tuple[Receiver, str], capsys: pytest.CaptureFixture[str]
) -> None:
    r, url = receiver
    r.statuses = [502] * 10

    async def sleep(s: float) -> None:
        return None

    with pytest.raises(NotifyError) as err:
        await Notify(NotifyConfig(webhook_url=url, retries=2), sleep=sleep)(_record())
    assert len(r.bodies) == 3 and "HTTP 502" in str(err.value)
    assert SECRET not in str(err.value)
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err


async def test_4xx_is_not_retried(receiver: tuple[Receiver, str]) -> None:
    r, url = receiver
    r.statuses = [403]
    with pytest.raises(NotifyError, match="HTTP 403"):
        await Notify(NotifyConfig(webhook_url=url, retries=3))(_record())
    assert len(r.bodies) == 1


async def test_timeout_and_connection_errors_are_retried_and_redacted(receiver: tuple[Receiver, str]) -> None:
    r, url = receiver
    r.delay_s = 1.0

    async def sleep(s: float) -> None:
        return None

    with pytest.raises(NotifyError, match="TimeoutError") as err:
        await Notify(NotifyConfig(webhook_url=url, timeout_s=0.2, retries=1), sleep=sleep)(_record())
    assert len(r.bodies) == 2 and SECRET not in str(err.value)
    dead = url.replace(url.split("/")[2], "127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(NotifyError) as err:
        await Notify(NotifyConfig(webhook_url=dead, timeout_s=1, retries=1), sleep=sleep)(_record())
    assert SECRET not in str(err.value) and "ClientConnectorError" in str(err.value)


async def test_without_a_webhook_the_log_is_the_channel() -> None:
    """No webhook configured: one ``notification`` warning line with the action's facts, and the
    action ends ``logged`` (not failed, as it once did with "no executor"; not succeeded either:
    nobody was told)."""
    with structlog.testing.capture_logs() as logs:
        result = await Notify(NotifyConfig())(_record())
    assert result == {"channel": "log", "why": "no notify destination configured", "state": "logged"}
    lines = [entry for entry in logs if entry["event"] == "notification"]
    assert len(lines) == 1 and lines[0]["log_level"] == "warning"
    record = _record()
    assert (lines[0]["action_id"], lines[0]["reason"], lines[0]["target"]) == (
        record.id,
        record.request.reason,
        record.request.target,
    )


async def test_a_configured_url_file_that_cannot_be_read_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(NotifyError, match="url_file"):
        await Notify(NotifyConfig(url_file=str(tmp_path / "nope")))(_record())


def test_url_file_is_a_systemd_credential(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Like the broker password and the API token: a relative url_file is read from
    $CREDENTIALS_DIRECTORY (LoadCredential=), so the URL's token never sits in the config."""
    (tmp_path / "webhook-url").write_text(f"http://hooks.example/{SECRET}\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert Notify(NotifyConfig(url_file="webhook-url"))._url() == f"http://hooks.example/{SECRET}"


def test_config_exclusive_url_and_file() -> None:
    from ftd.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match="mutually exclusive"):
        parse_config('[coordinator.notify]\nwebhook_url = "http://x/y"\nurl_file = "/f"\n')
    cfg = parse_config('[coordinator.notify]\nurl_file = "/f"\nretries = 5\n')
    assert cfg.coordinator.notify.retries == 5


async def test_a_job_notification_names_the_job_not_a_node(receiver: tuple[Receiver, str]) -> None:
    # issue #32 item 9: the notifications ftd sends about a job (pending after its requeue, held,
    # not resumed) target the job id; a job ftd moved is not in the state while it waits, and its
    # id went out as the "node".
    from ftd.coordinator.model.state import ClusterState

    r, url = receiver
    notify = Notify(NotifyConfig(webhook_url=url), ClusterState())
    pending = ActionRequest(
        kind="notify",
        target="1234",
        reason="job 1234 still pending 600s after ftd requeued it (Resources)",
        params={"job": "1234", "event": {"job": "1234"}},
        rule="reconcile",
    )
    await notify(ActionRecord(id="act-2", request=pending, state=ActionState.RUNNING))
    assert (r.bodies[-1]["job"], r.bodies[-1]["node"]) == ("1234", None)
    # a job's notification that names its node keeps it; a node's notification stays the node's
    on_node = ActionRequest(
        kind="notify", target="1234", reason="x", params={"job": "1234", "node": "node-3"}, rule="r"
    )
    await notify(ActionRecord(id="act-3", request=on_node, state=ActionState.RUNNING))
    assert (r.bodies[-1]["job"], r.bodies[-1]["node"]) == ("1234", "node-3")
    hung = ActionRequest(
        kind="notify", target="node-3", reason="job 77 hung", params={"job": "77"}, rule="hang"
    )
    await notify(ActionRecord(id="act-4", request=hung, state=ActionState.RUNNING))
    assert (r.bodies[-1]["job"], r.bodies[-1]["node"]) == ("77", "node-3")
    plain = ActionRequest(kind="notify", target="node-3", reason="thermal", params={}, rule="thermal")
    await notify(ActionRecord(id="act-5", request=plain, state=ActionState.RUNNING))
    assert (r.bodies[-1]["job"], r.bodies[-1]["node"]) == (None, "node-3")
