"""The coordinator's HTTP API and dashboard, by job: wire types (:mod:`.wire`), request parsing
(:mod:`.parsing`), the host and token guard (:mod:`.guard`), the route table and its OpenAPI document
(:mod:`.routes`), Prometheus metrics (:mod:`.metrics`), the dashboard's assets (:mod:`.dashboard`,
``web/``) and the handlers (:mod:`.server`). This face re-exports what other floors use."""

from ftd.coordinator.api.dashboard import WEB_DIR, dashboard_index, dashboard_static, last_run_path
from ftd.coordinator.api.guard import host_allowed, host_check, resolve_token
from ftd.coordinator.api.routes import ROUTES, openapi_document
from ftd.coordinator.api.server import Api, start_api
from ftd.coordinator.api.wire import action_out

__all__ = [
    "ROUTES",
    "WEB_DIR",
    "Api",
    "action_out",
    "dashboard_index",
    "dashboard_static",
    "host_allowed",
    "host_check",
    "last_run_path",
    "openapi_document",
    "resolve_token",
    "start_api",
]
