"""A strict, in-process fake of the few kube-apiserver endpoints ftd uses (aiohttp, free loopback port).

It serves nodes and pods from dicts, applies JSON merge patches (RFC 7386) to nodes the way the API
server does (``metadata.resourceVersion`` in the patch is a precondition: 409 on mismatch), and
implements the Eviction subresource (201, 404 for a missing pod, 429 for a pod "protected by a
PodDisruptionBudget"). It records every request (method, path, query, content type, JSON body) so
tests can check exactly what was sent, and it is strict so a wrong client fails the test:

* no/incorrect bearer token -> 401; unknown path -> 404; known path, wrong method -> 405;
* PATCH without ``application/merge-patch+json`` (or JSON-patch / strategic-merge) -> 415, and the
  test asserts which one was used; POST/DELETE bodies must be ``application/json`` -> 415 otherwise;
* an Eviction body that is not ``policy/v1`` ``Eviction`` naming the pod in the path -> 400;
* an unsupported ``fieldSelector`` / ``labelSelector`` -> 400.
"""

from __future__ import annotations

import copy
import json
import socket
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

PATCH_TYPES = {
    "application/merge-patch+json",
    "application/json-patch+json",
    "application/strategic-merge-patch+json",
}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    body: Any


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


@dataclass
class FakeKubeApi:
    token: str = "test-token"
    accept_patch_types: set[str] = field(default_factory=lambda: {"application/merge-patch+json"})
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (ns, name) -> pod
    pdb_protected: set[tuple[str, str]] = field(default_factory=set)
    conflict_next_patch: int = 0  # answer this many node patches with 409 (a concurrent writer)
    requests: list[Request] = field(default_factory=list)
    port: int = 0
    _rv: int = 100
    _runner: web.AppRunner | None = None

    # -- fixtures ---------------------------------------------------------------------------------

    def add_node(
        self,
        name: str,
        *,
        unschedulable: bool = False,
        taints: list[dict[str, Any]] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> None:
        self._rv += 1
        spec: dict[str, Any] = {}
        if unschedulable:
            spec["unschedulable"] = True
        if taints:
            spec["taints"] = taints
        self.nodes[name] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "resourceVersion": str(self._rv),
                "annotations": dict(annotations or {}),
                "labels": {"kubernetes.io/hostname": name},
            },
            "spec": spec,
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }

    def add_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        *,
        labels: dict[str, str] | None = None,
        owner_kind: str | None = None,
        mirror: bool = False,
        phase: str = "Running",
        restarts: int = 0,
    ) -> None:
        meta: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels or {}),
            "annotations": {},
            "uid": f"uid-{namespace}-{name}",
        }
        if owner_kind:
            meta["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": owner_kind,
                    "name": "owner",
                    "uid": "owner-uid",
                    "controller": True,
                }
            ]
        if mirror:
            meta["annotations"]["kubernetes.io/config.mirror"] = "abc"
        self.pods[(namespace, name)] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "trainer:1"}]},
            "status": {
                "phase": phase,
                "containerStatuses": [
                    {
                        "name": "main",
                        "image": "trainer:1",
                        "imageID": "",
                        "ready": True,
                        "restartCount": restarts,
                    }
                ],
            },
        }

    def calls(self, method: str | None = None) -> list[Request]:
        return [r for r in self.requests if method is None or r.method == method]

    # -- server -----------------------------------------------------------------------------------

    async def start(self) -> FakeKubeApi:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_route("GET", "/api/v1/nodes", self._list_nodes)
        app.router.add_route("GET", "/api/v1/nodes/{name}", self._get_node)
        app.router.add_route("PATCH", "/api/v1/nodes/{name}", self._patch_node)
        app.router.add_route("PATCH", "/api/v1/nodes/{name}/status", self._patch_node_status)
        app.router.add_route("GET", "/api/v1/pods", self._list_all_pods)
        app.router.add_route("GET", "/api/v1/namespaces/{ns}/pods", self._list_ns_pods)
        app.router.add_route("DELETE", "/api/v1/namespaces/{ns}/pods/{name}", self._delete_pod)
        app.router.add_route("POST", "/api/v1/namespaces/{ns}/pods/{name}/eviction", self._evict)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        raw = await request.read()
        ctype = request.headers.get("Content-Type")
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                return _status(400, "BadRequest", "body is not JSON")
        self.requests.append(
            Request(
                request.method,
                request.path,
                dict(request.query),
                ctype.split(";")[0].strip() if ctype else None,
                body,
            )
        )
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return _status(401, "Unauthorized", "Unauthorized")
        if (
            raw
            and request.method in ("POST", "DELETE", "PUT")
            and not (ctype or "").startswith("application/json")
        ):
            return _status(415, "UnsupportedMediaType", f"unsupported media type {ctype!r}")
        try:
            result: web.StreamResponse = await handler(request)
        except web.HTTPNotFound:
            return _status(
                404, "NotFound", f"the server could not find the requested resource {request.path}"
            )
        except web.HTTPMethodNotAllowed:
            return _status(405, "MethodNotAllowed", "method not allowed")
        return result

    def _body(self, request: web.Request) -> Any:
        return self.requests[-1].body

    # -- nodes ----------------------------------------------------------------------------------------

    async def _list_nodes(self, request: web.Request) -> web.Response:
        selector = request.query.get("fieldSelector")
        items = list(self.nodes.values())
        if selector == "spec.unschedulable=true":
            items = [n for n in items if n["spec"].get("unschedulable")]
        elif selector is not None:
            return _status(400, "BadRequest", f"unsupported field selector {selector}")
        return web.json_response({"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": items})

    async def _get_node(self, request: web.Request) -> web.Response:
        node = self.nodes.get(request.match_info["name"])
        if node is None:
            return _status(404, "NotFound", f'nodes "{request.match_info["name"]}" not found')
        return web.json_response(node)

    async def _patch_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        ctype = self.requests[-1].content_type
        if ctype not in PATCH_TYPES or ctype not in self.accept_patch_types:
            return _status(415, "UnsupportedMediaType", f"patch type {ctype!r} not accepted by this fake")
        node = self.nodes.get(name)
        if node is None:
            return _status(404, "NotFound", f'nodes "{name}" not found')
        patch = self._body(request)
        if not isinstance(patch, dict):
            return _status(400, "BadRequest", "merge patch must be an object")
        if self.conflict_next_patch > 0:
            self.conflict_next_patch -= 1
            self._rv += 1
            node["metadata"]["resourceVersion"] = str(self._rv)  # someone else wrote the node
            return _status(409, "Conflict", "the object has been modified; please apply your changes")
        rv = patch.get("metadata", {}).get("resourceVersion")
        if rv is not None and rv != node["metadata"]["resourceVersion"]:
            return _status(409, "Conflict", "the object has been modified; please apply your changes")
        for key in patch:
            if key not in ("metadata", "spec"):
                return _status(422, "Invalid", f"ftd should only patch metadata and spec, not {key}")
        merged = merge_patch(node, patch)
        self._rv += 1
        merged["metadata"]["resourceVersion"] = str(self._rv)
        self.nodes[name] = merged
        return web.json_response(merged)

    async def _patch_node_status(self, request: web.Request) -> web.Response:
        """The status subresource, as node-problem-detector writes it: a strategic merge patch whose
        ``status.conditions`` merge into the node's by ``type`` (the kubelet's are kept)."""
        name = request.match_info["name"]
        if self.requests[-1].content_type != "application/strategic-merge-patch+json":
            return _status(415, "UnsupportedMediaType", "status conditions need a strategic merge patch")
        node = self.nodes.get(name)
        if node is None:
            return _status(404, "NotFound", f'nodes "{name}" not found')
        patch = self._body(request)
        if not isinstance(patch, dict) or set(patch) != {"status"} or set(patch["status"]) != {"conditions"}:
            return _status(422, "Invalid", "only status.conditions may be patched here")
        conditions = node.setdefault("status", {}).setdefault("conditions", [])
        for cond in patch["status"]["conditions"]:
            statuses = ("True", "False", "Unknown")
            valid = isinstance(cond, dict) and cond.get("type") and cond.get("status") in statuses
            if not valid:
                return _status(422, "Invalid", f"bad condition {cond!r}")
            old = next((c for c in conditions if c["type"] == cond["type"]), None)
            if old is None:
                conditions.append(dict(cond))
            else:
                old.update(cond)
        self._rv += 1
        node["metadata"]["resourceVersion"] = str(self._rv)
        return web.json_response(node)

    # -- pods -------------------------------------------------------------------------------------

    def _pod_list(self, items: list[dict[str, Any]]) -> web.Response:
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})

    async def _list_all_pods(self, request: web.Request) -> web.Response:
        selector = request.query.get("fieldSelector", "")
        if not selector.startswith("spec.nodeName="):
            return _status(400, "BadRequest", f"unsupported field selector {selector!r}")
        node = selector.split("=", 1)[1]
        return self._pod_list([p for p in self.pods.values() if p["spec"]["nodeName"] == node])

    async def _list_ns_pods(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        selector = request.query.get("labelSelector", "")
        key, sep, value = selector.partition("=")
        if not sep or "," in selector:
            return _status(400, "BadRequest", f"unsupported label selector {selector!r}")
        return self._pod_list(
            [
                p
                for (pns, _), p in self.pods.items()
                if pns == ns and p["metadata"]["labels"].get(key) == value
            ]
        )

    async def _delete_pod(self, request: web.Request) -> web.Response:
        key = (request.match_info["ns"], request.match_info["name"])
        body = self._body(request)
        if body is not None and (body.get("kind") != "DeleteOptions" or body.get("apiVersion") != "v1"):
            return _status(400, "BadRequest", "body must be a v1 DeleteOptions")
        pod = self.pods.pop(key, None)
        if pod is None:
            return _status(404, "NotFound", f'pods "{key[1]}" not found')
        return web.json_response(pod)

    async def _evict(self, request: web.Request) -> web.Response:
        key = (request.match_info["ns"], request.match_info["name"])
        body = self._body(request)
        meta = body.get("metadata", {}) if isinstance(body, dict) else {}
        if (
            not isinstance(body, dict)
            or body.get("apiVersion") != "policy/v1"
            or body.get("kind") != "Eviction"
            or meta.get("name") != key[1]
            or meta.get("namespace") != key[0]
        ):
            return _status(400, "BadRequest", f"not a policy/v1 Eviction for {key}: {body!r}")
        if key not in self.pods:
            return _status(404, "NotFound", f'pods "{key[1]}" not found')
        if key in self.pdb_protected:
            return _status(
                429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget."
            )
        del self.pods[key]
        return web.json_response(
            {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}, status=201
        )
