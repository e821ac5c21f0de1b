"""Fixtures shared by the contract tests: a private PostgreSQL per test module; a real Mosquitto
with the broker config and ACL exactly as shipped (deploy/mosquitto)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftd.bench.postgres import LocalPostgres
from tests.contract.test_mosquitto_acl import (
    DEPLOY,
    _chown_for_broker,
    _mosquitto_dir,
    deploy_conf_lines,
    make_passwd,
)
from tests.realparts import Mosquitto, start_postgres

# The logins of ``shipped_broker``; each one's password is also in ``<workdir>/<user>.pw``.
SHIPPED_USERS = {
    "coordinator": "pw-coordinator",
    "coordinator-standby": "pw-standby",
    "node-1": "pw-node-1",
}


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPostgres]:
    """A PostgreSQL this module starts on a free port (skipped without the package, failed under
    ``FTD_REQUIRE_REAL=1``); each test takes a database of its own (``fresh_database``)."""
    server = start_postgres(tmp_path_factory.mktemp("pg"))
    yield server
    server.remove()


@pytest.fixture(scope="module")
def shipped_broker() -> Iterator[tuple[Mosquitto, Path]]:
    """deploy/mosquitto.conf and acl as shipped (no test-only ACL lines), the ``SHIPPED_USERS`` in
    its password file; the broker logs connections. Yields the broker and its work directory."""
    workdir = _mosquitto_dir()
    try:
        make_passwd(workdir, SHIPPED_USERS)
        shutil.copy(DEPLOY / "acl", workdir / "acl")
        _chown_for_broker(workdir / "acl")
        for user, password in SHIPPED_USERS.items():  # the daemons' password files
            (workdir / f"{user}.pw").write_text(password + "\n")
        conf = [*deploy_conf_lines(workdir), "log_type notice", "log_type information"]
        assert "use_username_as_clientid true" in conf
        (workdir / "broker").mkdir()
        _chown_for_broker(workdir / "broker")
        broker = Mosquitto(workdir / "broker", extra_conf=conf).start()
        try:
            yield broker, workdir
        finally:
            broker.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
