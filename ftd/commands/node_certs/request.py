"""The agent's side of the node-certificate flow: a key made on the node, a CSR, the issued certificate.

What: :func:`request_certificate` makes a new key on the node (it never leaves the pod), creates a
``certificates.k8s.io/v1`` CertificateSigningRequest for ``CN=<node>`` with ftd's signer, waits until
the signer (``ftd cert-signer``, in the coordinator's pod) issued it, and writes ``<node>.key``
(mode 0600) and ``<node>.crt`` where the agent's ``[bus]`` config reads them. A denied or failed
request raises :class:`CertificateRefused` with the signer's reason; no answer within the timeout
raises :class:`TimeoutError`. Transient API errors (no answer, 5xx) are retried until the deadline.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ftd.commands.node_certs.kube import CsrClient, KubeError
from ftd.commands.node_certs.pki import new_request
from ftd.commands.node_certs.review import SIGNER
from ftd.fileio import write_atomic
from ftd.logs import get_logger

log = get_logger(__name__)

USAGES = ["digital signature", "client auth"]


class CertificateRefused(RuntimeError):
    pass


def csr_object(name: str, request_pem: bytes, expiration_s: int) -> dict[str, Any]:
    return {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "ftd"}},
        "spec": {
            "request": base64.b64encode(request_pem).decode(),
            "signerName": SIGNER,
            "usages": list(USAGES),
            "expirationSeconds": expiration_s,
        },
    }


def _refusal(obj: dict[str, Any]) -> str | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Denied", "Failed") and cond.get("status", "True") == "True":
            return f"{cond['type']}: {cond.get('reason', '')}: {cond.get('message', '')}"
    return None


def _write(out_dir: Path, node: str, cert: bytes, key: bytes) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    key_path, cert_path = out_dir / f"{node}.key", out_dir / f"{node}.crt"
    write_atomic(key_path, key, fsync=True, mode=0o600)
    write_atomic(cert_path, cert, fsync=True, mode=0o644)
    return cert_path, key_path


async def request_certificate(
    client: CsrClient,
    node: str,
    out_dir: Path,
    *,
    expiration_s: int = 365 * 86400,
    timeout_s: float = 300.0,
    poll_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Path, Path]:
    """The node's (certificate, key) paths once issued."""
    key, request = await asyncio.to_thread(new_request, node)
    name = f"ftd-node-{node[:200]}-{secrets.token_hex(4)}"
    deadline = clock() + timeout_s
    await client.create(csr_object(name, request, expiration_s))
    log.info("node_csr_created", csr=name, node=node, signer=SIGNER)
    while True:
        try:
            obj = await client.get(name)
        except KubeError as exc:
            if exc.status not in (0, 429) and exc.status < 500:
                raise
            log.warning("node_csr_get_failed", csr=name, error=str(exc)[:300])
            obj = {}
        refused = _refusal(obj)
        if refused:
            raise CertificateRefused(f"CSR {name}: {refused}")
        issued = (obj.get("status") or {}).get("certificate")
        if issued:
            break
        if clock() >= deadline:
            raise TimeoutError(f"CSR {name} not issued within {timeout_s:g} s (is ftd cert-signer running?)")
        await asyncio.sleep(poll_s)
    cert_path, key_path = _write(out_dir, node, base64.b64decode(issued), key)
    log.info("node_certificate_written", csr=name, node=node, cert=str(cert_path))
    return cert_path, key_path


__all__ = ["USAGES", "CertificateRefused", "csr_object", "request_certificate"]
