"""A real Mosquitto as an operator installs it: deploy/mosquitto's config, ACL and mutual-TLS listener,
with the CA and certificates made by ``scripts/make-certs.sh`` (the operator's tool).

What: :func:`tls_broker` (a context manager) makes the PKI (CA, the broker's certificate for
localhost/127.0.0.1, one client certificate per name given: node names, ``coordinator``), writes the
shipped ACL unchanged and the shipped config with its file paths pointed into a temp directory, and
starts the broker. Why apart: the operator-day test needs the whole install (tests/security/
test_mtls.py checks the TLS listener piece by piece with its own module-scoped fixture); the config
pieces are the contract test's (:mod:`tests.contract.test_mosquitto_acl`), reused, not copied.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.contract.test_mosquitto_acl import (
    DEPLOY,
    _chown_for_broker,
    _mosquitto_dir,
    deploy_conf_lines,
    deploy_tls_listener,
    make_passwd,
)
from tests.realparts import Mosquitto, free_port, require_binary, wait_port

MAKE_CERTS = Path(__file__).resolve().parents[2] / "scripts" / "make-certs.sh"


@dataclass
class TlsBroker:
    broker: Mosquitto
    tls_port: int
    pki: Path  # ca.crt, and <name>.crt / <name>.key for every client name

    @property
    def ca(self) -> Path:
        return self.pki / "ca.crt"

    def cert(self, name: str) -> tuple[Path, Path]:
        return self.pki / f"{name}.crt", self.pki / f"{name}.key"


def make_certs(directory: Path, *args: str) -> None:
    subprocess.run([str(MAKE_CERTS), "-d", str(directory), *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def tls_broker(
    pki: Path, clients: list[str], *, users: dict[str, str] | None = None, acl_extra: str = ""
) -> Iterator[TlsBroker]:
    """The shipped broker with mutual TLS; ``clients`` each get a certificate (CN = the name).
    ``users``: password logins for the plain loopback listener; ``acl_extra``: lines added to the ACL."""
    require_binary("openssl", package="openssl")
    make_certs(pki, "ca")
    make_certs(pki, "server", "localhost", "127.0.0.1")
    make_certs(pki, "client", *clients)
    workdir = _mosquitto_dir()
    try:
        # The plain loopback listener still authenticates (allow_anonymous false): a password file
        # must exist; nobody in the operator-day test uses it.
        make_passwd(workdir, users or {"nobody": "unused"})
        (workdir / "acl").write_text((DEPLOY / "acl").read_text() + acl_extra)
        _chown_for_broker(workdir / "acl")
        certs = workdir / "certs"
        certs.mkdir()
        for name in ("ca.crt", "server.crt", "server.key"):
            shutil.copy(pki / name, certs / name)
            _chown_for_broker(certs / name)
        _chown_for_broker(certs)
        port = free_port()
        conf = [
            *deploy_conf_lines(workdir),
            "log_type notice",
            "log_type information",
            *deploy_tls_listener(port, certs),
        ]
        assert "use_username_as_clientid true" in conf and "require_certificate true" in conf
        (workdir / "broker").mkdir()
        _chown_for_broker(workdir / "broker")
        broker = Mosquitto(workdir / "broker", extra_conf=conf).start()
        try:
            wait_port(port)
            yield TlsBroker(broker, port, pki)
        finally:
            broker.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
