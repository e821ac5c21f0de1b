"""The coordinator's HTTP API (aiohttp): health, metrics, cluster state, the ledger, manual actions.

What it serves (the OpenAPI 3.1 document at ``/openapi.json`` is built from :data:`ROUTES` and the
same msgspec Structs that validate requests and shape responses, so it cannot drift from the code):

- ``GET /healthz``, ``GET /metrics`` (Prometheus text, a private registry), ``GET /openapi.json``;
- ``GET /v1/nodes``, ``/v1/gpus``, ``/v1/jobs``, ``/v1/events?limit=&node=``, ``/v1/actions?limit=``,
  ``/v1/actions/{id}``, ``/v1/rules`` (the rule plugins loaded: name, source, origin, hooks; and the
  disabled names, as ``ftd rules list --json`` prints them offline);
- ``POST /v1/actions/{id}/approve`` and ``/reject`` (``Engine.approve`` / ``Engine.reject``: only
  an action awaiting approval can be decided, anything else is 404),
  ``POST /v1/nodes/{node}/drain`` and ``/resume``, ``POST /v1/jobs/{job}/restart``: manual actions
  go through :meth:`Engine.submit` with ``rule="api:<by>"``, so the policy gate (dedupe, cooldown,
  dry-run) and the ledger apply to them exactly as to a rule's proposal;
- ``GET /`` and ``GET /static/{name}``: the live dashboard (plain files in ``web/``, no build, no CDN).

Security: every mutating call needs ``Authorization: Bearer <token>``, the token read from
``coordinator.api.token_file`` and compared in constant time. Without a configured token the
mutating calls answer 403: the API is never open by default. Reads need no token (bind the API to
loopback, the default, or put it behind a proxy).

DNS rebinding: a web page can make a browser on an operator's machine send requests to
``127.0.0.1:8787`` under the page's own host name and read the answers. So every request's ``Host``
header (port ignored) must name this API: ``host``, ``localhost``, ``127.0.0.1``, ``::1`` or one of
``allowed_hosts`` (``"*"`` turns the check off); anything else is answered 421 with what to set.

Wrong tokens back off per client address: after ``auth_failures_allowed`` failed token checks
(missing or wrong) every mutating call from that address is answered 429 with ``Retry-After``
for ``auth_backoff_s``, doubling with each further failure up to ``auth_backoff_max_s``; a correct
token resets the count. The state is per address (a bounded LRU), so a correct token from any
other address is never blocked. Behind a reverse proxy every client shares the proxy's address.

Robustness: path, query and body are validated with msgspec; every problem is a 400 with a JSON
``{"error": ...}`` naming the field; unknown ids are 404; aiohttp's own errors (405, 413, ...) are
answered as JSON too. No input produces a 500 (a schemathesis run in the tests checks it).
"""

from __future__ import annotations

import hmac
import math
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import msgspec
from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ftd import __version__
from ftd.config import ApiConfig, read_secret_file
from ftd.coordinator.decide.plugins import describe_plugins, disabled_plugins
from ftd.coordinator.ledger.store import LedgerUnavailable
from ftd.events import Event, JobAllocation
from ftd.logs import get_logger
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState

if TYPE_CHECKING:
    from ftd.coordinator.daemon import Coordinator

log = get_logger(__name__)
T = TypeVar("T")

WEB_DIR = Path(__file__).with_name("web")
STATIC_FILES = {  # name -> content type; only these are served (no path is ever built from input)
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
MAX_BODY = 64 * 1024
MAX_LIMIT = 1000

# --------------------------------------------------------------------------------------------------
# Input types (validated with msgspec; the OpenAPI schemas are generated from them)

_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
NodeName = Annotated[str, msgspec.Meta(pattern=_NAME_RE, description="A node name.")]
JobId = Annotated[str, msgspec.Meta(pattern=_NAME_RE, description="A job id.")]
ActionId = Annotated[str, msgspec.Meta(min_length=1, max_length=200, description="An action id.")]
Operator = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$",
        description="Who asks (recorded as the action's rule, api:<by>).",
    ),
]
Reason = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=200,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="Why (one line; shown in the scheduler's drain reason and the ledger).",
    ),
]
Limit = Annotated[int, msgspec.Meta(ge=1, le=MAX_LIMIT, description="How many, newest first.")]


class DrainRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    reason: Reason
    by: Operator = "operator"


class ResumeRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    reason: Reason = "manual resume"
    by: Operator = "operator"


class RestartRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    reason: Reason
    exclude: Annotated[
        list[NodeName], msgspec.Meta(max_length=64, description="Nodes the restarted job must avoid.")
    ] = msgspec.field(default_factory=list)
    by: Operator = "operator"


class ApproveRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    by: Operator = "operator"


class RejectRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    reason: Reason = "rejected by operator"
    by: Operator = "operator"


class EventsQuery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    limit: Limit = 100
    node: NodeName | None = None


class ActionsQuery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    limit: Limit = 100


# --------------------------------------------------------------------------------------------------
# Output types


class Error(msgspec.Struct, frozen=True, kw_only=True):
    error: str


class Health(msgspec.Struct, frozen=True, kw_only=True):
    status: Literal["ok"]
    version: str
    bus_connected: bool
    uptime_s: float
    actions_in_progress: int


class NodeOut(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    online: bool
    drained: bool  # drained by ftd
    drain_reason: str
    last_change: float
    jobs: list[str]
    # drained or down by someone else, as the scheduler says (upkeep.reconcile); not ftd's budget
    unavailable: str | None = None
    # the node's active critical conditions as its agent sees them (what `ftd health` reports there)
    conditions: list[str] = msgspec.field(default_factory=list)


class RuleOut(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    source: str  # builtin | entry_point | rule_dir | declarative | extra (ftd.coordinator.decide.plugins)
    origin: str  # module, distribution, rule file or rules file
    hooks: list[str]


class RulesOut(msgspec.Struct, frozen=True, kw_only=True):
    rules: list[RuleOut]
    disabled: list[str]  # coordinator.disabled_rules: blocked, not loaded


class JobOut(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    nodes: list[str]
    ranks: list[int]
    last_step: int | None
    ranks_by_node: dict[str, list[int]]
    # node -> what the scheduler's Prolog reported (user, GPUs, ...); a job without the client has
    # only these (ftd.agent.jobs)
    allocations: dict[str, JobAllocation] = msgspec.field(default_factory=dict)


class ActionOut(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    kind: str
    target: str
    state: ActionState
    reason: str
    rule: str
    params: dict[str, Any]
    event_id: str | None
    detail: dict[str, Any]
    created: float
    updated: float


def action_out(record: ActionRecord) -> ActionOut:
    req = record.request
    return ActionOut(
        id=record.id,
        kind=req.kind,
        target=req.target,
        state=record.state,
        reason=req.reason,
        rule=req.rule,
        params=req.params,
        event_id=req.event_id,
        detail=record.detail,
        created=record.created,
        updated=record.updated,
    )


# --------------------------------------------------------------------------------------------------
# Helpers


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


_encoder = msgspec.json.Encoder()


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=_encoder.encode(data), status=status, content_type="application/json", headers=headers
    )


def _validation_message(exc: msgspec.DecodeError, where: str) -> str:
    text = str(exc)
    if isinstance(exc, msgspec.DecodeError) and not isinstance(exc, msgspec.ValidationError):
        return f"{where}: not valid JSON ({text})"
    text = re.sub(r"\$\.?", "", text)  # "Expected `int`, got `str` - at `$.limit`" -> "... at `limit`"
    return f"{where}: {text}"


def _path_param(request: web.Request, name: str, type_: Any) -> Any:
    value = request.match_info[name]
    try:
        return msgspec.convert(value, type_)
    except msgspec.ValidationError:
        raise ApiError(400, f"path parameter {name!r}: {value[:80]!r} is not a valid {name}") from None


def _query(request: web.Request, type_: type[T]) -> T:
    data: dict[str, str] = {}
    for key in request.query:
        values = request.query.getall(key)
        if len(values) > 1:
            raise ApiError(400, f"query parameter {key!r} given {len(values)} times")
        data[key] = values[0]
    try:
        return msgspec.convert(data, type_, strict=False)
    except msgspec.ValidationError as exc:
        raise ApiError(400, _validation_message(exc, "query")) from None


async def _body(request: web.Request, type_: type[T], *, required: bool) -> T:
    raw = await request.read()
    if not raw.strip():
        if required:
            raise ApiError(400, "request body: a JSON object is required")
        raw = b"{}"
    try:
        return msgspec.json.decode(raw, type=type_)
    except msgspec.DecodeError as exc:
        raise ApiError(400, _validation_message(exc, "request body")) from None


def resolve_token(cfg: ApiConfig) -> str | None:
    """The API token from ``token_file`` (:func:`ftd.config.read_secret_file`: relative to
    ``$CREDENTIALS_DIRECTORY`` when set); ``None`` when unset. Unreadable or empty: ``ConfigError``
    (a ``ValueError``)."""
    if cfg.token_file is None:
        return None
    return read_secret_file(cfg.token_file, "coordinator.api.token_file").strip()


# --------------------------------------------------------------------------------------------------
# Metrics


class _Collector:
    """Reads the coordinator's live counters at scrape time (no double bookkeeping)."""

    def __init__(self, api: Api) -> None:
        self._api = api

    def collect(self) -> Iterator[Metric]:
        c = self._api.coordinator
        counters = c.engine.counters
        for name, key, text in (
            ("ftd_events_received", "events", "Events received and evaluated (duplicates excluded)."),
            ("ftd_events_duplicate", "duplicates", "Events dropped as duplicates (id already in ledger)."),
            ("ftd_rule_errors", "rule_errors", "Rule calls that raised."),
        ):
            yield CounterMetricFamily(name, text, value=counters.get(key, 0))
        yield CounterMetricFamily(
            "ftd_bad_messages", "Bus messages that failed to decode or validate.", value=c.bad_messages
        )
        actions = CounterMetricFamily(
            "ftd_actions",
            "Action state transitions seen by this process, by kind and state.",
            labels=["kind", "state"],
        )
        for (kind, state), count in sorted(self._api.action_transitions.items()):
            actions.add_metric([kind, state], count)
        yield actions
        nodes = c.state.nodes.values()
        gauge = GaugeMetricFamily("ftd_nodes", "Nodes known to the coordinator, by state.", labels=["state"])
        gauge.add_metric(["online"], sum(1 for n in nodes if n.online))
        gauge.add_metric(["offline"], sum(1 for n in nodes if not n.online))
        gauge.add_metric(["drained"], sum(1 for n in nodes if n.drained_by_ftd))
        gauge.add_metric(["unavailable"], len(c.state.unavailable))  # drained/down by others
        yield gauge
        yield GaugeMetricFamily(
            "ftd_jobs", "Jobs with ranks registered at an agent.", value=len(c.state.jobs)
        )
        if c.ha is not None:  # active/standby (ftd.coordinator.ha.runner): leader, epoch, lease age
            yield from c.ha.metrics()


# --------------------------------------------------------------------------------------------------
# The application

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: str  # name of the Api method
    summary: str
    mutating: bool = False
    body: type | None = None
    body_required: bool = False
    query: type | None = None
    params: tuple[tuple[str, Any], ...] = ()
    ok: tuple[int, Any, str] = (200, None, "application/json")  # status, response type, content type
    extra: tuple[int, ...] = ()  # other documented statuses


_NODE = (("node", NodeName),)
_JOB = (("job", JobId),)
_ACTION = (("id", ActionId),)

ROUTES: tuple[Route, ...] = (
    Route("GET", "/healthz", "healthz", "Liveness: the coordinator process answers.", ok=(200, Health, "")),
    Route("GET", "/metrics", "metrics", "Prometheus metrics.", ok=(200, str, "text/plain")),
    Route("GET", "/openapi.json", "openapi", "This document.", ok=(200, dict[str, Any], "")),
    Route("GET", "/", "index", "The live dashboard.", ok=(200, str, "text/html")),
    Route(
        "GET",
        "/static/{name}",
        "static",
        "Dashboard assets.",
        params=(("name", Annotated[str, msgspec.Meta(max_length=64)]),),
        ok=(200, str, "text/javascript,text/css"),
        extra=(404,),
    ),
    Route("GET", "/v1/nodes", "nodes", "Nodes, online/offline and drained.", ok=(200, list[NodeOut], "")),
    Route(
        "GET",
        "/v1/ha",
        "ha",
        "Active/standby: this coordinator's role, the leader, the lease epoch and age (sqlite: single).",
        ok=(200, dict[str, Any], ""),
    ),
    Route(
        "GET",
        "/v1/gpus",
        "gpus",
        "GPU records by UUID (empty if not tracked).",
        ok=(200, list[dict[str, Any]], ""),
    ),
    Route(
        "GET",
        "/v1/jobs",
        "jobs",
        "Jobs: ranks registered at agents, and jobs the Slurm Prolog reported.",
        ok=(200, list[JobOut], ""),
    ),
    Route(
        "GET",
        "/v1/rules",
        "rules",
        "The rule plugins loaded: name, source, origin and hooks; and the disabled ones.",
        ok=(200, RulesOut, ""),
    ),
    Route(
        "GET",
        "/v1/sim/goodput",
        "goodput",
        "The last `ftd sim goodput --config` run for this coordinator (its JSON report).",
        ok=(200, dict[str, Any], ""),
        extra=(404,),
    ),
    Route(
        "GET",
        "/v1/events",
        "events",
        "Recent events from the ledger, newest first.",
        query=EventsQuery,
        ok=(200, list[Event], ""),
        extra=(400,),
    ),
    Route(
        "GET",
        "/v1/actions",
        "actions",
        "Recent actions from the ledger, newest first.",
        query=ActionsQuery,
        ok=(200, list[ActionOut], ""),
        extra=(400,),
    ),
    Route(
        "GET",
        "/v1/actions/{id}",
        "action",
        "One action.",
        params=_ACTION,
        ok=(200, ActionOut, ""),
        extra=(400, 404),
    ),
    Route(
        "POST",
        "/v1/actions/{id}/approve",
        "approve",
        "Approve an action waiting for approval.",
        mutating=True,
        params=_ACTION,
        body=ApproveRequest,
        ok=(200, ActionOut, ""),
        extra=(400, 404),
    ),
    Route(
        "POST",
        "/v1/actions/{id}/reject",
        "reject",
        "Reject an action waiting for approval.",
        mutating=True,
        params=_ACTION,
        body=RejectRequest,
        ok=(200, ActionOut, ""),
        extra=(400, 404),
    ),
    Route(
        "POST",
        "/v1/nodes/{node}/drain",
        "drain",
        "Drain a node (through the policy gate).",
        mutating=True,
        params=_NODE,
        body=DrainRequest,
        body_required=True,
        ok=(202, ActionOut, ""),
        extra=(200, 400, 404),
    ),
    Route(
        "POST",
        "/v1/nodes/{node}/resume",
        "resume",
        "Resume a node ftd drained (through the gate).",
        mutating=True,
        params=_NODE,
        body=ResumeRequest,
        ok=(202, ActionOut, ""),
        extra=(200, 400, 404),
    ),
    Route(
        "POST",
        "/v1/jobs/{job}/restart",
        "restart",
        "Checkpoint, stop and requeue a job (through the gate).",
        mutating=True,
        params=_JOB,
        body=RestartRequest,
        body_required=True,
        ok=(202, ActionOut, ""),
        extra=(200, 400, 404),
    ),
)

_STATUS_TEXT = {
    200: "OK",
    202: "Accepted (the action started)",
    400: "Invalid input",
    401: "Missing or wrong token",
    403: "Mutating calls are disabled (no token configured)",
    404: "Unknown id",
    421: "The Host header names no host this API serves (DNS rebinding protection)",
    429: "Too many failed token checks from this address: retry after Retry-After seconds",
}
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


@dataclass
class _Failures:
    count: int = 0
    blocked_until: float = 0.0


class Api:
    def __init__(
        self,
        coordinator: Coordinator,
        cfg: ApiConfig,
        *,
        token: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.coordinator = coordinator
        self.cfg = cfg
        self.token = token
        self._clock = clock
        self._failures: OrderedDict[str, _Failures] = OrderedDict()
        self.counters: dict[str, int] = {"wrong_host": 0, "auth_failures": 0, "auth_throttled": 0}
        self.started = time.time()
        self.action_transitions: dict[tuple[str, str], int] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_Collector(self))
        self.decision_latency = Histogram(
            "ftd_decision_latency_seconds",
            "Seconds from an event's receipt to the verdicts on the actions it caused.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=self.registry,
        )
        self._last_state: dict[str, str] = {}
        coordinator.engine.observe(self._observe)
        self.app = self._build()
        self._runner: web.AppRunner | None = None

    def _observe(self, what: str, payload: Any) -> None:
        if what == "decision":
            self.decision_latency.observe(payload)
            return
        if what != "action" or not isinstance(payload, ActionRecord):
            return
        state = str(payload.state)
        if self._last_state.get(payload.id) == state:
            return
        self._last_state[payload.id] = state
        if state in ("succeeded", "escalated", "failed", "suppressed", "dry_run"):
            self._last_state.pop(payload.id, None)
        key = (payload.request.kind, state)
        self.action_transitions[key] = self.action_transitions.get(key, 0) + 1

    # --- app ------------------------------------------------------------------------------------

    def _build(self) -> web.Application:
        app = web.Application(
            middlewares=[self._errors, host_check(self.cfg, self.counters)], client_max_size=MAX_BODY
        )
        for route in ROUTES:
            app.router.add_route(route.method, route.path, self._wrap(route))
        return app

    def _wrap(self, route: Route) -> Handler:
        method: Handler = getattr(self, route.handler)

        async def handler(request: web.Request) -> web.StreamResponse:
            if route.mutating:
                self._authorize(request)
            return await method(request)

        handler.__name__ = route.handler
        return handler

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            return json_response(Error(error=exc.message), exc.status, exc.headers)
        except web.HTTPException as exc:  # aiohttp's own: 404 no route, 405, 413, ...
            if exc.status < 400:
                raise
            headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "www-authenticate")}
            return json_response(Error(error=exc.reason or "error"), exc.status, headers)
        except LedgerUnavailable as exc:  # the HA ledger's database is down or slow: try again later
            log.warning("api_ledger_unavailable", path=request.path, error=str(exc))
            return json_response(Error(error=f"ledger unavailable: {exc}"), 503, {"Retry-After": "1"})
        except Exception:
            log.exception("api_handler_failed", path=request.path, method=request.method)
            return json_response(Error(error="internal error (logged by the coordinator)"), 500)

    def _authorize(self, request: web.Request) -> None:
        address = request.remote or "unknown"
        now = self._clock()
        state = self._failures.get(address)
        if state is not None and now < state.blocked_until:
            self.counters["auth_throttled"] += 1
            wait = max(1, math.ceil(state.blocked_until - now))
            raise ApiError(
                429,
                f"too many failed token checks from {address}: retry after {wait} s",
                {"Retry-After": str(wait)},
            )
        try:
            self._check_token(request)
        except ApiError as exc:
            if exc.status == 401:
                self._failed(address, now)
            raise
        self._failures.pop(address, None)

    def _failed(self, address: str, now: float) -> None:
        self.counters["auth_failures"] += 1
        state = self._failures.pop(address, None) or _Failures()
        self._failures[address] = state  # most recent last: the LRU drops the oldest
        while len(self._failures) > MAX_TRACKED_ADDRESSES:
            self._failures.popitem(last=False)
        state.count += 1
        over = state.count - self.cfg.auth_failures_allowed
        if over >= 0:
            delay = min(self.cfg.auth_backoff_max_s, self.cfg.auth_backoff_s * 2.0 ** min(over, 64))
            state.blocked_until = now + delay
            log.warning("api_auth_backoff", remote=address, failures=state.count, wait_s=delay)

    def _check_token(self, request: web.Request) -> None:
        if self.token is None:
            raise ApiError(
                403,
                "mutating API calls are disabled: no token is configured "
                "(set coordinator.api.token_file and send Authorization: Bearer <token>)",
            )
        challenge = {"WWW-Authenticate": 'Bearer realm="ftd"'}
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise ApiError(401, "missing bearer token: send Authorization: Bearer <token>", challenge)
        if not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            raise ApiError(401, "wrong bearer token", challenge)

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.cfg.host, self.cfg.port)
        await site.start()
        log.info(
            "http_api_listening",
            url=f"http://{self.cfg.host}:{self.cfg.port}/",
            mutating="enabled" if self.token else "disabled (no token)",
        )

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- read-only handlers -----------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        c = self.coordinator
        return json_response(
            Health(
                status="ok",
                version=__version__,
                bus_connected=bool(c.bus.connected),
                uptime_s=round(time.time() - self.started, 3),
                actions_in_progress=c.engine.in_progress,
            )
        )

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def openapi(self, request: web.Request) -> web.Response:
        return json_response(openapi_document())

    async def index(self, request: web.Request) -> web.Response:
        return await dashboard_index(request)

    async def static(self, request: web.Request) -> web.Response:
        return await dashboard_static(request)

    async def ha(self, request: web.Request) -> web.Response:
        ha = self.coordinator.ha
        if ha is None:
            return json_response({"role": "single", "ledger": "sqlite", "leader": None, "epoch": None})
        return json_response({"ledger": "postgresql", **ha.as_dict()})

    async def nodes(self, request: web.Request) -> web.Response:
        state = self.coordinator.state
        return json_response(
            [
                NodeOut(
                    name=n.name,
                    online=n.online,
                    drained=n.drained_by_ftd,
                    drain_reason=n.drain_reason,
                    last_change=n.last_change,
                    jobs=state.jobs_on_node(n.name),
                    unavailable=state.unavailable.get(n.name),
                    conditions=state.conditions.get(n.name, []),
                )
                for n in sorted(state.nodes.values(), key=lambda n: n.name)
            ]
        )

    async def rules(self, request: web.Request) -> web.Response:
        plugins = self.coordinator.engine.plugins
        return json_response(
            RulesOut(
                rules=[RuleOut(**info.as_dict()) for info in describe_plugins(plugins)],
                disabled=disabled_plugins(plugins),
            )
        )

    async def goodput(self, request: web.Request) -> web.Response:
        from ftd.sim.goodput import last_run_path

        path = last_run_path(self.coordinator.config.coordinator.ledger_path)
        try:
            report = msgspec.json.decode(path.read_bytes()) if path is not None else None
        except (OSError, msgspec.DecodeError):
            report = None
        if not isinstance(report, dict):
            raise ApiError(404, "no goodput run saved: run `ftd sim goodput --config` with this config")
        return json_response(report)

    async def gpus(self, request: web.Request) -> web.Response:
        gpus = getattr(self.coordinator.state, "gpus", None)  # GPU records, where the state keeps them
        if not gpus:
            return json_response([])
        items = list(gpus.values()) if isinstance(gpus, dict) else list(gpus)
        out: list[Any] = []
        for item in items:
            try:
                plain = msgspec.to_builtins(item, builtin_types=None, enc_hook=str)
            except (TypeError, ValueError):
                plain = {"repr": repr(item)}
            out.append(plain if isinstance(plain, dict) else {"value": plain})
        return json_response(out)

    async def jobs(self, request: web.Request) -> web.Response:
        return json_response(
            [
                JobOut(
                    id=j.id,
                    nodes=j.nodes,
                    ranks=sorted(j.ranks),
                    last_step=j.last_step,
                    ranks_by_node={n: sorted(r.rank for r in ranks) for n, ranks in j.ranks_by_node.items()},
                    allocations=dict(sorted(j.allocations.items())),
                )
                for j in sorted(self.coordinator.state.jobs.values(), key=lambda j: j.id)
            ]
        )

    async def events(self, request: web.Request) -> web.Response:
        q = _query(request, EventsQuery)
        return json_response(await self.coordinator.ledger.events(limit=q.limit, node=q.node))

    async def actions(self, request: web.Request) -> web.Response:
        q = _query(request, ActionsQuery)
        return json_response([action_out(r) for r in await self.coordinator.ledger.actions(limit=q.limit)])

    async def _record(self, request: web.Request) -> ActionRecord:
        action_id: str = _path_param(request, "id", ActionId)
        record = await self.coordinator.ledger.action(action_id)
        if record is None:
            raise ApiError(404, f"no action with id {action_id[:80]!r}")
        return record

    async def action(self, request: web.Request) -> web.Response:
        return json_response(action_out(await self._record(request)))

    # --- mutating handlers ------------------------------------------------------------------------

    async def _decide(self, request: web.Request, verb: str, body_type: type[Any]) -> web.Response:
        record = await self._record(request)
        body = await _body(request, body_type, required=False)
        engine = self.coordinator.engine
        try:
            if verb == "approve":
                await engine.approve(record.id, by=body.by)
            else:
                await engine.reject(record.id, body.reason, by=body.by)
        except KeyError as exc:
            raise ApiError(404, f"{record.id}: {exc.args[0] if exc.args else exc}") from None
        log.info("action_decision_via_api", verb=verb, action_id=record.id, by=body.by)
        updated = await self.coordinator.ledger.action(record.id) or record
        return json_response(action_out(updated))

    async def approve(self, request: web.Request) -> web.Response:
        return await self._decide(request, "approve", ApproveRequest)

    async def reject(self, request: web.Request) -> web.Response:
        return await self._decide(request, "reject", RejectRequest)

    async def _submit(self, request: ActionRequest) -> web.Response:
        record = await self.coordinator.engine.submit(request)
        started = record.state in (ActionState.PENDING, ActionState.RUNNING)
        return json_response(action_out(record), 202 if started else 200)

    def _known_node(self, request: web.Request) -> str:
        node: str = _path_param(request, "node", NodeName)
        if node not in self.coordinator.state.nodes:
            raise ApiError(404, f"node {node!r} is not known to the coordinator (no agent has reported it)")
        return node

    async def drain(self, request: web.Request) -> web.Response:
        node = self._known_node(request)
        body = await _body(request, DrainRequest, required=True)
        return await self._submit(
            ActionRequest(kind=ActionKind.DRAIN_NODE, target=node, reason=body.reason, rule=f"api:{body.by}")
        )

    async def resume(self, request: web.Request) -> web.Response:
        node = self._known_node(request)
        body = await _body(request, ResumeRequest, required=False)
        return await self._submit(
            ActionRequest(kind=ActionKind.RESUME_NODE, target=node, reason=body.reason, rule=f"api:{body.by}")
        )

    async def restart(self, request: web.Request) -> web.Response:
        job: str = _path_param(request, "job", JobId)
        if job not in self.coordinator.state.jobs:
            raise ApiError(404, f"job {job!r} is not known to the coordinator (no rank has registered)")
        body = await _body(request, RestartRequest, required=True)
        return await self._submit(
            ActionRequest(
                kind=ActionKind.CHECKPOINT_RESTART,
                target=job,
                reason=body.reason,
                params={"exclude": sorted(set(body.exclude))},
                rule=f"api:{body.by}",
            )
        )


