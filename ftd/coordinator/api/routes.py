"""The API's routes and its OpenAPI 3.1 document, generated from one table.

:data:`ROUTES` names each route's method, path, handler (a method of
:class:`ftd.coordinator.api.server.Api`), whether it mutates (token required), and the wire types of
its parameters, body and answer; :func:`openapi_document` is built from the same table and the same
msgspec Structs, so the document cannot drift from the code.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import msgspec
from aiohttp import web

from ftd import __version__
from ftd.coordinator.api.wire import (
    ActionId,
    ActionOut,
    ActionsQuery,
    ApproveRequest,
    BisectRequest,
    BurnInRequest,
    DrainRequest,
    Error,
    EventsQuery,
    Health,
    InterruptionOut,
    InterruptionRequest,
    JobId,
    JobOut,
    NodeName,
    NodeOut,
    NodesQuery,
    PlanId,
    PlanOut,
    RejectRequest,
    RestartRequest,
    ResumeRequest,
    RulesOut,
    SummaryOut,
)
from ftd.events import Event
from ftd.logs import get_logger

log = get_logger(__name__)
T = TypeVar("T")

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
    Route(
        "GET",
        "/v1/nodes",
        "nodes",
        "Nodes: online/offline, drained, conditions, state and severity, the action in flight or the "
        "last one; filtered (problems, state, q), sorted (name, severity, last_change) and paged "
        "(limit, offset) on the server. X-Total-Count: how many matched before paging.",
        query=NodesQuery,
        ok=(200, list[NodeOut], ""),
        extra=(400,),
    ),
    Route(
        "GET",
        "/v1/summary",
        "summary",
        "Counts for the first screen: nodes by state and by label value (rack, nvlink_domain), "
        "problems, jobs by state, and the actions in flight or awaiting approval.",
        ok=(200, SummaryOut, ""),
    ),
    Route(
        "GET",
        "/v1/plans/{id}",
        "plan",
        "One plan: the actions one event's rules asked for, in order, each with its state.",
        params=(("id", PlanId),),
        ok=(200, PlanOut, ""),
        extra=(400, 404),
    ),
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
        "/v1/inventory",
        "inventory",
        "What each node runs (driver, CUDA, VBIOS, NIC firmware, OFED, NCCL, kernel, OS; a fact that "
        "could not be read is 'unknown (why)') and its version drift against its hardware profile's "
        "peers and minimums (issue #36).",
        ok=(200, dict[str, Any], ""),
    ),
    Route(
        "GET",
        "/v1/drift",
        "drift",
        "The nodes with version drift now (fields, why, since), the configured action, and how many "
        "nodes reported an inventory and how many could not be judged (no hardware profile).",
        ok=(200, dict[str, Any], ""),
    ),
    Route(
        "GET",
        "/v1/nodes/{node}/inventory",
        "node_inventory",
        "One node's inventory: every fact, each GPU's serial and VBIOS, each NIC's firmware, and its "
        "drift (fields, why, since, the configured action). 404 when it never reported one.",
        params=_NODE,
        ok=(200, dict[str, Any], ""),
        extra=(400, 404),
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
        "/v1/fabric/pairs",
        "pair_matrix",
        "The pair-test matrix (issue #35): per pair and direction the newest throughput, RTT, age and "
        "verdict against the hardware profile's expected bandwidth and the fleet's baseline.",
        ok=(200, dict[str, Any], ""),
    ),
    Route(
        "GET",
        "/v1/fabric/bisect",
        "bisection",
        "The last bisection (issue #35): nodes tested, each pair test's verdict, the node(s) or link(s) "
        "pinned or only likely, and whether one is running. 404 when pair tests are disabled.",
        ok=(200, dict[str, Any], ""),
        extra=(404,),
    ),
    Route(
        "POST",
        "/v1/fabric/bisect",
        "bisect",
        "Start a bisection over idle or drained nodes (suspects first), each test a pair_test action "
        "through the policy gate. 409 while one runs, or with fewer than two idle nodes to test.",
        mutating=True,
        body=BisectRequest,
        ok=(202, dict[str, Any], ""),
        extra=(400, 404, 409),
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
        "GET",
        "/v1/action-phases",
        "action_phases",
        "The named phases of each action kind whose executor has them (built-in and plugins'), in "
        "the order the engine runs them, e.g. checkpoint_restart: stop, requeue, restart, resume; a "
        "kind not listed runs as one step. An action's detail.phases_done lists those it finished.",
        ok=(200, dict[str, list[str]], ""),
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
        extra=(400, 404, 409),
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
        extra=(400, 404, 409),
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
        "/v1/nodes/{node}/burn-in",
        "burn_in",
        "Run a node's burn-in (a drained or new node; the agent refuses while a job runs there); the "
        "report is the action's detail and a burn_in event.",
        mutating=True,
        params=_NODE,
        body=BurnInRequest,
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
    Route(
        "POST",
        "/v1/interruptions",
        "announce",
        "Announce an interruption of a node or a job by a deadline (issue #37): fed to the rules.",
        mutating=True,
        body=InterruptionRequest,
        body_required=True,
        ok=(202, InterruptionOut, ""),
        extra=(400, 404),
    ),
)


_STATUS_TEXT = {
    200: "OK",
    202: "Accepted (the action started)",
    400: "Invalid input",
    401: "Missing or wrong token",
    403: "Mutating calls are disabled (no token configured)",
    404: "Unknown id",
    409: "The action is not awaiting approval (the message says what it is: already succeeded, ...)",
    421: "The Host header names no host this API serves (DNS rebinding protection)",
    429: "Too many failed token checks from this address: retry after Retry-After seconds",
}


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


def _force_needs_its_reason(schema: dict[str, Any]) -> None:
    """A manual request's ``force`` needs ``force_reason`` (the handler answers 400 without it): say
    so in the schema too (JSON Schema ``if``/``then``), so that what the document allows is accepted."""
    properties = schema.get("properties", {})
    if "force" in properties and "force_reason" in properties:
        schema["if"] = {"properties": {"force": {"const": True}}, "required": ["force"]}
        schema["then"] = {
            "properties": {"force_reason": {"type": "string"}},
            "required": ["force_reason"],
        }


def openapi_document() -> dict[str, Any]:
    types: list[Any] = [Error]
    for route in ROUTES:
        if route.body is not None:
            types.append(route.body)
        if route.ok[1] is not None and route.ok[2] == "":
            types.append(route.ok[1])
    schemas, components = msgspec.json.schema_components(types, ref_template="#/components/schemas/{name}")
    for component in components.values():
        _force_needs_its_reason(component)
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
