"""Fixtures shared by the contract tests: a private PostgreSQL per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ftd.bench.postgres import LocalPostgres
from tests.realparts import start_postgres


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPostgres]:
    """A PostgreSQL this module starts on a free port (skipped without the package, failed under
    ``FTD_REQUIRE_REAL=1``); each test takes a database of its own (``fresh_database``)."""
    server = start_postgres(tmp_path_factory.mktemp("pg"))
    yield server
    server.remove()
