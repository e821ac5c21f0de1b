"""The node-certificate flow against the fake Kubernetes API (tests/fakes/kube_api.py), with real openssl.

``ftd agent-cert``'s request (ftd/commands/node_certs/request.py) and ``ftd cert-signer``
(signer.py) talk to the fake's CertificateSigningRequest endpoints, each with its own token: the
agent's token carries the node the API server recorded for its pod
(``authentication.kubernetes.io/node-name``), the fake writes it into the CSR's ``spec.extra`` as the
API server does. The node CA is made by scripts/make-certs.sh.

- the agent's request for its own node is approved and issued; the certificate verifies against the
  node CA, names the node, is a client certificate, and pairs with the key written (mode 0600);
- a request for another node's CN, from another service account, or from a token without node info
  is denied with its reason and gets no certificate; the agent's command fails saying why;
- a CSR someone else approved is still checked before it is signed (Failed, no certificate);
- other signers' CSRs are left alone; the agent's token may not approve or sign (403);
- the fake refuses what the API server refuses (a client-set requestor, a certificate before
  approval, a stale resourceVersion, a removed Approved condition, a changed spec).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ftd.commands.node_certs.kube import CsrClient
from ftd.commands.node_certs.pki import new_request
from ftd.commands.node_certs.request import CertificateRefused, csr_object, request_certificate
from ftd.commands.node_certs.review import NODE_NAME_EXTRA, SIGNER, service_account_user
from ftd.commands.node_certs.signer import Signer
from tests.e2e.tls_broker import make_certs
from tests.fakes.kube_api import FakeKubeApi

AGENT = service_account_user("ftd-system", "ftd-agent")
NODE = "gpu-a017"


@dataclass
class Cluster:
    api: FakeKubeApi
    ca_dir: Path
    tokens: Path  # one token file per identity: <name>.token

    def client(self, who: str) -> CsrClient:
        return CsrClient(self.api.url, token_file=self.tokens / f"{who}.token", timeout_s=5.0)

    def signer(self) -> Signer:
        return Signer(
            self.client("coordinator"),
            self.ca_dir / "ca.crt",
            self.ca_dir / "ca.key",
            AGENT,
            interval_s=0.05,
        )


IDENTITIES = {
    # the agent pod on gpu-a017 (a pod-bound token, Kubernetes >= 1.30)
    "agent": {
        "username": AGENT,
        "extra": {NODE_NAME_EXTRA: [NODE], "authentication.kubernetes.io/pod-name": ["ftd-agent-x1"]},
    },
    # another workload's service account, on the same node
    "trainer": {"username": "system:serviceaccount:default:trainer", "extra": {NODE_NAME_EXTRA: [NODE]}},
    # the agent's account with a token that names no node (a cluster before 1.30, or a Secret token)
    "agent-nonode": {"username": AGENT, "extra": {}},
}


@contextlib.asynccontextmanager
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    ca_dir = tmp_path / "node-ca"
    make_certs(ca_dir, "ca")
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    api = FakeKubeApi()
    (tokens / "coordinator.token").write_text(api.token)
    for name, identity in IDENTITIES.items():
        api.identities[f"tok-{name}"] = identity
        (tokens / f"{name}.token").write_text(f"tok-{name}\n")
    await api.start()
    try:
        yield Cluster(api, ca_dir, tokens)
    finally:
        await api.stop()


async def issue_with_signer(c: Cluster, who: str, node: str, out: Path) -> tuple[Path, Path]:
    """The agent's request, answered by a running signer (stopped after)."""
    task = asyncio.create_task(c.signer().run())
    try:
        return await request_certificate(c.client(who), node, out, timeout_s=20.0, poll_s=0.05)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def openssl(*args: str) -> str:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    return proc.stdout + proc.stderr


