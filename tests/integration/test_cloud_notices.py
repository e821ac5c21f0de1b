"""Cloud interruption notices end to end on the agent side (issue #37): a loopback metadata server
(aiohttp, the one simulated part, serving the providers' documented shapes) and a real agent built by
``build_agent`` publishing to a real Mosquitto; a subscriber reads the bus. A notice appearing is an
``interruption`` event on the bus within 2 s, once; a hanging, failing, malformed or hostile server
costs bounded waits and counted errors, and no event."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import msgspec
from aiohttp import web

from ftd.agent.watchers.cloud import CloudWatcher
from ftd.agent.wiring import build_agent
from ftd.bus import topics
from ftd.bus.mqtt import MqttBus
from ftd.config.schema import AgentConfig, AgentMetricsConfig, CloudConfig
from ftd.events import Event, Interruption, Kind
from tests.realparts import Mosquitto, free_port

NODE = "vm-7"
TOKEN = "tok-123"


@dataclass
class Metadata:
    """What the fake metadata server answers, per path: (status, body) or ``"hang"``."""

    routes: dict[str, tuple[int, bytes] | str] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)
    token_puts: int = 0
    bad_headers: int = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        self.hits[path] = self.hits.get(path, 0) + 1
        if request.method == "PUT" and path == "/latest/api/token":
            self.token_puts += 1
            assert request.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
            return web.Response(text=TOKEN)
        if path.startswith("/latest/") and request.headers.get("X-aws-ec2-metadata-token") != TOKEN:
            self.bad_headers += 1
            return web.Response(status=401)
        if path.startswith("/computeMetadata/") and request.headers.get("Metadata-Flavor") != "Google":
            self.bad_headers += 1
            return web.Response(status=403)
        if path.startswith("/metadata/") and request.headers.get("Metadata") != "true":
            self.bad_headers += 1
            return web.Response(status=400)
        answer = self.routes.get(path, (404, b""))
        if answer == "hang":
            await asyncio.sleep(3600)
        assert isinstance(answer, tuple)
        return web.Response(status=answer[0], body=answer[1])


@contextlib.asynccontextmanager
async def metadata_server(md: Metadata) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", md.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@dataclass
class Env:
    md: Metadata
    watcher: CloudWatcher
    events: list[tuple[float, Event]]


@contextlib.asynccontextmanager
async def agent_with_cloud(
    tmp_path: Path, broker: Mosquitto, md: Metadata, metrics_port: int = 0, **cloud: object
) -> AsyncIterator[Env]:
    async with metadata_server(md) as url:
        cfg = AgentConfig(
            node=NODE,
            kmsg_path=str(tmp_path / "kmsg"),
            state_dir=str(tmp_path / "agent"),
            socket_path=f"{tempfile.mkdtemp(prefix='ftd-cloud-', dir='/tmp')}/a.sock",
            metrics=AgentMetricsConfig(port=metrics_port),
            cloud=CloudConfig(
                **{
                    "aws_url": url,
                    "gcp_url": url,
                    "azure_url": url,
                    "interval_s": 0.2,
                    "timeout_s": 0.5,
                    **cloud,
                }  # type: ignore[arg-type]
            ),
        )
        (tmp_path / "kmsg").touch()
        listener = MqttBus(host="127.0.0.1", port=broker.port, client_id="listener", clean_session=True)
        await listener.start()
        await listener.subscribe(topics.ALL_NODE_EVENTS)
        events: list[tuple[float, Event]] = []

        async def listen() -> None:
            async for msg in listener.messages():
                payload = json.loads(msg.payload)
                for item in payload if isinstance(payload, list) else [payload]:
                    event = msgspec.convert(item, Event)
                    if event.kind == Kind.INTERRUPTION:
                        events.append((time.monotonic(), event))

        bus = MqttBus(host="127.0.0.1", port=broker.port, client_id=f"agent-{NODE}")
        agent = build_agent(cfg, bus=bus, node=NODE)
        (watcher,) = [w for w in agent.watchers if isinstance(w, CloudWatcher)]
        tasks = [asyncio.create_task(listen()), asyncio.create_task(agent.run())]
        try:
            yield Env(md, watcher, events)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await listener.stop()


async def until(predicate, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def interruption(event: Event) -> Interruption:
    return msgspec.convert(event.data, Interruption)


async def test_a_spot_notice_reaches_the_bus_within_two_seconds_once(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    md = Metadata()
    async with agent_with_cloud(tmp_path, mosquitto, md, aws=True) as env:
        await until(lambda: md.hits.get("/latest/meta-data/spot/instance-action", 0) >= 2, 10)
        assert env.events == []  # 404: no notice
        deadline = time.time() + 120
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(deadline))
        body = json.dumps({"action": "terminate", "time": when}).encode()
        md.routes["/latest/meta-data/spot/instance-action"] = (200, body)
        appeared = time.monotonic()
        await until(lambda: env.events, 2.0)
        assert env.events[0][0] - appeared < 2.0
        notice = interruption(env.events[0][1])
        assert notice.source == "aws_spot"
        assert abs(notice.deadline - int(deadline)) < 1
        assert notice.ref == f"terminate@{when}"
        assert env.events[0][1].severity == "critical"
        # the deadline is written beside the agent's socket for the node's processes (ftd.client.deadline)
        written = env.watcher.deadline_file
        assert written is not None and written.name == "deadline"
        await until(lambda: written.exists(), 2.0)
        assert float(written.read_text()) == int(deadline)
        # polled again and again, published once
        polls = md.hits["/latest/meta-data/spot/instance-action"]
        await until(lambda: md.hits["/latest/meta-data/spot/instance-action"] >= polls + 3, 5)
        assert len(env.events) == 1
        assert md.bad_headers == 0
        assert md.token_puts == 1  # the IMDSv2 token is reused


async def test_gcp_and_azure_notices_reach_the_bus(tmp_path: Path, mosquitto: Mosquitto) -> None:
    md = Metadata()
    async with agent_with_cloud(tmp_path, mosquitto, md, gcp=True, azure=True) as env:
        md.routes["/computeMetadata/v1/instance/preempted"] = (200, b"FALSE")
        md.routes["/computeMetadata/v1/instance/maintenance-event"] = (200, b"NONE")
        await until(lambda: md.hits.get("/metadata/scheduledevents", 0) >= 2, 10)
        assert env.events == []
        not_before = email.utils.formatdate(time.time() + 300, usegmt=True)
        doc = {
            "DocumentIncarnation": 2,
            "Events": [
                {
                    "EventId": "E-42",
                    "EventType": "Reboot",
                    "ResourceType": "VirtualMachine",
                    "Resources": [NODE],
                    "EventStatus": "Scheduled",
                    "NotBefore": not_before,
                    "Description": "",
                    "EventSource": "Platform",
                    "DurationInSeconds": -1,
                }
            ],
        }
        md.routes["/metadata/scheduledevents"] = (200, json.dumps(doc).encode())
        md.routes["/computeMetadata/v1/instance/preempted"] = (200, b"TRUE")
        await until(lambda: len(env.events) >= 2, 2.0)
        by_source = {interruption(e).source: interruption(e) for _, e in env.events}
        assert set(by_source) == {"azure_scheduled", "gcp_preempt"}
        assert by_source["azure_scheduled"].ref == "E-42"
        assert (
            by_source["azure_scheduled"].deadline == email.utils.parsedate_to_datetime(not_before).timestamp()
        )
        assert 29 <= by_source["gcp_preempt"].deadline - by_source["gcp_preempt"].notice_at <= 31
        assert md.bad_headers == 0


async def test_a_recurring_maintenance_is_published_again_after_none(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    md = Metadata()
    path = "/computeMetadata/v1/instance/maintenance-event"
    md.routes["/computeMetadata/v1/instance/preempted"] = (200, b"FALSE")
    async with agent_with_cloud(tmp_path, mosquitto, md, gcp=True) as env:
        for expected in (1, 2):
            md.routes[path] = (200, b"NONE")
            seen = md.hits.get(path, 0)
            await until(lambda seen=seen: md.hits.get(path, 0) >= seen + 2, 5)  # type: ignore[misc]
            md.routes[path] = (200, b"TERMINATE_ON_HOST_MAINTENANCE")
            await until(lambda expected=expected: len(env.events) >= expected, 2.0)  # type: ignore[misc]
            seen = md.hits[path]
            await until(lambda seen=seen: md.hits[path] >= seen + 2, 5)  # type: ignore[misc]
            assert len(env.events) == expected  # still announced: not again
        assert {interruption(e).source for _, e in env.events} == {"gcp_maintenance"}


async def test_hanging_failing_and_hostile_servers_cost_bounded_waits_and_no_event(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    md = Metadata()
    md.routes["/latest/meta-data/spot/instance-action"] = "hang"
    md.routes["/latest/meta-data/events/recommendations/rebalance"] = (500, b"oops")
    md.routes["/computeMetadata/v1/instance/preempted"] = (200, b"\x00garbage")
    md.routes["/computeMetadata/v1/instance/maintenance-event"] = (200, b"X" * 200_000)
    far = email.utils.formatdate(time.time() + 20 * 365 * 86400, usegmt=True)
    past = email.utils.formatdate(time.time() - 3600, usegmt=True)
    events = [
        {
            "EventId": "F",
            "EventType": "Terminate",
            "EventStatus": "Scheduled",
            "Resources": [NODE],
            "NotBefore": far,
        },
        {
            "EventId": "P",
            "EventType": "Preempt",
            "EventStatus": "Scheduled",
            "Resources": [NODE],
            "NotBefore": past,
        },
    ]
    md.routes["/metadata/scheduledevents"] = (200, json.dumps({"Events": events}).encode())
    port = free_port()
    async with agent_with_cloud(
        tmp_path, mosquitto, md, metrics_port=port, aws=True, gcp=True, azure=True, backoff_max_s=1.0
    ) as env:
        errors = env.watcher.counts.errors
        await until(
            lambda: (
                {"timeout", "http_5xx"} <= {r for p, r in errors if p == "aws"}
                and {"malformed", "too_large"} <= {r for p, r in errors if p == "gcp"}
                and bool({("azure", "deadline_far"), ("azure", "deadline_past")} & set(errors))
            ),
            10,
        )
        # the agent is not stuck: the loop keeps passing, the hanging endpoint backs off
        progress = env.watcher.last_progress
        await until(lambda: env.watcher.last_progress > progress, 3)
        spot = next(e for e in env.watcher.endpoints if e.name == "spot")
        assert spot.failures >= 1 and spot.next_at > 0
        hits_before = md.hits.get("/latest/meta-data/spot/instance-action", 0)
        await asyncio.sleep(1.0)
        # backed off: at most a few tries a second (interval 0.2 s would be 5 without backoff)
        assert md.hits.get("/latest/meta-data/spot/instance-action", 0) - hits_before <= 2
        assert env.events == []
        health = env.watcher.health()
        assert health.state in ("running", "unavailable")
        # the operator sees it on /metrics: polls, and errors by reason
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/metrics") as resp,
        ):
            text = await resp.text()
        assert 'ftd_agent_cloud_errors_total{provider="aws",reason="timeout"}' in text
        assert 'ftd_agent_cloud_errors_total{provider="gcp",reason="too_large"}' in text
        assert 'ftd_agent_cloud_polls_total{provider="azure"}' in text
