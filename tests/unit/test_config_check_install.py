"""``check-config`` fails where the installed daemon would not start: the socket group, the client
certificate's validity, and the systemd credentials the installed unit must provide."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from ftd.commands.config_check import check_config_file, units
from ftd.commands.config_check.references import _validity_problem
from ftd.commands.config_check.units import credentials_of, unit_credential_problems
from ftd.config import ConfigError
from tests.realparts import require_binary


def agent_toml(tmp_path: Path, extra_bus: str = "", extra_agent: str = "") -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(
        f"[bus]\n{extra_bus}\n[agent]\nnode = 'n1'\nkmsg_path = '/dev/null'\n"
        f"state_dir = '{tmp_path}/state'\nsocket_path = '{tmp_path}/a.sock'\n{extra_agent}\n"
    )
    return path


def problems(path: Path) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        check_config_file(path, in_service=False)
    return {p.path: p.message for p in caught.value.problems}


def test_a_socket_group_that_does_not_exist_fails_and_says_how_to_create_it(tmp_path: Path) -> None:
    found = problems(agent_toml(tmp_path, extra_agent="socket_group = 'ftd-no-such-group'"))
    assert list(found) == ["agent.socket_group"]
    assert "no group named 'ftd-no-such-group'" in found["agent.socket_group"]
    assert "groupadd --system ftd-no-such-group" in found["agent.socket_group"]
    check_config_file(agent_toml(tmp_path, extra_agent="socket_group = 'root'"), in_service=False)
    check_config_file(agent_toml(tmp_path, extra_agent="socket_group = 4242"), in_service=False)


def make_cert(tmp_path: Path, cn: str) -> tuple[Path, Path]:
    openssl = require_binary("openssl", package="openssl")
    cert, key = tmp_path / f"{cn}.crt", tmp_path / f"{cn}.key"
    args = ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2"]
    subprocess.run(
        [openssl, *args, "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={cn}"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def test_a_certificate_outside_its_validity_is_named_with_its_dates(tmp_path: Path) -> None:
    cert, _ = make_cert(tmp_path, "n1")
    assert _validity_problem(str(cert)) is None
    expired = _validity_problem(str(cert), now=time.time() + 3 * 86400)
    assert expired is not None and expired.startswith(f"{cert} expired on ") and "renew" in expired
    early = _validity_problem(str(cert), now=time.time() - 86400)
    assert early is not None and "is not valid before" in early
    (tmp_path / "junk.crt").write_text("not a certificate\n")
    assert _validity_problem(str(tmp_path / "junk.crt")) is None  # the load reports it, not this


def test_a_certificate_that_does_not_parse_or_match_its_key_fails(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path, "n1")
    other_cert, other_key = make_cert(tmp_path, "other")
    tls = f"tls = true\nca_file = '{cert}'\n"
    ok = agent_toml(tmp_path, extra_bus=f"{tls}cert_file = '{cert}'\nkey_file = '{key}'")
    check_config_file(ok, in_service=False)
    mismatched = agent_toml(tmp_path, extra_bus=f"{tls}cert_file = '{cert}'\nkey_file = '{other_key}'")
    assert "does not load with bus.key_file" in problems(mismatched)["bus.cert_file"]
    junk = tmp_path / "junk.crt"
    junk.write_text("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
    broken = agent_toml(tmp_path, extra_bus=f"{tls}cert_file = '{junk}'\nkey_file = '{key}'")
    assert "does not load" in problems(broken)["bus.cert_file"]
    assert other_cert.exists()


def test_load_credential_lines_are_read_as_systemd_reads_them() -> None:
    unit = "[Service]\nLoadCredential=api-token:/etc/ftd/api-token\n#LoadCredential=broker-password:/x\n"
    drop_in = "[Service]\nLoadCredential=pgpass:/etc/ftd/pgpass\n"
    assert credentials_of([unit, drop_in]) == {"api-token": "/etc/ftd/api-token", "pgpass": "/etc/ftd/pgpass"}
    assert credentials_of([unit, "[Service]\nLoadCredential=\n"]) == {}  # an empty one resets


def test_the_installed_unit_must_load_each_relative_secret_from_a_readable_file(tmp_path: Path) -> None:
    units_dir = tmp_path / "system"
    units_dir.mkdir()
    secrets = [("bus.password_file", "broker-password"), ("coordinator.api.token_file", "api-token")]
    # no unit installed: nothing to compare with (the names stay "not checked")
    assert unit_credential_problems(secrets, ["coordinator"], [units_dir]) == []
    (units_dir / "ftd-coordinator.service").write_text(
        f"[Service]\nLoadCredential=api-token:{tmp_path}/api-token\n"
    )
    found = {p.path: p.message for p in unit_credential_problems(secrets, ["coordinator"], [units_dir])}
    assert set(found) == {"bus.password_file", "coordinator.api.token_file"}
    assert "loads none by that name (add LoadCredential=broker-password:" in found["bus.password_file"]
    assert f"cannot read {tmp_path}/api-token" in found["coordinator.api.token_file"]
    assert "systemd would not start it" in found["coordinator.api.token_file"]
    (tmp_path / "api-token").write_text("t0ken\n")
    (units_dir / "ftd-coordinator.service.d").mkdir()
    (units_dir / "ftd-coordinator.service.d" / "broker.conf").write_text(
        f"[Service]\nLoadCredential=broker-password:{tmp_path}/api-token\n"
    )
    assert unit_credential_problems(secrets, ["coordinator"], [units_dir]) == []
    # the agent's unit is asked only about the bus's secrets
    (units_dir / "ftd-agent.service").write_text("[Service]\n")
    agent = unit_credential_problems(secrets, ["agent"], [units_dir])
    assert [p.path for p in agent] == ["bus.password_file"]


def test_check_config_reports_the_missing_credential_of_the_installed_unit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    units_dir = tmp_path / "system"
    units_dir.mkdir()
    (units_dir / "ftd-agent.service").write_text("[Service]\nLoadCredential=mqtt-password:/etc/ftd/x\n")
    monkeypatch.setattr(units, "UNIT_DIRS", (units_dir,))
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    config = agent_toml(tmp_path, extra_bus="username = 'n1'\npassword_file = 'broker-password'")
    found = problems(config)
    assert list(found) == ["bus.password_file"]
    assert f"{units_dir}/ftd-agent.service loads none by that name" in found["bus.password_file"]
