"""The read-only HTTP API of a standby coordinator (``coordinator.ha``): who leads, and the ledger.

A standby runs no :class:`~ftd.coordinator.app.Coordinator` (no engine, no bus session), so the full
API (:mod:`ftd.coordinator.api`) has nothing to serve from. On the same address and port it serves:

* ``GET /healthz`` -- ``{"status": "standby", "version", "leader", "epoch"}``;
* ``GET /v1/ha`` -- the same document the leader serves (role ``standby``);
* ``GET /metrics`` -- the ``ftd_ha_*`` gauges (``ftd_ha_leader`` 0 here);
* ``GET /v1/events`` and ``GET /v1/actions`` (``?limit=N``) -- read from the shared ledger (reads
  are never fenced), so an operator sees what the leader decided from either replica.

Anything else answers 503 ``{"error": "standby", "leader": ...}``: mutating calls in particular go to
the leader. The API is stopped before this replica's own coordinator starts its full API on the port,
and started again when the replica steps down.
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
from ftd.coordinator.ledger_seam import LedgerStore, LedgerUnavailable
from ftd.logs import get_logger

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from ftd.coordinator.ha import HaStatus

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
        self.app = web.Application()
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
            self._ledger.close()
            self._ledger = None

    def _limit(self, request: web.Request) -> int:
        raw = request.query.get("limit", "100")
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
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
            return _json(self._store().events(limit=limit, node=node))
        except LedgerUnavailable as exc:
            return _json({"error": f"ledger unavailable: {exc}"}, 503)

    async def actions(self, request: web.Request) -> web.Response:
        limit = self._limit(request)
        try:
            records = self._store().actions(limit=limit)
        except LedgerUnavailable as exc:
            return _json({"error": f"ledger unavailable: {exc}"}, 503)
        return _json(
            [
                {
                    "id": r.id,
                    "kind": r.request.kind,
                    "target": r.request.target,
                    "state": str(r.state),
                    "rule": r.request.rule,
                    "reason": r.request.reason,
                    "created": r.created,
                    "updated": r.updated,
                    "detail": r.detail,
                }
                for r in records
            ]
        )

    async def elsewhere(self, request: web.Request) -> web.Response:
        error = "this coordinator is a standby: it serves /healthz, /v1/ha, /metrics, /v1/events, /v1/actions"
        return _json({"error": error, "leader": self.status.leader}, 503)
