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

CertificateSigningRequests (``certificates.k8s.io/v1``, the node-certificate flow): create, get,
list (``fieldSelector=spec.signerName=...`` only) and ``PUT`` of the ``approval`` and ``status``
subresources. Every token is an identity (``identities``: token -> username and ``extra``; ``token``
is the coordinator's service account); on create the fake records the caller's username, groups and
extra in ``spec``, as the API server does, and refuses a client-set ``username``/``extra`` (422). Only
``csr_signers`` tokens may write approval and status (403 otherwise, like RBAC without the
``signers`` grant); an update needs the stored ``resourceVersion`` (409), may not touch ``spec``
(422), may set only Approved/Denied on ``approval`` and only Failed and ``certificate`` (PEM, after
Approved, once) on ``status``; an Approved or Denied condition is never removed or flipped.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import re
import socket
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
CSR_SPEC_KEYS = {"request", "signerName", "usages", "expirationSeconds"}
KEY_USAGES = {
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
}
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")

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
    token: str | None = None


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


def _pem_of(b64: Any, label: str) -> bytes | None:
    """The bytes of a base64 field holding PEM blocks of ``label`` (None when it is not that)."""
    if not isinstance(b64, str):
        return None
    try:
        raw = base64.b64decode(b64, validate=True)
    except binascii.Error:
        return None
    text = raw.decode(errors="replace")
    if f"-----BEGIN {label}-----" not in text or f"-----END {label}-----" not in text:
        return None
    return raw


def _csr_conditions(csr: dict[str, Any]) -> list[dict[str, Any]]:
    conditions: list[dict[str, Any]] = (csr.get("status") or {}).get("conditions") or []
    return conditions


class _CsrEndpoints:
    """The CertificateSigningRequest routes of :class:`FakeKubeApi` (mixed in below)."""

    token: str
    identities: dict[str, dict[str, Any]]
    csr_signers: set[str] | None
    csrs: dict[str, dict[str, Any]]
    requests: list[Request]
    _rv: int

    def _identity(self) -> dict[str, Any]:
        token = self.requests[-1].token or ""
        default = {"username": "system:serviceaccount:ftd-system:ftd-coordinator", "extra": {}}
        return self.identities.get(token, default)

    def _may_sign(self) -> bool:
        allowed = self.csr_signers if self.csr_signers is not None else {self.token}
        return self.requests[-1].token in allowed

    async def _create_csr(self, request: web.Request) -> web.Response:
        body = self.requests[-1].body
        if not isinstance(body, dict) or body.get("apiVersion") != "certificates.k8s.io/v1":
            return _status(400, "BadRequest", "not a certificates.k8s.io/v1 object")
        if body.get("kind") != "CertificateSigningRequest":
            return _status(400, "BadRequest", f"kind {body.get('kind')!r}")
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        name = meta.get("name")
        if not isinstance(name, str) or not _DNS_SUBDOMAIN.match(name):
            return _status(422, "Invalid", f"metadata.name {name!r} is not a DNS subdomain")
        if "status" in body or set(spec) - CSR_SPEC_KEYS:
            return _status(422, "Invalid", f"only {sorted(CSR_SPEC_KEYS)} may be set on create")
        if _pem_of(spec.get("request"), "CERTIFICATE REQUEST") is None:
            return _status(422, "Invalid", "spec.request is not a base64 PEM CERTIFICATE REQUEST")
        signer = spec.get("signerName")
        if not isinstance(signer, str) or "/" not in signer:
            return _status(422, "Invalid", f"spec.signerName {signer!r}")
        usages = spec.get("usages")
        if not isinstance(usages, list) or not usages or not set(usages) <= KEY_USAGES:
            return _status(422, "Invalid", f"spec.usages {usages!r}")
        expiration = spec.get("expirationSeconds")
        if expiration is not None and (not isinstance(expiration, int) or expiration < 600):
            return _status(422, "Invalid", "spec.expirationSeconds must be >= 600")
        if name in self.csrs:
            return _status(409, "AlreadyExists", f'certificatesigningrequests "{name}" already exists')
        who = self._identity()
        self._rv += 1
        stored = {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {**meta, "uid": f"uid-csr-{name}", "resourceVersion": str(self._rv)},
            "spec": {
                **spec,
                "username": who["username"],
                "groups": list(who.get("groups", ["system:serviceaccounts", "system:authenticated"])),
                "extra": copy.deepcopy(who.get("extra", {})),
            },
            "status": {},
        }
        self.csrs[name] = stored
        return web.json_response(stored, status=201)

    async def _list_csrs(self, request: web.Request) -> web.Response:
        selector = request.query.get("fieldSelector")
        items = list(self.csrs.values())
        if selector is not None:
            key, sep, value = selector.partition("=")
            if key != "spec.signerName" or not sep or "," in selector:
                return _status(400, "BadRequest", f"unsupported field selector {selector!r}")
            items = [c for c in items if c["spec"]["signerName"] == value]
        # as the API server lists them: the items carry no apiVersion/kind (the list does)
        items = [{k: v for k, v in c.items() if k not in ("apiVersion", "kind")} for c in items]
        body = {"kind": "CertificateSigningRequestList", "apiVersion": "certificates.k8s.io/v1"}
        return web.json_response({**body, "metadata": {}, "items": items})

    async def _get_csr(self, request: web.Request) -> web.Response:
        csr = self.csrs.get(request.match_info["name"])
        if csr is None:
            return _status(
                404, "NotFound", f'certificatesigningrequests "{request.match_info["name"]}" not found'
            )
        return web.json_response(csr)

    def _csr_update(
        self, request: web.Request, may_add: set[str]
    ) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]] | web.Response:
        """(stored, sent, sent conditions) for an update of a subresource that may add only the
        condition types ``may_add``, or the error answer."""
        name = request.match_info["name"]
        if not self._may_sign():
            return _status(403, "Forbidden", f"the caller may not approve or sign {name}")
        stored = self.csrs.get(name)
        if stored is None:
            return _status(404, "NotFound", f'certificatesigningrequests "{name}" not found')
        sent = self.requests[-1].body
        if not isinstance(sent, dict) or (sent.get("metadata") or {}).get("name") != name:
            return _status(400, "BadRequest", f"the body is not the CSR {name}")
        kind = (sent.get("apiVersion"), sent.get("kind"))
        if kind != ("certificates.k8s.io/v1", "CertificateSigningRequest"):
            return _status(400, "BadRequest", f"the body is a {kind}, not a certificates.k8s.io/v1 CSR")
        if sent["metadata"].get("resourceVersion") != stored["metadata"]["resourceVersion"]:
            return _status(409, "Conflict", "the object has been modified; please apply your changes")
        if sent.get("spec") != stored["spec"]:
            return _status(422, "Invalid", "spec is immutable")
        old = {c["type"]: c for c in _csr_conditions(stored) if c.get("type") in ("Approved", "Denied")}
        new = _csr_conditions(sent)
        for cond in new:
            if cond.get("status", "True") != "True" or not cond.get("type"):
                return _status(422, "Invalid", f"bad condition {cond!r}")
        types = [c["type"] for c in new]
        if len(types) != len(set(types)) or {"Approved", "Denied"} <= set(types):
            return _status(422, "Invalid", f"conditions {types}: each once, never Approved and Denied")
        if any(t not in types for t in old):
            return _status(422, "Invalid", "an Approved or Denied condition cannot be removed")
        if set(types) - {c["type"] for c in _csr_conditions(stored)} - may_add:
            return _status(422, "Invalid", f"this subresource may add only {sorted(may_add)} conditions")
        return stored, sent, new

    def _store_csr(self, stored: dict[str, Any], status: dict[str, Any]) -> web.Response:
        self._rv += 1
        stored["status"] = status
        stored["metadata"]["resourceVersion"] = str(self._rv)
        return web.json_response(stored)

    async def _csr_approval(self, request: web.Request) -> web.Response:
        checked = self._csr_update(request, {"Approved", "Denied"})
        if isinstance(checked, web.Response):
            return checked
        stored, sent, new = checked
        if (sent.get("status") or {}).get("certificate") != stored["status"].get("certificate"):
            return _status(422, "Invalid", "the certificate is set on the status subresource")
        return self._store_csr(stored, {**stored["status"], "conditions": copy.deepcopy(new)})

    async def _csr_status(self, request: web.Request) -> web.Response:
        checked = self._csr_update(request, {"Failed"})
        if isinstance(checked, web.Response):
            return checked
        stored, sent, new = checked
        old_types = {c["type"] for c in _csr_conditions(stored)}
        cert = (sent.get("status") or {}).get("certificate")
        if cert is not None and cert != stored["status"].get("certificate"):
            if "Approved" not in old_types or "Denied" in old_types:
                return _status(422, "Invalid", "status.certificate may only be set on an approved CSR")
            if stored["status"].get("certificate"):
                return _status(422, "Invalid", "status.certificate cannot change once set")
            if _pem_of(cert, "CERTIFICATE") is None:
                return _status(422, "Invalid", "status.certificate is not base64 PEM CERTIFICATE blocks")
        status = {"conditions": copy.deepcopy(new)}
        if cert is not None:
            status["certificate"] = cert
        return self._store_csr(stored, status)


