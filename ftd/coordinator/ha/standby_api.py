"""The read-only HTTP API of a standby coordinator (``coordinator.ha``): who leads, the ledger, the dashboard.

A standby runs no :class:`~ftd.coordinator.daemon.Coordinator` (no engine, no bus session), so the full
API (:mod:`ftd.coordinator.api.server`) has nothing to serve from. On the same address and port it serves:

* ``GET /`` and ``GET /static/{name}`` -- the same dashboard as the leader (the same handlers,
  :func:`~ftd.coordinator.api.server.dashboard_index` and
  :func:`~ftd.coordinator.api.server.dashboard_static`).
  The page reads ``/v1/ha``, shows this replica's role, the leader, its epoch and the lease age, and
  on a standby a "read-only standby -- leader is X (epoch N)" banner; nodes, jobs and the goodput
  report live in the leader's memory only, so the page says they are served by the leader instead of
  failing. It polls, so when this replica takes over (the full API takes the port) it shows the
  leader's view by itself;
* ``GET /healthz`` -- ``{"status": "standby", "version", "leader", "epoch"}``;
* ``GET /v1/ha`` -- the same document the leader serves (role ``standby``);
* ``GET /metrics`` -- the ``ftd_ha_*`` gauges (``ftd_ha_leader`` 0 here);
* ``GET /v1/events`` and ``GET /v1/actions`` (``?limit=N``) -- read from the shared ledger (reads
  are never fenced), so an operator sees what the leader decided from either replica.

Anything else answers 503 ``{"error": ..., "leader": ..., "epoch": ...}`` naming the lease holder:
mutating calls in particular go to the leader. Every request passes the same DNS rebinding guard as
the full API (:func:`~ftd.coordinator.api.server.host_check`: a ``Host`` naming no host of
``coordinator.api`` is answered 421), since a standby's page and ledger reads are as readable from
a rebinding web page as the leader's. The API is stopped before this replica's own coordinator
starts its full API on the port, and started again when the replica steps down.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ftd import __version__
from ftd.config.schema import ApiConfig
from ftd.coordinator.api.dashboard import dashboard_index, dashboard_static
from ftd.coordinator.api.guard import host_check
from ftd.coordinator.api.wire import action_out
from ftd.coordinator.ledger.store import LedgerStore, LedgerUnavailable
from ftd.logs import get_logger

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from ftd.coordinator.model.leadership import HaStatus

log = get_logger(__name__)

MAX_LIMIT = 1000
_encoder = msgspec.json.Encoder()


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encoder.encode(data), status=status, content_type="application/json")


class _HaCollector:
    def __init__(self, status: HaStatus) -> None:
        self.status = status

    def collect(self) -> Any:
        metrics: list[Metric] = list(self.status.metrics())
        return iter(metrics)


class StandbyApi:
    def __init__(self, cfg: ApiConfig, status: HaStatus, ledger: Callable[[], LedgerStore]) -> None:
        """``ledger`` opens the shared ledger for reading (once, on the first request that needs it)."""
        self.cfg = cfg
        self.status = status
        self._open_ledger = ledger
        self._ledger: LedgerStore | None = None
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_HaCollector(status))
        self.counters: dict[str, int] = {"wrong_host": 0}
        self.app = web.Application(middlewares=[host_check(cfg, self.counters)])
        self.app.router.add_get("/", dashboard_index)
        self.app.router.add_get("/static/{name}", dashboard_static)
        self.app.router.add_get("/healthz", self.healthz)
        self.app.router.add_get("/v1/ha", self.ha)
        self.app.router.add_get("/metrics", self.metrics)
        self.app.router.add_get("/v1/events", self.events)
        self.app.router.add_get("/v1/actions", self.actions)
        self.app.router.add_route("*", "/{tail:.*}", self.elsewhere)
        self._runner: web.AppRunner | None = None

    async def start(self) -> bool:
        """Listen; False (logged) when the port cannot be had -- the standby goes on without it."""
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.cfg.host, self.cfg.port).start()
        except OSError as exc:
            await runner.cleanup()
            log.error("standby_api_not_started", error=str(exc), host=self.cfg.host, port=self.cfg.port)
            return False
        self._runner = runner
        log.info("standby_api_listening", url=f"http://{self.cfg.host}:{self.cfg.port}/")
        return True

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._ledger is not None:
            await self._ledger.close()
            self._ledger = None

    def _limit(self, request: web.Request) -> int:
        raw = request.query.get("limit", "100")
        if not raw.isdecimal() or not 1 <= int(raw) <= MAX_LIMIT:
            raise web.HTTPBadRequest(
                text=_encoder.encode({"error": f"limit must be 1..{MAX_LIMIT}"}).decode(),
                content_type="application/json",
            )
        return int(raw)

    def _store(self) -> LedgerStore:
        if self._ledger is None:
            self._ledger = self._open_ledger()
        return self._ledger

    async def healthz(self, request: web.Request) -> web.Response:
        s = self.status
        return _json(
            {"status": "standby", "version": __version__, "leader": s.leader, "epoch": s.leader_epoch}
        )

    async def ha(self, request: web.Request) -> web.Response:
        return _json({"ledger": "postgresql", **self.status.as_dict()})

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def events(self, request: web.Request) -> web.Response:
        limit = self._limit(request)
        node = request.query.get("node") or None
        try:
            return _json(await self._store().events(limit=limit, node=node))
        except LedgerUnavailable as exc:
            return _json({"error": f"ledger unavailable: {exc}"}, 503)

    async def actions(self, request: web.Request) -> web.Response:
        limit = self._limit(request)
        try:
            records = await self._store().actions(limit=limit)
        except LedgerUnavailable as exc:
            return _json({"error": f"ledger unavailable: {exc}"}, 503)
        return _json([action_out(r) for r in records])  # the leader's document, field for field

    async def elsewhere(self, request: web.Request) -> web.Response:
        s = self.status
        leader = s.leader or "none holds the lease"
        error = (
            f"this coordinator is a standby (read-only): ask the leader ({leader}); "
            "a standby serves /, /static/*, /healthz, /v1/ha, /metrics, /v1/events, /v1/actions"
        )
        return _json({"error": error, "leader": s.leader, "epoch": s.leader_epoch}, 503)
