"""The X.509 work of the node-certificate flow, done by the ``openssl`` command line tool.

What: a node's key and certificate request (:func:`new_request`), what a request asks for
(:func:`read_request`: its subject, whether its self-signature verifies, whether it carries
extensions), and the node CA's signature on an approved request (:func:`sign`). Why the CLI: the
``cryptography`` package is not one of ftd's dependencies and ``openssl`` is on every node and in
the image (deploy/kubernetes/Containerfile), as ``scripts/make-certs.sh`` already relies on it.
The keys are EC P-256, as make-certs.sh makes them; the certificate is a client certificate only
(``extendedKeyUsage=clientAuth``, ``CA:FALSE``).
"""

from __future__ import annotations

import re
import secrets
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

_TIMEOUT_S = 30.0
_CN_ONLY = re.compile(r"^subject=CN\s?=\s?(?P<cn>[^,/=+\\]+)$")
CLIENT_EXTENSIONS = (
    "basicConstraints=critical,CA:FALSE\n"
    "keyUsage=critical,digitalSignature\n"
    "extendedKeyUsage=clientAuth\n"
    "subjectKeyIdentifier=hash\n"
    "authorityKeyIdentifier=keyid\n"
)


class PkiError(RuntimeError):
    """openssl refused or failed; the message is its own."""


@dataclass(frozen=True)
class RequestInfo:
    cn: str | None  # the subject's CN when the subject is exactly one CN, else None
    subject: str  # the whole subject, as openssl prints it (for the denial message)
    signature_ok: bool
    has_extensions: bool  # requested extensions (SANs, key usages): ftd's requests carry none


def _openssl(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    try:
        proc = subprocess.run(
            ["openssl", *args], input=stdin, capture_output=True, timeout=_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PkiError(f"openssl {args[0]}: {exc}") from exc
    return proc


def _checked(*args: str, stdin: bytes | None = None) -> bytes:
    proc = _openssl(*args, stdin=stdin)
    if proc.returncode != 0:
        raise PkiError(f"openssl {args[0]}: {proc.stderr.decode(errors='replace').strip()[:500]}")
    return proc.stdout


def new_request(cn: str) -> tuple[bytes, bytes]:
    """A new EC P-256 key and a request for ``CN=<cn>`` signed with it: (key PEM, request PEM)."""
    key = _checked("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256")
    with tempfile.TemporaryDirectory(prefix="ftd-csr-") as tmp:
        key_path = Path(tmp) / "key.pem"
        key_path.touch(mode=0o600)
        key_path.write_bytes(key)
        csr = _checked("req", "-new", "-key", str(key_path), "-subj", f"/CN={cn}")
    return key, csr


def _requested_extensions(text: str) -> str:
    """The extensions block of ``openssl req -text`` (openssl 3 prints the heading even when empty)."""
    _, found, rest = text.partition("Requested Extensions:")
    return rest.split("Signature Algorithm:", 1)[0].strip() if found else ""


def read_request(csr: bytes) -> RequestInfo:
    """What a PEM request asks for. A request openssl cannot parse raises :class:`PkiError`."""
    subject = _checked("req", "-noout", "-subject", "-nameopt", "RFC2253", stdin=csr).decode().strip()
    verify = _openssl("req", "-noout", "-verify", stdin=csr)
    text = _checked("req", "-noout", "-text", stdin=csr).decode()
    match = _CN_ONLY.match(subject)
    return RequestInfo(
        cn=match["cn"] if match else None,
        subject=subject.removeprefix("subject="),
        signature_ok=verify.returncode == 0,
        has_extensions=bool(_requested_extensions(text)),
    )


def sign(csr: bytes, ca_cert: Path, ca_key: Path, *, days: int) -> bytes:
    """The node CA's client certificate for a request already reviewed (its subject is copied)."""
    with tempfile.TemporaryDirectory(prefix="ftd-sign-") as tmp:
        ext = Path(tmp) / "ext.cnf"
        ext.write_text(CLIENT_EXTENSIONS)
        return _checked(
            "x509",
            "-req",
            "-CA",
            str(ca_cert),
            "-CAkey",
            str(ca_key),
            "-set_serial",
            f"0x{secrets.token_hex(16)}",
            "-days",
            str(max(1, days)),
            "-sha256",
            "-extfile",
            str(ext),
            stdin=csr,
        )


__all__ = ["CLIENT_EXTENSIONS", "PkiError", "RequestInfo", "new_request", "read_request", "sign"]