async def test_the_agents_request_for_its_node_is_issued_and_verifies(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        cert, key = await issue_with_signer(c, "agent", NODE, tmp_path / "tls")
        (stored,) = c.api.csrs.values()
    assert (cert, key) == (tmp_path / "tls" / f"{NODE}.crt", tmp_path / "tls" / f"{NODE}.key")
    assert key.stat().st_mode & 0o777 == 0o600
    assert openssl("verify", "-CAfile", str(c.ca_dir / "ca.crt"), str(cert)).strip() == f"{cert}: OK"
    text = openssl(
        "x509", "-in", str(cert), "-noout", "-subject", "-ext", "extendedKeyUsage,basicConstraints"
    )
    assert f"subject=CN = {NODE}" in text and "TLS Web Client Authentication" in text and "CA:FALSE" in text
    assert "Server Authentication" not in text
    # the key on the node is the certificate's
    assert openssl("pkey", "-in", str(key), "-pubout") == openssl(
        "x509", "-in", str(cert), "-noout", "-pubkey"
    )
    # what the API server holds: the requestor, its node, Approved with ftd's reason, the certificate
    assert stored["spec"]["username"] == AGENT and stored["spec"]["signerName"] == SIGNER
    (approved,) = stored["status"]["conditions"]
    assert (approved["type"], approved["reason"]) == ("Approved", "FtdNodeIdentity")
    assert base64.b64decode(stored["status"]["certificate"]) == cert.read_bytes()


@pytest.mark.parametrize(
    ("who", "cn", "reason"),
    [
        ("agent", "gpu-a018", "WrongNode"),  # the agent on gpu-a017 asks for gpu-a018's identity
        ("trainer", NODE, "WrongRequestor"),
        ("agent-nonode", NODE, "NoNodeName"),
    ],
)
async def test_any_other_request_is_denied_with_its_reason(
    tmp_path: Path, who: str, cn: str, reason: str
) -> None:
    async with cluster(tmp_path) as c:
        with pytest.raises(CertificateRefused, match=f"Denied: {reason}"):
            await issue_with_signer(c, who, cn, tmp_path / "tls")
        (stored,) = c.api.csrs.values()
    assert [cond["type"] for cond in stored["status"]["conditions"]] == ["Denied"]
    assert "certificate" not in stored["status"]
    assert not (tmp_path / "tls").exists()  # nothing written: no key without its certificate


async def test_a_csr_approved_by_someone_else_is_still_checked_before_signing(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        _, pem = new_request("gpu-a018")
        agent = c.client("agent")
        created = await agent.create(csr_object("ftd-node-forged", pem, 86400))
        # an administrator approves it by hand (kubectl certificate approve)
        approval = {"type": "Approved", "status": "True", "reason": "KubectlApprove", "message": "by hand"}
        created["status"] = {"conditions": [approval]}
        await c.client("coordinator").update_approval(created)
        signer = c.signer()
        await signer.run_once()
        stored = c.api.csrs["ftd-node-forged"]
    assert [cond["type"] for cond in stored["status"]["conditions"]] == ["Approved", "Failed"]
    assert stored["status"]["conditions"][1]["reason"] == "WrongNode"
    assert "certificate" not in stored["status"]
    assert signer.counts == {"approved": 0, "denied": 0, "issued": 0, "failed": 1}


async def test_other_signers_csrs_are_left_alone_and_agents_cannot_approve(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        _, pem = new_request(NODE)
        other = csr_object("someone-elses", pem, 86400)
        other["spec"]["signerName"] = "kubernetes.io/kube-apiserver-client"
        agent = c.client("agent")
        created = await agent.create(other)
        mine = await agent.create(csr_object("ftd-node-mine", pem, 86400))
        # the agent's own token may not approve its request (RBAC: no signers grant)
        mine["status"] = {"conditions": [{"type": "Approved", "status": "True", "reason": "Self"}]}
        with pytest.raises(Exception, match="HTTP 403"):
            await agent.update_approval(mine)
        signer = c.signer()
        await signer.run_once()
        assert c.api.csrs["someone-elses"] == created  # untouched
        assert signer.counts == {"approved": 1, "denied": 0, "issued": 1, "failed": 0}
        # the signer asked for its signer's CSRs only
        lists = [r for r in c.api.calls("GET") if r.path.endswith("certificatesigningrequests")]
        assert {r.query.get("fieldSelector") for r in lists} == {f"spec.signerName={SIGNER}"}


def test_what_a_request_asks_for_is_read_by_openssl(tmp_path: Path) -> None:
    from ftd.commands.node_certs.pki import read_request

    key, pem = new_request(NODE)
    info = read_request(pem)
    assert (info.cn, info.subject, info.signature_ok, info.has_extensions) == (
        NODE,
        f"CN={NODE}",
        True,
        False,
    )
    (tmp_path / "k.pem").write_bytes(key)

    def req(*extra: str) -> bytes:
        args = ["openssl", "req", "-new", "-key", str(tmp_path / "k.pem"), *extra]
        return subprocess.run(args, capture_output=True, check=True).stdout

    with_san = read_request(req("-subj", f"/CN={NODE}", "-addext", "subjectAltName=DNS:coordinator"))
    assert with_san.cn == NODE and with_san.has_extensions
    two_names = read_request(req("-subj", f"/O=system:masters/CN={NODE}"))
    assert two_names.cn is None and "O=system:masters" in two_names.subject


async def test_the_fake_api_server_is_strict_about_csrs(tmp_path: Path) -> None:
    # The fake refuses what a real API server refuses, so the flow above cannot pass by accident.
    from ftd.commands.node_certs.kube import KubeError

    async with cluster(tmp_path) as c:
        _, pem = new_request(NODE)
        agent, signer = c.client("agent"), c.client("coordinator")
        forged = csr_object("ftd-node-forged", pem, 86400)
        forged["spec"]["username"] = "system:serviceaccount:ftd-system:ftd-agent"  # the server sets it
        with pytest.raises(KubeError, match="HTTP 422"):
            await agent.create(forged)
        short = csr_object("ftd-node-short", pem, 60)  # expirationSeconds below 600
        with pytest.raises(KubeError, match="HTTP 422"):
            await agent.create(short)
        created = await agent.create(csr_object("ftd-node-x", pem, 86400))
        with pytest.raises(KubeError, match="HTTP 409"):
            await agent.create(csr_object("ftd-node-x", pem, 86400))
        issued = copy.deepcopy(created)
        issued["status"] = {"certificate": base64.b64encode(b"-----BEGIN CERTIFICATE-----\n").decode()}
        with pytest.raises(KubeError, match="HTTP 422"):  # a certificate before approval
            await signer.update_status(issued)
        approved = copy.deepcopy(created)
        approved["status"] = {"conditions": [{"type": "Approved", "status": "True", "reason": "T"}]}
        now = await signer.update_approval(approved)
        with pytest.raises(KubeError, match="HTTP 409"):  # a stale resourceVersion
            await signer.update_approval(approved)
        flipped = copy.deepcopy(now)
        flipped["status"]["conditions"] = [{"type": "Denied", "status": "True", "reason": "T"}]
        with pytest.raises(KubeError, match="HTTP 422"):  # an Approved condition is never removed
            await signer.update_approval(flipped)
        changed = copy.deepcopy(now)
        changed["spec"]["usages"] = ["server auth"]
        with pytest.raises(KubeError, match="HTTP 422"):  # spec is immutable
            await signer.update_approval(changed)
        with pytest.raises(KubeError, match="HTTP 400"):
            await signer._call(
                "GET",
                "/apis/certificates.k8s.io/v1/certificatesigningrequests",
                query={"fieldSelector": "spec.username=x"},
            )


async def test_the_commands_as_the_manifests_run_them(tmp_path: Path) -> None:
    # `ftd agent-cert` (the agent's init container: NODE_NAME from the downward API) and
    # `ftd cert-signer --once`, as processes, against the fake API server.
    import os
    import sys

    ftd = str(Path(sys.executable).with_name("ftd"))
    async with cluster(tmp_path) as c:
        env = {**os.environ, "NODE_NAME": NODE}
        api = ["--api", c.api.url, "--api-ca-file", str(tmp_path / "none")]
        agent = await asyncio.create_subprocess_exec(
            ftd, "agent-cert", "--out-dir", str(tmp_path / "tls"), "--timeout", "60",
            "--token-file", str(c.tokens / "agent.token"), *api,
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        async with asyncio.timeout(60):
            for _ in range(1200):  # the agent's CSR is there (then one look of the signer issues it)
                if c.api.csrs:
                    break
                await asyncio.sleep(0.05)
            signer = await asyncio.create_subprocess_exec(
                ftd, "cert-signer", "--once", "--ca-cert", str(c.ca_dir / "ca.crt"),
                "--ca-key", str(c.ca_dir / "ca.key"),
                "--token-file", str(c.tokens / "coordinator.token"), *api,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            signer_out, _ = await signer.communicate()
            agent_out, _ = await agent.communicate()
    assert signer.returncode == 0, signer_out.decode()
    assert agent.returncode == 0, agent_out.decode()
    assert f"(CN={NODE})" in agent_out.decode()
    cert = tmp_path / "tls" / f"{NODE}.crt"
    assert openssl("verify", "-CAfile", str(c.ca_dir / "ca.crt"), str(cert)).strip() == f"{cert}: OK"
    # without the node CA the signer refuses to start, saying which file is missing
    proc = await asyncio.create_subprocess_exec(
        ftd, "cert-signer", "--once", "--ca-key", str(tmp_path / "missing.key"),
        "--ca-cert", str(c.ca_dir / "ca.crt"), *api, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode == 2 and "missing.key is missing" in out.decode()