async def start_api(coordinator: Coordinator) -> Api | None:
    """Start the API for ``coordinator`` if enabled. A port already in use (or an unreadable token
    file) is logged as an error and the coordinator runs on without its API: acting on faults
    matters more than showing them."""
    cfg = coordinator.config.coordinator.api
    if not cfg.enabled:
        return None
    try:
        api = Api(coordinator, cfg, token=resolve_token(cfg))
        await api.start()
    except (OSError, ValueError) as exc:
        log.error("http_api_not_started", error=str(exc), host=cfg.host, port=cfg.port)
        return None
    return api


# --------------------------------------------------------------------------------------------------
# OpenAPI


def _param_schema(t: Any, default: Any = msgspec.NODEFAULT) -> dict[str, Any]:
    schema: dict[str, Any] = msgspec.json.schema(t)
    schema.pop("$defs", None)
    options = [s for s in schema.get("anyOf", ()) if s.get("type") != "null"]
    if len(options) == 1:  # ``X | None``: a query parameter is absent or an X, never null
        schema = options[0]
    if default is not msgspec.NODEFAULT and default is not None:
        schema["default"] = default
    return schema


def openapi_document() -> dict[str, Any]:
    types: list[Any] = [Error]
    for route in ROUTES:
        if route.body is not None:
            types.append(route.body)
        if route.ok[1] is not None and route.ok[2] == "":
            types.append(route.ok[1])
    schemas, components = msgspec.json.schema_components(types, ref_template="#/components/schemas/{name}")
    by_type = dict(zip(types, schemas, strict=True))
    error = {"application/json": {"schema": by_type[Error]}}
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        op: dict[str, Any] = {"operationId": route.handler, "summary": route.summary}
        params: list[dict[str, Any]] = [
            {"name": name, "in": "path", "required": True, "schema": _param_schema(t)}
            for name, t in route.params
        ]
        if route.query is not None:
            for field in msgspec.structs.fields(route.query):
                params.append(
                    {
                        "name": field.encode_name,
                        "in": "query",
                        "required": False,
                        "schema": _param_schema(field.type, field.default),
                    }
                )
        if params:
            op["parameters"] = params
        if route.body is not None:
            op["requestBody"] = {
                "required": route.body_required,
                "content": {"application/json": {"schema": by_type[route.body]}},
            }
        status, out, content_type = route.ok
        if content_type == "":
            ok_content = {"application/json": {"schema": by_type[out]}}
        else:
            ok_content = {ct: {"schema": {"type": "string"}} for ct in content_type.split(",")}
        responses: dict[str, Any] = {
            str(status): {"description": _STATUS_TEXT.get(status, "OK"), "content": ok_content}
        }
        extra = set(route.extra) | {421}
        if route.mutating:
            op["security"] = [{"bearer": []}]
            extra |= {401, 403, 429}
        for code in sorted(extra):
            if code == 200 and route.ok[0] == 202:
                responses["200"] = {
                    "description": "Decided but not started (suppressed, dry-run, failed)",
                    "content": ok_content,
                }
            else:
                responses[str(code)] = {"description": _STATUS_TEXT[code], "content": error}
        op["responses"] = responses
        paths.setdefault(route.path, {})[route.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ftd coordinator",
            "version": __version__,
            "description": "Cluster state, the decision ledger and manual actions. Mutating calls need "
            "Authorization: Bearer <token> (coordinator.api.token_file).",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
