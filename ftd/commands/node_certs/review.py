"""Whether a CertificateSigningRequest of ftd's signer gets a node certificate: a pure decision.

What: :func:`review` takes the CSR object as the API server stored it and what its PEM request asks
for (:class:`~ftd.commands.node_certs.pki.RequestInfo`) and answers approve or deny, with a reason
(CamelCase, for the condition) and a message. Why pure: the rule is the security of the flow, so it
is tested on its own, case by case, without an API server or openssl.

The rule: approve only when
  * ``spec.signerName`` is ftd's (:data:`SIGNER`);
  * the requestor (``spec.username``, set by the API server, not by the requester) is the agent's
    service account;
  * the API server recorded the node of the requesting pod's bound token
    (``spec.extra["authentication.kubernetes.io/node-name"]``, Kubernetes >= 1.30, feature
    ServiceAccountTokenPodNodeInfo) and the request's subject is exactly ``CN=<that node>``: a pod
    on node A can never get node B's identity on the bus;
  * the request's self-signature verifies, it asks for no extensions (no SANs), and its usages are
    client ones (``client auth`` required; ``digital signature``, ``key encipherment`` allowed).
Anything else is denied, with the first reason that applies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ftd.commands.node_certs.pki import RequestInfo

SIGNER = "ftd.dev/node-client"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
REQUIRED_USAGE = "client auth"
ALLOWED_USAGES = frozenset({"client auth", "digital signature", "key encipherment"})
_NODE_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


@dataclass(frozen=True)
class Verdict:
    approve: bool
    reason: str  # CamelCase, the condition's reason
    message: str


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def _deny(reason: str, message: str) -> Verdict:
    return Verdict(False, reason, message)


def review(csr: Mapping[str, Any], request: RequestInfo, *, agent_user: str) -> Verdict:
    spec = csr.get("spec") or {}
    if spec.get("signerName") != SIGNER:
        return _deny("WrongSigner", f"signerName {spec.get('signerName')!r} is not {SIGNER}")
    if spec.get("username") != agent_user:
        return _deny("WrongRequestor", f"requested by {spec.get('username')!r}, not by {agent_user}")
    nodes = (spec.get("extra") or {}).get(NODE_NAME_EXTRA)
    if not isinstance(nodes, list) or len(nodes) != 1 or not _NODE_RE.match(str(nodes[0])):
        return _deny(
            "NoNodeName",
            f"the requestor's token names no node ({NODE_NAME_EXTRA} is {nodes!r}): a pod-bound "
            "service-account token on Kubernetes >= 1.30 is needed",
        )
    node = str(nodes[0])
    if request.cn is None:
        return _deny("WrongSubject", f"the subject must be exactly CN={node}, not {request.subject!r}")
    if request.cn != node:
        return _deny("WrongNode", f"CN={request.cn} requested from a pod on node {node}")
    if not request.signature_ok:
        return _deny("BadRequest", "the request's self-signature does not verify")
    if request.has_extensions:
        return _deny("BadRequest", "the request asks for extensions (SANs, usages): ftd's carry none")
    usages = spec.get("usages") or []
    if REQUIRED_USAGE not in usages or not set(usages) <= ALLOWED_USAGES:
        return _deny("WrongUsages", f"usages {usages!r}: client auth only")
    return Verdict(True, "FtdNodeIdentity", f"CN={node} is the node of the requesting agent pod")


__all__ = [
    "ALLOWED_USAGES",
    "NODE_NAME_EXTRA",
    "SIGNER",
    "Verdict",
    "review",
    "service_account_user",
]
