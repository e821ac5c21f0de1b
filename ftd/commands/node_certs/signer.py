"""The signer of ftd's node certificates (``ftd cert-signer``, next to the coordinator).

What: every ``interval_s`` it lists the CSRs of ftd's signer (:data:`~.review.SIGNER`, a field
selector) and, for each,
  * not yet decided: reviews it (:func:`~.review.review`) and writes ``Approved`` or ``Denied`` with
    the reason on the ``approval`` subresource;
  * approved and not issued: reviews it again (someone else, ``kubectl certificate approve``, may
    have approved it: the rule holds whoever approved) and writes the node CA's certificate on the
    ``status`` subresource, valid for the request's ``expirationSeconds`` capped at ``max_days``;
    a request that fails the rule gets a ``Failed`` condition instead, with the reason;
  * denied, failed or issued: left alone.
A 409 (someone wrote the object meanwhile) is left for the next round; the node CA's key is read
from a Secret only this container mounts (deploy/kubernetes/base/node-certs.yaml).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftd.commands.node_certs.kube import CsrClient, KubeError
from ftd.commands.node_certs.pki import PkiError, RequestInfo, read_request, sign
from ftd.commands.node_certs.review import SIGNER, Verdict, review
from ftd.logs import get_logger

log = get_logger(__name__)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(kind: str, verdict: Verdict) -> dict[str, Any]:
    now = _now()
    return {
        "type": kind,
        "status": "True",
        "reason": verdict.reason,
        "message": verdict.message[:1024],
        "lastUpdateTime": now,
        "lastTransitionTime": now,
    }


def _has(csr: dict[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind for c in (csr.get("status") or {}).get("conditions") or [])


@dataclass
class Signer:
    client: CsrClient
    ca_cert: Path
    ca_key: Path
    agent_user: str
    max_days: int = 365
    interval_s: float = 5.0
    counts: dict[str, int] = field(
        default_factory=lambda: {"approved": 0, "denied": 0, "issued": 0, "failed": 0}
    )

    def _verdict(self, csr: dict[str, Any]) -> Verdict:
        try:
            pem = base64.b64decode(csr["spec"]["request"], validate=True)
            info = read_request(pem)
        except (KeyError, TypeError, binascii.Error, PkiError) as exc:
            info = RequestInfo(
                cn=None, subject=f"unreadable request ({exc})", signature_ok=False, has_extensions=False
            )
        return review(csr, info, agent_user=self.agent_user)

    def _days(self, csr: dict[str, Any]) -> int:
        seconds = csr["spec"].get("expirationSeconds")
        if not isinstance(seconds, int) or seconds <= 0:
            return self.max_days
        return max(1, min(self.max_days, seconds // 86400))

    async def _decide(self, csr: dict[str, Any]) -> dict[str, Any] | None:
        """Approve or deny; the approved object as the server stored it (it is issued at once)."""
        verdict = self._verdict(csr)
        kind = "Approved" if verdict.approve else "Denied"
        csr.setdefault("status", {}).setdefault("conditions", []).append(_condition(kind, verdict))
        stored = await self.client.update_approval(csr)
        self.counts["approved" if verdict.approve else "denied"] += 1
        log.info(
            "node_csr_decided",
            decision=kind.lower(),
            csr=csr["metadata"]["name"],
            reason=verdict.reason,
            why=verdict.message,
        )
        return stored if verdict.approve else None

    async def _issue(self, csr: dict[str, Any]) -> None:
        verdict = self._verdict(csr)
        status = csr.setdefault("status", {})
        if not verdict.approve:
            status.setdefault("conditions", []).append(_condition("Failed", verdict))
            await self.client.update_status(csr)
            self.counts["failed"] += 1
            log.warning(
                "node_csr_failed", csr=csr["metadata"]["name"], reason=verdict.reason, why=verdict.message
            )
            return
        pem = base64.b64decode(csr["spec"]["request"])
        cert = await asyncio.to_thread(sign, pem, self.ca_cert, self.ca_key, days=self._days(csr))
        status["certificate"] = base64.b64encode(cert).decode()
        await self.client.update_status(csr)
        self.counts["issued"] += 1
        log.info("node_csr_issued", csr=csr["metadata"]["name"], why=verdict.message)

    async def run_once(self) -> None:
        for csr in await self.client.list(SIGNER):
            if csr.get("spec", {}).get("signerName") != SIGNER:
                continue  # a server that ignored the field selector
            name = csr.get("metadata", {}).get("name")
            try:
                if _has(csr, "Denied") or _has(csr, "Failed") or (csr.get("status") or {}).get("certificate"):
                    continue
                if not _has(csr, "Approved"):
                    approved = await self._decide(csr)
                    if approved is None:
                        continue
                    csr = approved
                await self._issue(csr)
            except KubeError as exc:
                log.warning("node_csr_update_failed", csr=name, error=str(exc)[:300])
            except PkiError as exc:
                log.error("node_csr_sign_failed", csr=name, error=str(exc)[:300])

    async def run(self) -> None:
        while True:
            try:
                await self.run_once()
            except KubeError as exc:
                log.warning("node_csr_list_failed", error=str(exc)[:300])
            await asyncio.sleep(self.interval_s)


__all__ = ["Signer"]
