"""The live dashboard: plain files in ``web/`` (no build step, no CDN), and where the last goodput
simulation for this coordinator is read from.

The dashboard's page and assets are served by name from :data:`STATIC_FILES` only (no path is ever
built from input), never cached stale. ``ftd sim goodput --config`` writes its report to
:func:`last_run_path` (beside the coordinator's ledger); the API reads it from there, knowing nothing
of the simulator.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from aiohttp import web

from ftd.coordinator.api.parsing import json_response
from ftd.coordinator.api.wire import Error
from ftd.logs import get_logger

log = get_logger(__name__)
T = TypeVar("T")

WEB_DIR = Path(__file__).with_name("web")
STATIC_FILES = {  # name -> content type; only these are served (no path is ever built from input)
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
LAST_RUN = "goodput-last.json"  # the last `ftd sim goodput --config` report, beside the ledger


def last_run_path(ledger_path: str) -> Path | None:
    """Where ``ftd sim goodput --config`` leaves its last run for that coordinator's dashboard: beside
    the coordinator's ledger (its state directory). None for an in-memory ledger."""
    if ledger_path == ":memory:":
        return None
    return Path(ledger_path).parent / LAST_RUN


async def dashboard_index(request: web.Request) -> web.Response:
    """``GET /``: the dashboard page (``web/index.html``), never cached stale."""
    return web.Response(
        body=(WEB_DIR / "index.html").read_bytes(),
        content_type="text/html",
        charset="utf-8",
        headers={"Cache-Control": "no-cache"},
    )


async def dashboard_static(request: web.Request) -> web.Response:
    """``GET /static/{name}``: one of :data:`STATIC_FILES` (no path is ever built from input), else 404."""
    name = request.match_info["name"]
    content_type = STATIC_FILES.get(name)
    if content_type is None:
        return json_response(Error(error=f"no such file: {name[:64]!r}"), 404)
    return web.Response(
        body=(WEB_DIR / name).read_bytes(),
        headers={"Content-Type": content_type, "Cache-Control": "no-cache"},
    )
