"""coordinator.ha: defaults keep one SQLite coordinator; the rules between its options are checked."""

from __future__ import annotations

from pathlib import Path

from ftd.commands.config_check import check_references
from ftd.config import check_relations, config_from_data
from ftd.config.credentials import standby_bus
from ftd.config.schema import Config


def test_defaults_are_sqlite_with_a_five_second_lease() -> None:
    ha = Config().coordinator.ha
    assert (ha.ledger, ha.dsn, ha.lease_ttl_s, ha.renew_interval_s) == ("sqlite", None, 5.0, 1.0)


def test_postgresql_needs_a_dsn() -> None:
    problems = check_relations({"coordinator": {"ha": {"ledger": "postgresql"}}})
    assert [(p.path, p.message) for p in problems] == [
        ("coordinator.ha.dsn", "ledger = postgresql needs the database's connection string")
    ]
    assert check_relations({"coordinator": {"ha": {"ledger": "postgresql", "dsn": "host=db"}}}) == []


def test_renewal_must_come_before_the_lease_lapses() -> None:
    problems = check_relations({"coordinator": {"ha": {"renew_interval_s": 5.0}}})
    assert [p.path for p in problems] == ["coordinator.ha.renew_interval_s"]
    assert "lapse" in problems[0].message
    assert check_relations({"coordinator": {"ha": {"renew_interval_s": 2.0, "lease_ttl_s": 3.0}}}) == []


# --- the standby view's login (coordinator.ha.standby_*) ---------------------------------------------

PG = {"ledger": "postgresql", "dsn": "host=db"}
COORDINATOR_LOGIN = {"username": "coordinator", "password_file": "/etc/ftd/mqtt-password"}


def _config(bus: dict[str, object], ha: dict[str, object]) -> Config:
    return config_from_data({"bus": bus, "coordinator": {"ha": {**PG, **ha}}})


def test_the_standby_login_follows_the_bus_login_rules_at_its_own_paths() -> None:
    user_only = check_relations({"coordinator": {"ha": {**PG, "standby_username": "coordinator-standby"}}})
    assert [(p.path, p.message) for p in user_only] == [
        (
            "coordinator.ha.standby_username",
            "a user name needs a password: set coordinator.ha.standby_password_file",
        )
    ]
    password_only = check_relations({"coordinator": {"ha": {**PG, "standby_password_file": "pw"}}})
    assert [p.path for p in password_only] == ["coordinator.ha.standby_password_file"]
    assert "needs coordinator.ha.standby_username" in password_only[0].message
    both = {**PG, "standby_username": "coordinator-standby", "standby_password_file": "pw"}
    assert check_relations({"coordinator": {"ha": both}}) == []


def test_a_standby_login_without_a_postgresql_ledger_is_reported() -> None:
    ha = {"standby_username": "coordinator-standby", "standby_password_file": "pw"}
    problems = check_relations({"coordinator": {"ha": ha}})
    assert [p.path for p in problems] == ["coordinator.ha.standby_username"]
    assert "ledger is not postgresql" in problems[0].message


def test_the_standby_certificate_is_checked_like_the_bus_one(tmp_path: Path) -> None:
    config = _config({"tls": False}, {"standby_cert_file": str(tmp_path / "standby.crt")})
    problems = [(p.path, p.message) for p in check_references(config, roles=["coordinator"])]
    assert (
        "coordinator.ha.standby_cert_file",
        "is set but coordinator.ha.standby_key_file is not: mutual TLS needs both",
    ) in problems
    assert ("coordinator.ha.standby_cert_file", "is set but bus.tls is not true; set tls = true") in problems
    tls = _config(
        {"tls": True},
        {"standby_cert_file": str(tmp_path / "standby.crt"), "standby_key_file": str(tmp_path / "k")},
    )
    missing = [p.path for p in check_references(tls, roles=["coordinator"])]
    assert "coordinator.ha.standby_cert_file" in missing and "coordinator.ha.standby_key_file" in missing
    assert not [p for p in missing if p.startswith("bus.")]


def test_the_standby_password_file_is_read_at_start(tmp_path: Path) -> None:
    ha = {"standby_username": "coordinator-standby", "standby_password_file": str(tmp_path / "absent")}
    problems = check_references(_config({}, ha), roles=["coordinator"])
    assert "coordinator.ha.standby_password_file" in [p.path for p in problems]
    (tmp_path / "absent").write_text("secret\n")
    problems = check_references(_config({}, ha), roles=["coordinator"])
    assert "coordinator.ha.standby_password_file" not in [p.path for p in problems]


def test_the_view_logs_in_with_the_standby_login_and_never_the_bus_client_id() -> None:
    ha = {"standby_username": "coordinator-standby", "standby_password_file": "/run/standby-pw"}
    bus = {"username": "coordinator", "password": "coordinator-pw", "client_id": "ftd-coordinator"}
    view, why_not = standby_bus(_config(bus, ha))
    assert why_not is None and view is not None
    assert (view.username, view.password, view.password_file) == (
        "coordinator-standby",
        None,
        "/run/standby-pw",
    )
    assert view.client_id is None and view.cert_file is None


def test_no_view_where_it_would_log_in_as_the_coordinator() -> None:
    for bus in (COORDINATOR_LOGIN, {"tls": True, "cert_file": "c.crt", "key_file": "c.key"}):
        view, why_not = standby_bus(_config(bus, {}))
        assert view is None and why_not is not None and "standby_username" in why_not
    view, why_not = standby_bus(_config({"client_id": "ftd-coordinator"}, {}))  # anonymous: no name to
    assert view is not None and view.client_id is None and why_not is None  # take, the view's own id
    anonymous, why_not = standby_bus(_config({}, {}))  # demo, tests: the bus as it is
    assert anonymous == Config().bus and why_not is None
