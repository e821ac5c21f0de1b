"""Node client certificates on Kubernetes, no files on the hosts: ``ftd agent-cert``, ``ftd cert-signer``.

What: the agent pod's init container runs ``ftd agent-cert``: a key made in the pod, a
CertificateSigningRequest (signer ``ftd.dev/node-client``, CN = the node name from the downward API),
the issued certificate written where the agent's ``[bus]`` config reads it (:mod:`.request`). A
container in the coordinator's pod runs ``ftd cert-signer``: it approves only the agent service
account's requests whose CN is the node the API server recorded for the requesting pod's token, signs
them with the node CA, and denies everything else with a reason (:mod:`.signer`, the rule in
:mod:`.review`). Why here (commands, not a daemon): each is a small program of its own; the
coordinator's and the agent's processes are unchanged and keep no CA key. Install:
deploy/kubernetes/base (agent.yaml, node-certs.yaml), docs/operators.md "Install on Kubernetes".
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

from ftd.commands.node_certs.kube import SA_DIR, CsrClient, KubeError
from ftd.commands.node_certs.pki import PkiError
from ftd.commands.node_certs.review import service_account_user


def _client(args: argparse.Namespace) -> CsrClient:
    return CsrClient(args.api, token_file=Path(args.token_file), ca_file=Path(args.api_ca_file))


def _api_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api", help="the API server (default: the in-cluster one, $KUBERNETES_SERVICE_HOST)"
    )
    parser.add_argument("--token-file", default=str(SA_DIR / "token"), help="bearer token, re-read per call")
    parser.add_argument("--api-ca-file", default=str(SA_DIR / "ca.crt"), help="the API server's CA")


def _agent_cert(args: argparse.Namespace) -> int:
    from ftd.commands.node_certs.request import CertificateRefused, request_certificate
    from ftd.logs import configure

    configure("info", json=True)
    node = args.node or os.environ.get("NODE_NAME")
    if not node:
        print("ftd agent-cert: no node name (--node, or NODE_NAME from the downward API spec.nodeName)")
        return 2
    try:
        cert, key = asyncio.run(
            request_certificate(
                _client(args),
                node,
                Path(args.out_dir),
                expiration_s=args.days * 86400,
                timeout_s=args.timeout,
            )
        )
    except (CertificateRefused, TimeoutError, KubeError, PkiError) as exc:
        print(f"ftd agent-cert: {exc}")
        return 1
    print(f"ftd agent-cert: {cert} and {key} (CN={node})")
    return 0


def _cert_signer(args: argparse.Namespace) -> int:
    from ftd.commands.node_certs.signer import Signer
    from ftd.logs import configure

    configure("info", json=True)
    signer = Signer(
        _client(args),
        Path(args.ca_cert),
        Path(args.ca_key),
        service_account_user(args.agent_namespace, args.agent_service_account),
        max_days=args.max_days,
        interval_s=args.interval,
    )
    for path in (signer.ca_cert, signer.ca_key):
        if not path.is_file():
            print(f"ftd cert-signer: {path} is missing (the node CA Secret, ftd-node-ca)")
            return 2
    try:
        asyncio.run(signer.run_once() if args.once else signer.run())
    except KeyboardInterrupt:
        return 0
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "agent-cert",
        help="obtain this node's bus client certificate through a Kubernetes CSR (agent init container)",
    )
    p.add_argument("--node", help="the node name (default: $NODE_NAME)")
    p.add_argument("--out-dir", default="/etc/ftd/tls", help="writes <node>.crt and <node>.key here")
    p.add_argument("--days", type=int, default=365, help="validity asked for (the signer may cap it)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the certificate")
    _api_options(p)
    p.set_defaults(handler=_agent_cert)

    s = sub.add_parser(
        "cert-signer",
        help="approve and sign the agents' node-certificate CSRs (next to the coordinator, on Kubernetes)",
    )
    s.add_argument("--ca-cert", default="/etc/ftd/node-ca/ca.crt", help="the node CA's certificate")
    s.add_argument("--ca-key", default="/etc/ftd/node-ca/ca.key", help="the node CA's key")
    s.add_argument("--agent-namespace", default="ftd-system")
    s.add_argument("--agent-service-account", default="ftd-agent")
    s.add_argument("--max-days", type=int, default=365, help="the longest validity issued")
    s.add_argument("--interval", type=float, default=5.0, help="seconds between two looks at the CSRs")
    s.add_argument("--once", action="store_true", help="one look, then exit")
    _api_options(s)
    s.set_defaults(handler=_cert_signer)


__all__ = ["register"]
