"""coordinator.ha: defaults keep one SQLite coordinator; the rules between its options are checked."""

from __future__ import annotations

from ftd.config import check_relations
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
