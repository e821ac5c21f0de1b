"""The rule of ftd's node-certificate signer (ftd/commands/node_certs/review.py), case by case.

A CSR gets a node certificate only when ftd's signer, the agent's service account and the node the
API server recorded for the requesting pod's token all agree with a request for exactly CN=<node>;
each way of breaking one of them is denied with its own reason.
"""

from __future__ import annotations

from typing import Any

import pytest

from ftd.commands.node_certs.pki import RequestInfo
from ftd.commands.node_certs.review import NODE_NAME_EXTRA, SIGNER, review, service_account_user

AGENT = service_account_user("ftd-system", "ftd-agent")
GOOD = RequestInfo(cn="gpu-a017", subject="CN=gpu-a017", signature_ok=True, has_extensions=False)


def csr(**spec: Any) -> dict[str, Any]:
    base = {
        "signerName": SIGNER,
        "username": AGENT,
        "extra": {NODE_NAME_EXTRA: ["gpu-a017"]},
        "usages": ["digital signature", "client auth"],
    }
    return {"spec": {**base, **spec}}


def test_the_agents_request_for_its_own_node_is_approved() -> None:
    verdict = review(csr(), GOOD, agent_user=AGENT)
    assert verdict.approve and verdict.reason == "FtdNodeIdentity"
    assert "CN=gpu-a017" in verdict.message


@pytest.mark.parametrize(
    ("spec", "request_info", "reason"),
    [
        ({"signerName": "kubernetes.io/kube-apiserver-client"}, GOOD, "WrongSigner"),
        ({"username": "system:serviceaccount:default:trainer"}, GOOD, "WrongRequestor"),
        ({"username": "kubernetes-admin"}, GOOD, "WrongRequestor"),
        ({"extra": {}}, GOOD, "NoNodeName"),  # a token without node info (Kubernetes < 1.30)
        ({"extra": {NODE_NAME_EXTRA: []}}, GOOD, "NoNodeName"),
        ({"extra": {NODE_NAME_EXTRA: ["gpu-a017", "gpu-a018"]}}, GOOD, "NoNodeName"),
        ({"extra": {NODE_NAME_EXTRA: ["Not A Node"]}}, GOOD, "NoNodeName"),
        ({"extra": {NODE_NAME_EXTRA: ["gpu-a018"]}}, GOOD, "WrongNode"),  # a pod on another node
        ({}, RequestInfo("gpu-a018", "CN=gpu-a018", True, False), "WrongNode"),
        ({}, RequestInfo(None, "O=system:masters,CN=gpu-a017", True, False), "WrongSubject"),
        ({}, RequestInfo("gpu-a017", "CN=gpu-a017", False, False), "BadRequest"),
        ({}, RequestInfo("gpu-a017", "CN=gpu-a017", True, True), "BadRequest"),  # SANs asked for
        ({"usages": ["server auth", "client auth"]}, GOOD, "WrongUsages"),
        ({"usages": ["digital signature"]}, GOOD, "WrongUsages"),
        ({"usages": []}, GOOD, "WrongUsages"),
    ],
)
def test_anything_else_is_denied_with_its_reason(
    spec: dict[str, Any], request_info: RequestInfo, reason: str
) -> None:
    verdict = review(csr(**spec), request_info, agent_user=AGENT)
    assert not verdict.approve
    assert verdict.reason == reason, verdict


def test_a_spec_with_nothing_is_denied() -> None:
    assert review({}, GOOD, agent_user=AGENT).reason == "WrongSigner"
    assert review({"spec": None}, GOOD, agent_user=AGENT).reason == "WrongSigner"
