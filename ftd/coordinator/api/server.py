"""The coordinator's HTTP API (aiohttp): health, metrics, cluster state, the ledger, manual actions.

What it serves (the OpenAPI 3.1 document at ``/openapi.json`` is built from :data:`ROUTES` and the
same msgspec Structs that validate requests and shape responses, so it cannot drift from the code):

- ``GET /healthz``, ``GET /metrics`` (Prometheus text, a private registry), ``GET /openapi.json``;
- ``GET /v1/nodes`` (filtered, sorted and paged on the server: ``problems``, ``state``, ``q``,
  ``sort=severity``, ``limit``/``offset``, the match count in ``X-Total-Count``; each node with its
  state, severity and action: :mod:`ftd.coordinator.api.views`), ``/v1/summary`` (the dashboard's
  counts), ``/v1/plans/{id}``, ``/v1/gpus``, ``/v1/jobs`` (with their state),
  ``/v1/events?limit=&node=``, ``/v1/actions?limit=``,
  ``/v1/actions/{id}``, ``/v1/action-phases`` (each action kind's phases, from the executors: the
  dashboard's action view reads them), ``/v1/rules`` (the rule plugins loaded: name, source,
  origin, hooks; and the disabled names, as ``ftd rules list --json`` prints them offline);
- ``POST /v1/actions/{id}/approve`` and ``/reject`` (``Engine.approve`` / ``Engine.reject``: only
  an action awaiting approval can be decided, anything else is 404),
  ``POST /v1/nodes/{node}/drain`` and ``/resume``, ``POST /v1/jobs/{job}/restart``: manual actions
  go through :meth:`Engine.submit` with ``rule="api:<by>"``, so the policy gate (dedupe, cooldown,
  dry-run) and the ledger apply to them exactly as to a rule's proposal; ``force`` with a
  ``force_reason`` (both kept in the action's params in the ledger) steps past the cooldown only,
  and a failed earlier action never holds an operator's own back;
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

import asyncio
import hmac
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

import ftd.coordinator.api.wire as wire
from ftd import __version__
from ftd.config import ApiConfig
from ftd.coordinator.actions.burn_in import BURN_IN
from ftd.coordinator.api.dashboard import dashboard_index, dashboard_static, last_run_path
from ftd.coordinator.api.guard import MAX_TRACKED_ADDRESSES, host_check, resolve_token
from ftd.coordinator.api.metrics import ActionTotals, MetricsCollector
from ftd.coordinator.api.parsing import ApiError, json_response, path_param, read_body, read_query
from ftd.coordinator.api.routes import ROUTES, Handler, Route, openapi_document
from ftd.coordinator.api.views import LabelTotals, NodeIndex, RecentActions, jobs_out, summary
from ftd.coordinator.decide.plugins import describe_plugins, disabled_plugins
from ftd.coordinator.decide.policy import labels_from_config
from ftd.coordinator.ledger.store import LedgerUnavailable
from ftd.coordinator.model.deadlines import stuck_after_s
from ftd.coordinator.model.pairs import fleet_expectation
from ftd.coordinator.model.plan import phases_of
from ftd.coordinator.upkeep.fabric_tests import FabricTests
from ftd.events import Interruption, Kind, make_event
from ftd.logs import get_logger
from ftd.plugin.actions import ActionKind, ActionRecord, ActionRequest, ActionState
from ftd.plugin.deadline import BadDeadline, check_deadline

if TYPE_CHECKING:
    from ftd.coordinator.daemon import Coordinator

log = get_logger(__name__)

#: Actions searched (newest first) for the repair bundle a drain's view links.
BUNDLE_LOOKBACK = 1000

RECENT_ACTIONS = 500  # the newest actions read to show each node's last one (in-flight ones always)


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
        self.labels = labels_from_config(coordinator.config.coordinator)  # node -> rack, nvlink_domain
        self.label_totals = LabelTotals(self.labels)
        self.recent_actions = RecentActions(coordinator.ledger, RECENT_ACTIONS)
        coordinator.engine.observe(self.recent_actions.observe, ("action",))
        self.action_totals = ActionTotals()
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(MetricsCollector(coordinator, self.action_totals))
        self.decision_latency = Histogram(
            "ftd_decision_latency_seconds",
            "Seconds from an event's receipt to the verdicts on the actions it caused.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=self.registry,
        )
        coordinator.engine.observe(self._observe, ("decision", "action"))
        self.app = self._build()
        self._runner: web.AppRunner | None = None
        self._background: set[asyncio.Task[Any]] = set()  # bisections started by POST /v1/fabric/bisect

    def _observe(self, what: str, payload: Any) -> None:
        if what == "decision":
            self.decision_latency.observe(payload)
            return
        if what == "action" and isinstance(payload, ActionRecord):
            self.action_totals.ended(payload)

    # --- app ------------------------------------------------------------------------------------

    def _build(self) -> web.Application:
        app = web.Application(
            middlewares=[self._errors, host_check(self.cfg, self.counters)], client_max_size=wire.MAX_BODY
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
            return json_response(wire.Error(error=exc.message), exc.status, exc.headers)
        except web.HTTPException as exc:  # aiohttp's own: 404 no route, 405, 413, ...
            if exc.status < 400:
                raise
            headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "www-authenticate")}
            return json_response(wire.Error(error=exc.reason or "error"), exc.status, headers)
        except LedgerUnavailable as exc:  # the HA ledger's database is down or slow: try again later
            log.warning("api_ledger_unavailable", path=request.path, error=str(exc))
            return json_response(wire.Error(error=f"ledger unavailable: {exc}"), 503, {"Retry-After": "1"})
        except Exception:
            log.exception("api_handler_failed", path=request.path, method=request.method)
            return json_response(wire.Error(error="internal error (logged by the coordinator)"), 500)

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
        await self.action_totals.load(self.coordinator)  # the totals survive a restart
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
            wire.Health(
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

    async def _in_flight(self) -> list[ActionRecord]:
        """Actions pending, running (the ledger) or held for approval (the engine), oldest first."""
        held = list(self.coordinator.engine.awaiting.values())
        return sorted([*await self.coordinator.ledger.unfinished(), *held], key=lambda r: r.created)

    async def _node_index(self) -> tuple[NodeIndex, list[ActionRecord]]:
        in_flight = await self._in_flight()
        recent = await self.recent_actions.get()
        return NodeIndex(self.coordinator.state, self.labels, in_flight, recent), in_flight

    async def nodes(self, request: web.Request) -> web.Response:
        query = read_query(request, wire.NodesQuery)
        index, _ = await self._node_index()
        total, page = index.select(query)
        return json_response(page, headers={"X-Total-Count": str(total)})

    async def summary(self, request: web.Request) -> web.Response:
        index, in_flight = await self._node_index()
        cfg = self.coordinator.config.coordinator
        totals = self.label_totals.totals(self.coordinator.state)
        return json_response(summary(index, in_flight, lambda kind: stuck_after_s(kind, cfg), totals))

    async def plan(self, request: web.Request) -> web.Response:
        plan_id: str = path_param(request, "id", wire.PlanId)
        plan = await self.coordinator.ledger.plan(plan_id)
        if plan is None:
            raise ApiError(404, f"no plan with id {plan_id[:80]!r}")
        steps = [
            wire.PlanStepOut(action=a, kind=k, target=t, state=st)
            for a, k, t, st in await self.coordinator.ledger.plan_states(plan_id)
        ]
        return json_response(wire.PlanOut(id=plan.id, event_id=plan.event_id, state=plan.state, steps=steps))

    async def rules(self, request: web.Request) -> web.Response:
        plugins = self.coordinator.engine.plugins
        return json_response(
            wire.RulesOut(
                rules=[wire.RuleOut(**info.as_dict()) for info in describe_plugins(plugins)],
                disabled=disabled_plugins(plugins),
            )
        )

    async def action_phases(self, request: web.Request) -> web.Response:
        """The phases of each action kind whose executor has them, from the engine's own executors
        (built-in and plugins'), in the order it runs them: the dashboard reads them here."""
        executors = self.coordinator.engine.executors
        return json_response(
            {kind: list(phases) for kind, executor in executors.items() if (phases := phases_of(executor))}
        )

    async def goodput(self, request: web.Request) -> web.Response:
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

    async def inventory(self, request: web.Request) -> web.Response:
        book = self.coordinator.state.inventory
        out: dict[str, Any] = {}
        for node in sorted(book.inventories):
            view = book.view(node)
            if view is not None:
                out[node] = {
                    "facts": view["facts"],
                    "reported_at": view["reported_at"],
                    "drift": view["drift"],
                }
        return json_response({"action": book.action, "nodes": out})

    async def drift(self, request: web.Request) -> web.Response:
        book = self.coordinator.state.inventory
        drifted = book.drifted()
        nodes = [
            {
                "node": node,
                "fields": list(report.fields),
                "reasons": [d.text() for d in report.drift],
                "since": book.since.get(node),
            }
            for node, report in sorted(drifted.items())
        ]
        return json_response(
            {
                "action": book.action,
                "reported": len(book.inventories),
                "unchecked": book.unchecked(),
                "nodes": nodes,
            }
        )

    async def node_inventory(self, request: web.Request) -> web.Response:
        node: str = path_param(request, "node", wire.NodeName)
        view = self.coordinator.state.inventory.view(node)
        if view is None:
            raise ApiError(404, f"node {node!r} has reported no inventory")
        return json_response({"node": node, **view})

    async def pair_matrix(self, request: web.Request) -> web.Response:
        expect, profile, why = fleet_expectation(self.coordinator.config.hardware)
        matrix = self.coordinator.state.pairs.matrix(expect, profile, time.time())
        return json_response({**matrix, "note": why})

    def _fabric_tests(self) -> FabricTests:
        tests = self.coordinator.fabric_tests
        if tests is None:
            raise ApiError(404, "pair tests are disabled (coordinator.fabric.enabled = false)")
        return tests

    async def bisection(self, request: web.Request) -> web.Response:
        tests = self._fabric_tests()
        return json_response({"running": tests.running, "last": tests.last})

    async def bisect(self, request: web.Request) -> web.Response:
        tests = self._fabric_tests()
        body = await read_body(request, wire.BisectRequest, required=False)
        if tests.running:
            raise ApiError(409, "a bisection is running: GET /v1/fabric/bisect")
        idle = tests.idle_nodes()
        usable = [n for n in body.nodes if n in idle] if body.nodes is not None else idle
        if len(usable) < 2:
            raise ApiError(
                409, f"a bisection needs two idle (or drained) online nodes; {len(usable)} of those asked"
            )
        tests.running = True  # at once: a second request before the task starts is refused too
        task = asyncio.get_running_loop().create_task(
            tests.bisect(body.suspects, body.nodes), name="bisection"
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return json_response({"started": True, "idle": idle}, status=202)

    async def jobs(self, request: web.Request) -> web.Response:
        return json_response(jobs_out(self.coordinator.state, await self._in_flight()))

    async def events(self, request: web.Request) -> web.Response:
        q = read_query(request, wire.EventsQuery)
        return json_response(await self.coordinator.ledger.events(limit=q.limit, node=q.node))

    async def actions(self, request: web.Request) -> web.Response:
        q = read_query(request, wire.ActionsQuery)
        records = await self.coordinator.ledger.actions(limit=q.limit)
        return json_response([wire.action_out(r, self._live_acks(r)) for r in records])

    def _live_acks(self, record: ActionRecord) -> int | None:
        """The ranks that acked a running action's save so far (from the ack book, in memory)."""
        if record.state != ActionState.RUNNING or not ActionKind.kind_targets_job(record.request.kind):
            return None
        if "saved" in record.detail or record.detail.get("save_skipped"):
            return None  # the save phase is over: the ledger's detail says who saved
        return self.coordinator.acks.acked(f"{record.id}-save")

    async def _record(self, request: web.Request) -> ActionRecord:
        action_id: str = path_param(request, "id", wire.ActionId)
        record = await self.coordinator.ledger.action(action_id)
        if record is None:
            raise ApiError(404, f"no action with id {action_id[:80]!r}")
        return record

    async def action(self, request: web.Request) -> web.Response:
        record = await self._record(request)
        if record.request.kind == ActionKind.DRAIN_NODE:
            bundle = await self._bundle_of(record.id)
            if bundle is not None:  # a drain for repair links its diagnostic bundle (issue #36)
                record = msgspec.structs.replace(record, detail={**record.detail, "rma_bundle": bundle})
        return json_response(wire.action_out(record, self._live_acks(record)))

    async def _bundle_of(self, drain_id: str) -> dict[str, Any] | None:
        """The ``rma_bundle`` action asked for the drain ``drain_id`` (the newest among the ledger's
        last :data:`BUNDLE_LOOKBACK` actions): its id, state and the bundle's path."""
        for other in await self.coordinator.ledger.actions(limit=BUNDLE_LOOKBACK):  # newest first
            if other.request.kind == "rma_bundle" and other.request.params.get("drain_action") == drain_id:
                return {"action": other.id, "state": str(other.state), "bundle": other.detail.get("bundle")}
        return None

    # --- mutating handlers ------------------------------------------------------------------------

    async def _decide(self, request: web.Request, verb: str, body_type: type[Any]) -> web.Response:
        record = await self._record(request)
        body = await read_body(request, body_type, required=False)
        if record.state != ActionState.AWAITING_APPROVAL:  # decided, or never held: say what it is
            raise ApiError(409, f"{record.id} is not awaiting approval: {not_held(record.state)}")
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
        return json_response(wire.action_out(updated))

    async def approve(self, request: web.Request) -> web.Response:
        return await self._decide(request, "approve", wire.ApproveRequest)

    async def reject(self, request: web.Request) -> web.Response:
        return await self._decide(request, "reject", wire.RejectRequest)

    async def _submit(self, request: ActionRequest) -> web.Response:
        record = await self.coordinator.engine.submit(request)
        started = record.state in (ActionState.PENDING, ActionState.RUNNING)
        return json_response(wire.action_out(record), 202 if started else 200)

    @staticmethod
    def _force(body: wire.ManualRequest) -> dict[str, Any]:
        try:
            return body.force_params()
        except ValueError as exc:
            raise ApiError(400, f"request body: {exc}") from None

    def _known_node(self, request: web.Request) -> str:
        node: str = path_param(request, "node", wire.NodeName)
        if node not in self.coordinator.state.nodes:
            raise ApiError(404, f"node {node!r} is not known to the coordinator (no agent has reported it)")
        return node

    async def _manual(
        self,
        kind: ActionKind | str,
        target: str,
        body: wire.DrainRequest | wire.ResumeRequest | wire.RestartRequest | wire.BurnInRequest,
        params: dict[str, Any] | None = None,
    ) -> web.Response:
        """An operator's action: through the engine like a rule's, its rule ``api:<by>``, forced if asked."""
        return await self._submit(
            ActionRequest(
                kind=kind,
                target=target,
                reason=body.reason,
                params={**(params or {}), **self._force(body)},
                rule=f"api:{body.by}",
            )
        )

    async def drain(self, request: web.Request) -> web.Response:
        node = self._known_node(request)
        body = await read_body(request, wire.DrainRequest, required=True)
        return await self._manual(ActionKind.DRAIN_NODE, node, body)

    async def resume(self, request: web.Request) -> web.Response:
        node = self._known_node(request)
        body = await read_body(request, wire.ResumeRequest, required=False)
        return await self._manual(ActionKind.RESUME_NODE, node, body)

    async def burn_in(self, request: web.Request) -> web.Response:
        """Issue #36: the ``burn_in`` action on a node (:mod:`ftd.coordinator.actions.burn_in`)."""
        node = self._known_node(request)
        body = await read_body(request, wire.BurnInRequest, required=False)
        return await self._manual(BURN_IN, node, body)

    async def restart(self, request: web.Request) -> web.Response:
        job: str = path_param(request, "job", wire.JobId)
        if job not in self.coordinator.state.jobs:
            raise ApiError(404, f"job {job!r} is not known to the coordinator (no rank has registered)")
        body = await read_body(request, wire.RestartRequest, required=True)
        exclude = {"exclude": sorted(set(body.exclude))}
        return await self._manual(ActionKind.CHECKPOINT_RESTART, job, body, exclude)

    async def announce(self, request: web.Request) -> web.Response:
        """An operator's interruption (issue #37) as an ``interruption`` event into the engine, like
        one from a watcher; the interruption rule decides what to do about it."""
        body = await read_body(request, wire.InterruptionRequest, required=True)
        if (body.node is None) == (body.job is None):
            raise ApiError(400, "request body: give node or job (one of them)")
        if (body.deadline is None) == (body.in_s is None):
            raise ApiError(400, "request body: give deadline (epoch seconds) or in_s (one of them)")
        now = time.time()
        deadline = body.deadline if body.deadline is not None else now + (body.in_s or 0.0)
        try:
            check_deadline(now, deadline)
        except BadDeadline as err:
            raise ApiError(400, f"deadline refused: {err.reason}") from None
        state = self.coordinator.state
        node, job = body.node or "", body.job or ""
        if job:
            record = state.jobs.get(job)
            if record is None or not record.nodes:
                raise ApiError(404, f"job {job!r} is not known to the coordinator (no rank has registered)")
            node = record.nodes[0]
        elif node not in state.nodes:
            raise ApiError(404, f"node {node!r} is not known to the coordinator (no agent has reported it)")
        ref = f"operator-{uuid.uuid4().hex[:12]}"
        data = msgspec.structs.asdict(
            Interruption(
                source="operator", deadline=deadline, notice_at=now, job=job, ref=ref, detail=body.reason
            )
        )
        event = make_event(node, Kind.INTERRUPTION, source="coordinator", data=data, ts=now)
        log.info("interruption_announced", node=node, job=job, deadline=deadline, ref=ref, by=body.by)
        records = await self.coordinator.engine.handle_event(event)
        out = wire.InterruptionOut(
            event_id=event.id,
            node=node,
            job=job,
            deadline=deadline,
            ref=ref,
            actions=[wire.action_out(r) for r in records],
        )
        return json_response(out, 202)


def not_held(state: ActionState) -> str:
    """What an action that is not awaiting approval is, in words an approver understands."""
    if state in (ActionState.PENDING, ActionState.RUNNING):
        return f"it is already {state} (approved, or never held)"
    if state == ActionState.DRY_RUN:
        return "it was only recorded (dry run): there is nothing to approve"
    if state == ActionState.LOGGED:
        return "it was already logged"
    if state == ActionState.SUPPRESSED:
        return "it was already suppressed (rejected, or held back by the policy gate)"
    return f"it already {state}"  # succeeded, failed, escalated


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
