"""Shared fixtures: real parts started per test (or per module) on free ports; the Hypothesis
profile (:mod:`tests.properties`) and the ``property`` marker every Hypothesis test carries; the
hooks of :mod:`tests.skips` (no skip but a missing GPU under ``FTD_REQUIRE_REAL=1``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from tests import properties
from tests.realparts import Mosquitto, SlurmCluster
from tests.skips import pytest_make_collect_report, pytest_runtest_makereport

# Under FTD_REQUIRE_REAL=1 a skip whose reason is not on tests/skips.py's allow-list fails the run.
__all__ = ["pytest_make_collect_report", "pytest_runtest_makereport"]

properties.load()  # before any test module is imported: their @settings read the profile


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every Hypothesis test is a ``property`` test (``-m "not property"`` leaves them out)."""
    for item in items:
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(pytest.mark.property)


@pytest.fixture(autouse=True)
def _structlog_config_per_test() -> Iterator[None]:
    """A command run in-process (``main([...])``) configures logging for the process, e.g. to
    warning; put it back after each test so a later test capturing info lines sees them."""
    saved = structlog.get_config()
    try:
        yield
    finally:
        structlog.configure(**saved)


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    broker = Mosquitto(tmp_path / "mosquitto").start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """One private Slurm cluster for the whole session (starting it costs about a second)."""
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session cluster, cleaned before and after each test: no jobs left, no node drained."""
    slurm_cluster.reset()
    try:
        yield slurm_cluster
    finally:
        slurm_cluster.reset()
