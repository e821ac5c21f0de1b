"""Active/standby under systemd: ftd-coordinator.service plus its drop-in ``ha.conf`` on each host,
and the one config every replica shares (systemd/coordinator-ha.example.toml).

- systemd itself reads the drop-in with the unit and finds nothing wrong (and does report a bad key
  in it, so the drop-in really is read);
- the example is a valid coordinator config for ftd's own checker, on the PostgreSQL ledger, with no
  password in it and no per-host setting (the same file on every host);
- the password reaches libpq the way the drop-in says: a credential named by PGPASSFILE, and the
  unit's hardening leaves the coordinator its TCP connection to the database;
- with a real PostgreSQL that wants a password: a 0400 password file (what systemd makes of a
  credential) named by PGPASSFILE logs in, and the same file readable by others is ignored by libpq.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ftd.commands.config_check import check_config_file
from ftd.config.errors import ConfigError
from tests.realparts import require_binary, start_postgres

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"
UNIT = SYSTEMD / "ftd-coordinator.service"
DROP_IN = SYSTEMD / "ftd-coordinator.service.d" / "ha.conf"
EXAMPLE = SYSTEMD / "coordinator-ha.example.toml"


def settings(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def verify(tmp_path: Path, drop_in: str) -> str:
    """``systemd-analyze verify`` of the unit with ``drop_in`` as its ha.conf; what it printed."""
    analyze = require_binary("systemd-analyze", package="systemd")
    ftd = Path(sys.executable).with_name("ftd")
    text = UNIT.read_text()
    if ftd.exists():  # verify checks that the executable exists: point it at this venv's ftd
        text = text.replace("ExecStart=/opt/ftd/bin/ftd ", f"ExecStart={ftd} ")
    (tmp_path / UNIT.name).write_text(text)
    (tmp_path / DROP_IN.parent.name).mkdir()
    (tmp_path / DROP_IN.parent.name / DROP_IN.name).write_text(drop_in)
    result = subprocess.run(
        [analyze, "verify", f"./{UNIT.name}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


@pytest.mark.real
def test_systemd_reads_the_drop_in_with_the_unit_and_accepts_it(tmp_path: Path) -> None:
    output = verify(tmp_path, DROP_IN.read_text())
    problems = [line for line in output.splitlines() if "ftd-coordinator" in line]
    assert not problems, output


@pytest.mark.real
def test_a_broken_drop_in_is_reported_so_the_check_above_means_something(tmp_path: Path) -> None:
    broken = DROP_IN.read_text().replace("LoadCredential=", "LoadCredentials=")
    output = verify(tmp_path, broken)
    assert "ha.conf" in output and "Unknown key" in output, output


def test_the_password_file_is_a_credential_named_by_pgpassfile() -> None:
    drop_in = settings(DROP_IN.read_text())
    (credential,) = drop_in["LoadCredential"]
    name, _, source = credential.partition(":")
    assert source.startswith("/etc/ftd/")
    env = dict(e.split("=", 1) for e in drop_in["Environment"])
    # %d: the service's credentials directory, where systemd puts the credential (mode 0400)
    assert env["PGPASSFILE"] == f"%d/{name}"
    assert not any(e.startswith("PGPASSWORD") for e in drop_in["Environment"])
    assert "EnvironmentFile" not in drop_in
    # the unit's own credentials are kept (a drop-in adds LoadCredential=, it does not replace them)
    assert {c.split(":")[0] for c in settings(UNIT.read_text())["LoadCredential"]} == {"api-token"}
    assert name not in ("broker-password", "api-token")


def test_the_hardening_leaves_the_replica_its_connection_to_postgresql() -> None:
    unit, drop_in = settings(UNIT.read_text()), settings(DROP_IN.read_text())
    families = unit["RestrictAddressFamilies"][0].split()
    assert {"AF_INET", "AF_INET6"} <= set(families)
    for key in ("IPAddressDeny", "IPAddressAllow", "PrivateNetwork"):
        assert key not in unit and key not in drop_in, key
    assert "RestrictAddressFamilies" not in drop_in  # the unit's families stand
    # the network is up before the replica tries the database (it retries while standing by anyway)
    assert "network-online.target" in unit["After"][0] and unit["Wants"] == ["network-online.target"]


def test_the_example_is_one_valid_config_for_every_replica() -> None:
    checked = check_config_file(EXAMPLE, roles=["coordinator"], files=False)
    ha = checked.config.coordinator.ha
    assert ha.ledger == "postgresql" and ha.dsn is not None
    assert "password" not in ha.dsn.lower()
    assert ha.identity is None  # {hostname}-{pid}: the same file serves every host
    assert ha.renew_interval_s < ha.lease_ttl_s
    # the API token is the unit's credential (a relative name resolves in $CREDENTIALS_DIRECTORY)
    assert checked.config.coordinator.api.token_file == "api-token"


def test_the_checker_refuses_the_example_without_its_dsn(tmp_path: Path) -> None:
    text = EXAMPLE.read_text()
    lines = [line for line in text.splitlines() if not line.startswith("dsn =")]
    assert len(lines) == len(text.splitlines()) - 1
    broken = tmp_path / "coordinator.toml"
    broken.write_text("\n".join(lines))
    with pytest.raises(ConfigError, match=r"coordinator\.ha\.dsn"):
        check_config_file(broken, roles=["coordinator"], files=False)


CONNECT = (
    "import os, psycopg; psycopg.connect(os.environ['DSN'], connect_timeout=5).close(); print('connected')"
)


def _connect(dsn: str, pgpassfile: Path | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["DSN"] = dsn
    env["HOME"] = str(pgpassfile.parent if pgpassfile else "/nonexistent")  # no ~/.pgpass of ours
    if pgpassfile is not None:
        env["PGPASSFILE"] = str(pgpassfile)
    return subprocess.run(
        [sys.executable, "-c", CONNECT], capture_output=True, text=True, timeout=60, env=env, check=False
    )


@pytest.mark.real
def test_libpq_logs_in_with_the_credential_and_ignores_a_readable_password_file(tmp_path: Path) -> None:
    import psycopg

    pg = start_postgres(tmp_path / "pg")
    try:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:  # trust, until the reload below
            conn.execute("ALTER USER ftd PASSWORD 'ha-s3cret'")
            hba = conn.execute("SHOW hba_file").fetchone()
            assert hba is not None
            Path(hba[0]).write_text("host all all 127.0.0.1/32 scram-sha-256\n")
            conn.execute("SELECT pg_reload_conf()")
        refused = _connect(pg.dsn, None)
        assert refused.returncode != 0 and "password" in refused.stderr, refused.stderr

        creds = tmp_path / "credentials"  # what systemd makes of LoadCredential=pgpass:...
        creds.mkdir()
        pgpass = creds / "pgpass"
        pgpass.write_text(f"127.0.0.1:{pg.port}:ftd:ftd:ha-s3cret\n")
        pgpass.chmod(0o400)
        done = _connect(pg.dsn, pgpass)
        assert done.returncode == 0 and "connected" in done.stdout, done.stderr

        pgpass.chmod(0o644)  # libpq ignores a password file others may read
        ignored = _connect(pg.dsn, pgpass)
        assert ignored.returncode != 0, ignored.stdout
        assert "permissions" in ignored.stderr, ignored.stderr
    finally:
        pg.remove()
