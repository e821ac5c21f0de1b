"""notify's destinations and payload formats, delivered to a real local HTTP receiver (aiohttp on a
free port): generic JSON, Slack-compatible, Alertmanager's webhook payload; several destinations
with a minimum severity; and a notify with nowhere to go ends ``logged`` in the ledger."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from ftd.config import NotifyConfig, NotifyDestinationConfig, parse_config
from ftd.coordinator.actions.notify import Notify, NotifyError
from ftd.coordinator.decide.engine import Engine
from ftd.coordinator.decide.plugins import make_plugin_manager
from ftd.coordinator.decide.policy import PolicyGate
from ftd.coordinator.ledger.sqlite import Ledger, SqliteStore
from ftd.coordinator.model.state import ClusterState
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState


class Receiver:
    """Records what each path received; ``/fail`` answers 400."""

    def __init__(self) -> None:
        self.got: dict[str, list[Any]] = {}

    async def handle(self, request: web.Request) -> web.Response:
        self.got.setdefault(request.path, []).append(await request.json())
        return web.json_response({}, status=400 if request.path == "/fail" else 200)


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    r = Receiver()
    app = web.Application()
    app.router.add_post("/{name}", r.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield r, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _record(severity: str | None = "critical") -> ActionRecord:
    params: dict[str, Any] = {"action": "drain_node", "event": {"kind": "xid", "code": 79}}
    if severity is not None:
        params["severity"] = severity
    req = ActionRequest(
        kind="notify",
        target="node-7",
        reason="xid 79 on GPU 3",
        params=params,
        rule="xid_catalog",
        event_id="node-7-abc",
    )
    return ActionRecord(id="act-1", request=req, state=ActionState.RUNNING)


async def test_each_format_reaches_its_receiver(receiver: tuple[Receiver, str]) -> None:
    r, base = receiver
    config = NotifyConfig(
        webhook_url=f"{base}/generic",
        destinations=[
            NotifyDestinationConfig(name="chat", webhook_url=f"{base}/slack", format="slack"),
            NotifyDestinationConfig(name="pager", webhook_url=f"{base}/am", format="alertmanager"),
        ],
    )
    detail = await Notify(config)(_record())
    assert [(d["destination"], d["format"], d["status"]) for d in detail["delivered"]] == [
        ("default", "generic", 200),
        ("chat", "slack", 200),
        ("pager", "alertmanager", 200),
    ]
    assert "state" not in detail  # succeeded
    (generic,) = r.got["/generic"]
    assert generic["action"] == "drain_node" and generic["node"] == "node-7"
    assert generic["severity"] == "critical" and generic["text"] == "ftd: drain_node node-7: xid 79 on GPU 3"

    (slack,) = r.got["/slack"]
    assert slack["text"] == "ftd: drain_node node-7: xid 79 on GPU 3"
    assert slack["blocks"][0]["type"] == "section"
    assert "xid 79 on GPU 3" in slack["blocks"][0]["text"]["text"]
    assert "*node* node-7" in slack["blocks"][1]["elements"][0]["text"]

    (am,) = r.got["/am"]
    assert am["version"] == "4" and am["status"] == "firing" and am["receiver"] == "pager"
    assert len(am["alerts"]) == 1
    alert = am["alerts"][0]
    assert alert["status"] == "firing" and alert["endsAt"] == "0001-01-01T00:00:00Z"
    assert alert["labels"] == {
        "alertname": "ftd_drain_node",
        "severity": "critical",
        "source": "ftd",
        "target": "node-7",
        "node": "node-7",
        "rule": "xid_catalog",
    }
    assert alert["annotations"]["description"] == "xid 79 on GPU 3"
    assert alert["startsAt"].endswith("Z") and "T" in alert["startsAt"]
    assert am["commonLabels"] == alert["labels"] and am["groupLabels"] == {"alertname": "ftd_drain_node"}


async def test_min_severity_chooses_destinations(receiver: tuple[Receiver, str]) -> None:
    r, base = receiver
    config = NotifyConfig(
        destinations=[
            NotifyDestinationConfig(webhook_url=f"{base}/all"),
            NotifyDestinationConfig(webhook_url=f"{base}/pager", min_severity="critical"),
        ]
    )
    await Notify(config)(_record(severity=None))  # no severity: warning
    await Notify(config)(_record(severity="critical"))
    assert len(r.got["/all"]) == 2 and len(r.got["/pager"]) == 1
    only_pager = NotifyConfig(
        destinations=[NotifyDestinationConfig(webhook_url=f"{base}/pager", min_severity="error")]
    )
    detail = await Notify(only_pager)(_record(severity="warning"))
    assert detail["state"] == "logged" and "warning" in detail["why"]
    assert len(r.got["/pager"]) == 1


async def test_one_destination_failing_escalates_all_failing_fails(receiver: tuple[Receiver, str]) -> None:
    r, base = receiver
    config = NotifyConfig(
        destinations=[
            NotifyDestinationConfig(name="ok", webhook_url=f"{base}/ok"),
            NotifyDestinationConfig(name="bad", webhook_url=f"{base}/fail"),
        ]
    )
    detail = await Notify(config)(_record())
    assert detail["state"] == "escalated"
    assert [u["destination"] for u in detail["undelivered"]] == ["bad"]
    assert "HTTP 400" in detail["undelivered"][0]["error"]
    with pytest.raises(NotifyError, match=r"bad: .*HTTP 400"):
        await Notify(NotifyConfig(destinations=[config.destinations[1]]))(_record())
    assert len(r.got["/fail"]) == 2


def test_destinations_parse_and_need_a_url() -> None:
    cfg = parse_config(
        '[coordinator.notify]\nwebhook_url = "http://a/b"\nformat = "slack"\n'
        '[[coordinator.notify.destinations]]\nname = "pager"\nurl_file = "/run/x"\n'
        'format = "alertmanager"\nmin_severity = "critical"\n'
    )
    dests = cfg.coordinator.notify.all_destinations()
    assert [(d.name, d.format, d.min_severity) for d in dests] == [
        ("default", "slack", "info"),
        ("pager", "alertmanager", "critical"),
    ]
    from ftd.config import ConfigError

    with pytest.raises(ConfigError, match=r"destinations\[0\]: needs webhook_url or url_file"):
        parse_config('[[coordinator.notify.destinations]]\nformat = "slack"\n')
    with pytest.raises(ConfigError, match="must be one of"):
        parse_config('[coordinator.notify]\nformat = "teams"\n')


async def test_notify_without_destination_is_recorded_logged(tmp_path: Path) -> None:
    """Through the engine: the ledger says ``logged`` (terminal, not failed, not succeeded), and an
    engine restarted on that ledger resumes nothing and keeps it (nothing retries it)."""
    ledger_path = tmp_path / "ledger.sqlite"

    async def engine() -> Engine:
        e = Engine(
            state=ClusterState(),
            ledger=SqliteStore(Ledger(ledger_path)),
            gate=PolicyGate(cooldown_s=600),
            plugins=make_plugin_manager(entry_points=False),
            executors={ActionKind.NOTIFY: Notify(NotifyConfig())},
        )
        await e.load()
        return e

    first = await engine()
    record = await first.submit(
        ActionRequest(kind="notify", target="node-3", reason="hot GPU", rule="thermal")
    )
    assert await first.wait_idle(5)
    stored = await first.ledger.action(record.id)
    assert stored is not None and stored.state == ActionState.LOGGED and stored.state.finished
    assert stored.detail["channel"] == "log"
    await first.close()
    second = await engine()
    assert await second.ledger.unfinished() == []
    assert second.in_progress == 0
    stored = await second.ledger.action(record.id)
    assert stored is not None and stored.state == ActionState.LOGGED
    await second.close()
