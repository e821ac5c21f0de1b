"""Issue #11, HTTP API: DNS rebinding is refused (Host check) and wrong tokens are throttled per
client address (back-off), on a real listening coordinator API.

Findings reproduced (each failed before the fix): a request whose Host header named another site
(``evil.example``, what a browser sends after DNS rebinding) was answered with cluster state; wrong
tokens could be tried without limit.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from ftd.config import ApiConfig
from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.coordinator.api import Api
from ftd.coordinator.daemon import Coordinator
from tests.realparts import free_port
from tests.unit.live_api import TOKEN, live_api
from tests.unit.test_api import make_coordinator, populate

AUTH = {"Authorization": f"Bearer {TOKEN}"}
WRONG = {"Authorization": "Bearer not-the-token"}
DRAIN = "/v1/nodes/node-1/drain"
BODY = {"reason": "manual test"}


def get(url: str, host: str | None) -> tuple[int, bytes]:
    """A raw GET with an explicit Host header (urllib sends what it is given)."""
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_dns_rebinding_style_request_is_refused_on_a_live_api() -> None:
    with live_api() as base:
        port = base.rsplit(":", 1)[1]
        # The browser resolved evil.example to 127.0.0.1 and sends its own name in Host.
        status, body = get(f"{base}/v1/nodes", f"evil.example:{port}")
        assert status == 421, body
        assert b"evil.example" in body and b"allowed_hosts" in body
        assert b"node-1" not in body  # nothing of the cluster state leaked
        status, _ = get(f"{base}/healthz", "evil.example")
        assert status == 421
        # Positive controls: the names the API is reached by on loopback.
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}", "localhost."):
            status, body = get(f"{base}/v1/nodes", host)
            assert status == 200 and b"node-1" in body, (host, status)


def test_allowed_hosts_adds_names_and_star_disables_the_check() -> None:
    from ftd.coordinator.api import host_allowed

    cfg = ApiConfig(host="10.0.0.5", allowed_hosts=["ftd.example.org"])
    assert host_allowed("ftd.example.org:8787", cfg) and host_allowed("FTD.example.org", cfg)
    assert host_allowed("10.0.0.5:8787", cfg) and host_allowed("127.0.0.1", cfg)
    assert not host_allowed("evil.example", cfg)
    assert not host_allowed("ftd.example.org.evil.example", cfg)
    assert not host_allowed(None, cfg) and not host_allowed("", cfg)
    assert host_allowed("anything:1", ApiConfig(allowed_hosts=["*"]))


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Served:
    api: Api
    coordinator: Coordinator
    port: int
    clock: Clock


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    scheduler = FakeScheduler()
    for node in ("node-1", "node-2"):
        scheduler.add_node(node)
    coordinator = make_coordinator(scheduler)
    await populate(coordinator)
    await coordinator.bus.start()
    port = free_port()
    clock = Clock()
    cfg = ApiConfig(port=port, auth_failures_allowed=3, auth_backoff_s=10, auth_backoff_max_s=40)
    api = Api(coordinator, cfg, token=TOKEN, clock=clock)
    await api.start()
    try:
        yield Served(api, coordinator, port, clock)
    finally:
        await api.stop()
        await coordinator.engine.close()
        await coordinator.bus.stop()


async def post(
    port: int, headers: dict[str, str], source: str = "127.0.0.1"
) -> tuple[int, dict[str, Any], str]:
    """POST a drain from the given loopback source address (Linux routes all of 127/8 to lo)."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0), force_close=True)
    url = f"http://127.0.0.1:{port}{DRAIN}"
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(url, json=BODY, headers=headers) as resp,
    ):
        return resp.status, await resp.json(), resp.headers.get("Retry-After", "")


async def test_wrong_tokens_back_off_exponentially_per_address_and_a_success_resets(served: Served) -> None:
    port, clock = served.port, served.clock
    # Three failures are answered 401; the fourth request, even with the right token, waits 10 s.
    assert [(await post(port, WRONG))[0] for _ in range(3)] == [401, 401, 401]
    status, body, retry = await post(port, WRONG)
    assert (status, retry) == (429, "10") and "retry after 10 s" in body["error"], body
    assert (await post(port, AUTH))[:1] == (429,)
    clock.now += 9.5
    assert (await post(port, AUTH))[0::2] == (429, "1")  # rounded up, never 0
    # Each further failure after the wait doubles it, up to the cap (40 s).
    for expected in ("20", "40", "40"):
        clock.now += 60
        assert (await post(port, WRONG))[0] == 401
        status, _, retry = await post(port, WRONG)
        assert (status, retry) == (429, expected)
    # The right token after the wait succeeds and resets the count: three failures again before 429.
    clock.now += 60
    assert (await post(port, AUTH))[0] in (200, 202)
    assert [(await post(port, WRONG))[0] for _ in range(4)] == [401, 401, 401, 429]
    # Failures: 3, one per doubling round (3), 3 after the reset; refused while waiting: 3 + 3 + 1.
    assert served.api.counters["auth_failures"] == 9 and served.api.counters["auth_throttled"] == 7


async def test_a_blocked_address_never_blocks_a_correct_token_from_another(served: Served) -> None:
    try:
        with socket.create_connection(("127.0.0.1", served.port), source_address=("127.0.0.2", 0)):
            pass
    except OSError as exc:
        pytest.skip(f"no second loopback source address here: {exc}")
    for _ in range(3):
        await post(served.port, WRONG, source="127.0.0.1")
    assert (await post(served.port, AUTH, source="127.0.0.1"))[0] == 429
    status, body, _ = await post(served.port, AUTH, source="127.0.0.2")
    assert status in (200, 202), body
    # ... and the other address's wrong tokens count on their own.
    assert [(await post(served.port, WRONG, source="127.0.0.2"))[0] for _ in range(3)] == [401, 401, 401]
    assert (await post(served.port, WRONG, source="127.0.0.2"))[0] == 429


def test_the_back_off_is_documented_in_openapi() -> None:
    from ftd.coordinator.api import openapi_document

    for path, ops in openapi_document()["paths"].items():
        for method, op in ops.items():
            assert "421" in op["responses"], (method, path)
            if method == "post":
                assert "429" in op["responses"], path
