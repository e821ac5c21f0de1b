"""ftd's view of the node as a Kubernetes node condition, written the way node-problem-detector does.

What: with ``[agent.kubernetes] node_conditions = true`` the agent keeps one condition on its own
Node object (``status.conditions``, type ``condition_type``, default ``FtdProblem``): ``status
"True"`` while the node has an active critical condition (:mod:`ftd.agent.conditions`: an unresolved
Xid 79, a GPU missing, a full filesystem, GPU processes a job left behind), with a CamelCase
``reason`` (``Xid``, ``GpuMissing``, ``FilesystemFull``, ``LeftoverGpuProcess``, ...) and the
conditions' reasons as ``message``; ``"False"`` / ``FtdHealthy`` otherwise. ``kubectl describe
node``, dashboards and other controllers (cluster autoscaler, remediation operators that act on NPD
conditions) then see what ftd sees.

How: ``PATCH /api/v1/nodes/{node}/status`` with a *strategic merge patch*, which merges
``conditions`` by ``type``, so the kubelet's own conditions (Ready, MemoryPressure, ...) are left
alone. ``lastTransitionTime`` changes only when the status flips; ``lastHeartbeatTime`` on every
write. Written when the conditions change and every ``resync_s`` (a heartbeat, like NPD's). The
bearer token is re-read from ``token_file`` on every write (projected tokens rotate). Errors (API
down, 403 because the RBAC is missing) are logged, counted and retried at the next round: the agent
never stops over them. RBAC: ``nodes/status`` ``patch`` (deploy/kubernetes/base/agent.yaml).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import time
from pathlib import Path
from typing import Any

from ftd.agent.conditions import Condition, ConditionBook
from ftd.config.schema import AgentKubernetesConfig
from ftd.logs import get_logger

log = get_logger(__name__)

STRATEGIC_MERGE = "application/strategic-merge-patch+json"
MAX_MESSAGE = 1024
_REASONS = {
    "xid": "Xid",
    "sxid": "NvswitchXid",
    "gpu_fallen_off_bus": "GpuFallenOffBus",
    "gpu_missing": "GpuMissing",
    "fs_fill": "FilesystemFull",
    "job_leftover": "LeftoverGpuProcess",
}


def _camel(kind: str) -> str:
    return _REASONS.get(kind) or "".join(part.capitalize() for part in kind.split("_")) or "Unknown"


def _rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


class NodeConditionWriter:
    """Keeps the node's ``condition_type`` condition in step with the agent's condition book."""

    name = "node_conditions"

    def __init__(
        self, cfg: AgentKubernetesConfig, node: str, book: ConditionBook, *, clock: Any = time.time
    ) -> None:
        self.cfg = cfg
        self.node = node
        self.book = book
        self._clock = clock
        host = cfg.host
        if host is None:
            svc, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
            host = f"https://{svc}:{port or 443}" if svc else "https://kubernetes.default.svc"
        self.host = host.rstrip("/")
        self._poke = asyncio.Event()
        self._status: str | None = None  # what was last written
        self._since = clock()
        self.writes = 0
        self.errors = 0
        self.last_progress: float | None = None

    def poke(self) -> None:
        """The conditions changed: write now."""
        self._poke.set()

    def condition(self, active: list[Condition]) -> dict[str, Any]:
        now = self._clock()
        status = "True" if active else "False"
        if status != self._status:
            self._since = now
        if active:
            reason = _camel(active[0].kind)
            message = "; ".join(c.reason for c in active)
        else:
            reason, message = "FtdHealthy", "ftd sees no critical condition on this node"
        return {
            "type": self.cfg.condition_type,
            "status": status,
            "reason": reason,
            "message": message[:MAX_MESSAGE],
            "lastHeartbeatTime": _rfc3339(now),
            "lastTransitionTime": _rfc3339(self._since),
        }

    def _ssl(self) -> ssl.SSLContext | bool:
        if not self.host.startswith("https"):
            return False
        ca = self.cfg.ca_file
        return ssl.create_default_context(cafile=ca if ca and Path(ca).exists() else None)

    def _token(self) -> str | None:
        try:
            return Path(self.cfg.token_file).read_text().strip() or None
        except OSError:
            return None

    async def write(self) -> bool:
        """One PATCH of the node's status; True when the API server took it."""
        import aiohttp

        cond = self.condition(self.book.active())
        headers = {"Content-Type": STRATEGIC_MERGE, "Accept": "application/json"}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        url = f"{self.host}/api/v1/nodes/{self.node}/status"
        body = {"status": {"conditions": [cond]}}
        timeout = aiohttp.ClientTimeout(total=self.cfg.timeout_s)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.patch(url, json=body, headers=headers, ssl=self._ssl()) as resp,
            ):
                if resp.status >= 300:
                    text = (await resp.text())[:300]
                    raise OSError(f"HTTP {resp.status}: {text}")
        except (OSError, TimeoutError, aiohttp.ClientError) as exc:
            self.errors += 1
            if self.errors <= 3 or self.errors % 100 == 0:
                log.warning(
                    "node_condition_write_failed", node=self.node, error=str(exc)[:300], count=self.errors
                )
            return False
        if cond["status"] != self._status:
            log.info("node_condition_written", node=self.node, status=cond["status"], reason=cond["reason"])
        self._status = cond["status"]
        self.writes += 1
        return True

    async def run(self) -> None:
        while True:
            self._poke.clear()
            await self.write()
            self.last_progress = time.monotonic()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.cfg.resync_s):
                    await self._poke.wait()


__all__ = ["NodeConditionWriter"]
