"""The CertificateSigningRequest calls of the node-certificate flow (certificates.k8s.io/v1), over aiohttp.

What: create, get and list CSRs, and update their ``approval`` and ``status`` subresources (both
replaced with ``PUT`` of the whole object, as ``kubectl certificate approve`` does; the object's
``resourceVersion`` makes a concurrent writer's update fail with 409 instead of being lost). The API
server is ``$KUBERNETES_SERVICE_HOST`` in a pod (or ``--api``), the bearer token is re-read from the
projected service-account token file on every call (it rotates), and every call has a timeout. A
failed call raises :class:`KubeError` with the method, path, status and the server's message.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"


class KubeError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, message: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status


def in_cluster_api() -> str:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host:
        return "https://kubernetes.default.svc"
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return f"https://{host}:{port or 443}"


class CsrClient:
    def __init__(
        self,
        api: str | None = None,
        *,
        token_file: Path = SA_DIR / "token",
        ca_file: Path = SA_DIR / "ca.crt",
        timeout_s: float = 10.0,
    ) -> None:
        self.api = (api or in_cluster_api()).rstrip("/")
        self.token_file = token_file
        self.ca_file = ca_file
        self.timeout_s = timeout_s

    def _ssl(self) -> ssl.SSLContext | bool:
        if not self.api.startswith("https"):
            return False
        return ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file.exists() else None)

    async def _call(
        self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None
    ) -> Any:
        import aiohttp

        headers = {"Accept": "application/json"}
        try:
            headers["Authorization"] = f"Bearer {self.token_file.read_text().strip()}"
        except OSError as exc:
            raise KubeError(method, path, 0, f"no service-account token: {exc}") from exc
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.request(
                    method, self.api + path, json=body, params=query, headers=headers, ssl=self._ssl()
                ) as resp,
            ):
                text = await resp.text()
                if resp.status >= 300:
                    raise KubeError(method, path, resp.status, text[:500])
                return await resp.json(content_type=None)
        except (OSError, TimeoutError, aiohttp.ClientError) as exc:
            raise KubeError(method, path, 0, str(exc) or type(exc).__name__) from exc

    async def create(self, csr: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("POST", CSR_PATH, csr)
        return result

    async def get(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", f"{CSR_PATH}/{name}")
        return result

    async def list(self, signer: str) -> list[dict[str, Any]]:
        result = await self._call("GET", CSR_PATH, query={"fieldSelector": f"spec.signerName={signer}"})
        items: list[dict[str, Any]] = result.get("items") or []
        return items

    async def update_approval(self, csr: dict[str, Any]) -> dict[str, Any]:
        return await self._replace(csr, "approval")

    async def update_status(self, csr: dict[str, Any]) -> dict[str, Any]:
        return await self._replace(csr, "status")

    async def _replace(self, csr: dict[str, Any], subresource: str) -> dict[str, Any]:
        # the items of a list carry no apiVersion/kind: the body names them
        body = {**csr, "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest"}
        name = csr["metadata"]["name"]
        result: dict[str, Any] = await self._call("PUT", f"{CSR_PATH}/{name}/{subresource}", body)
        return result


__all__ = ["CSR_PATH", "CsrClient", "KubeError", "in_cluster_api"]
