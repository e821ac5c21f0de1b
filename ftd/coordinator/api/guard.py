"""Who may ask: the DNS rebinding guard (``Host`` must name this API) and the bearer token's source.

Both the full API and the standby's read-only one (:mod:`ftd.coordinator.ha.standby_api`) put
:func:`host_check` in front of every route. The per-address backoff on wrong tokens lives with the
handlers (:class:`ftd.coordinator.api.server.Api`), which own its state.
"""

from __future__ import annotations

from typing import TypeVar

from aiohttp import web
from aiohttp.typedefs import Middleware

from ftd.config import ApiConfig, read_secret_file
from ftd.coordinator.api.parsing import json_response
from ftd.coordinator.api.routes import Handler
from ftd.coordinator.api.wire import Error
from ftd.logs import get_logger

log = get_logger(__name__)
T = TypeVar("T")

MAX_TRACKED_ADDRESSES = 10_000
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def _host_name(header: str) -> str:
    """The name of a Host header: lowercased, port and trailing dot removed, IPv6 brackets dropped."""
    header = header.strip().lower()
    if header.startswith("["):
        name = header[1 : header.find("]")] if "]" in header else header[1:]
    else:
        name = header.rsplit(":", 1)[0] if header.count(":") == 1 else header
    return name.rstrip(".")


def host_allowed(header: str | None, cfg: ApiConfig) -> bool:
    """Whether a request's ``Host`` header names this API (see the module docstring)."""
    if "*" in cfg.allowed_hosts:
        return True
    if not header:
        return False
    allowed = {_host_name(h) for h in (cfg.host, *LOOPBACK_NAMES, *cfg.allowed_hosts)}
    return _host_name(header) in allowed


def host_check(cfg: ApiConfig, counters: dict[str, int]) -> Middleware:
    """The DNS rebinding guard (see the module docstring) as an aiohttp middleware: a request whose
    ``Host`` names no host of ``cfg`` is answered 421, counted in ``counters["wrong_host"]``. The full
    API and the standby's (:mod:`ftd.coordinator.ha.standby_api`) both put it in front of every route."""

    @web.middleware
    async def check_host(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get("Host")
        if host_allowed(host, cfg):
            return await handler(request)
        counters["wrong_host"] = counters.get("wrong_host", 0) + 1
        if counters["wrong_host"] <= 10 or counters["wrong_host"] % 1000 == 0:
            log.warning("api_wrong_host", host=(host or "")[:100], remote=request.remote)
        message = (
            f"this API does not serve host {(host or '')[:100]!r} (DNS rebinding protection): "
            "reach it by an allowed name, or add this one to coordinator.api.allowed_hosts"
        )
        return json_response(Error(error=message), 421)

    return check_host


def resolve_token(cfg: ApiConfig) -> str | None:
    """The API token from ``token_file`` (:func:`ftd.config.read_secret_file`: relative to
    ``$CREDENTIALS_DIRECTORY`` when set); ``None`` when unset. Unreadable or empty: ``ConfigError``
    (a ``ValueError``)."""
    if cfg.token_file is None:
        return None
    return read_secret_file(cfg.token_file, "coordinator.api.token_file").strip()