@dataclass
class FakeKubeApi(_CsrEndpoints):
    token: str = "test-token"
    accept_patch_types: set[str] = field(default_factory=lambda: {"application/merge-patch+json"})
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (ns, name) -> pod
    pdb_protected: set[tuple[str, str]] = field(default_factory=set)
    conflict_next_patch: int = 0  # answer this many node patches with 409 (a concurrent writer)
    requests: list[Request] = field(default_factory=list)
    # token -> {"username": ..., "groups": [...], "extra": {...}}; `token` is the coordinator's
    identities: dict[str, dict[str, Any]] = field(default_factory=dict)
    csr_signers: set[str] | None = None  # tokens allowed to approve and sign; None: `token` only
    csrs: dict[str, dict[str, Any]] = field(default_factory=dict)
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
        deletion_timestamp: str | None = None,
        deletion_grace_s: int | None = None,
        conditions: list[dict[str, Any]] | None = None,
        grace_s: int | None = None,
    ) -> None:
        """A pod; ``deletion_timestamp`` / ``deletion_grace_s``: a graceful deletion under way (the API
        server's ``metadata.deletionTimestamp`` and ``deletionGracePeriodSeconds``); ``conditions``:
        ``status.conditions`` (e.g. ``DisruptionTarget``); ``grace_s``: ``terminationGracePeriodSeconds``."""
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
        if deletion_timestamp is not None:
            meta["deletionTimestamp"] = deletion_timestamp
        if deletion_grace_s is not None:
            meta["deletionGracePeriodSeconds"] = deletion_grace_s
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
        pod = self.pods[(namespace, name)]
        if conditions is not None:
            pod["status"]["conditions"] = [dict(c) for c in conditions]
        if grace_s is not None:
            pod["spec"]["terminationGracePeriodSeconds"] = grace_s

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
        app.router.add_route("POST", CSR_PATH, self._create_csr)
        app.router.add_route("GET", CSR_PATH, self._list_csrs)
        app.router.add_route("GET", CSR_PATH + "/{name}", self._get_csr)
        app.router.add_route("PUT", CSR_PATH + "/{name}/approval", self._csr_approval)
        app.router.add_route("PUT", CSR_PATH + "/{name}/status", self._csr_status)
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
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        self.requests.append(
            Request(
                request.method,
                request.path,
                dict(request.query),
                ctype.split(";")[0].strip() if ctype else None,
                body,
                token,
            )
        )
        if token is None or (token != self.token and token not in self.identities):
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
