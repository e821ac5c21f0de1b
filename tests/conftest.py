"""Shared fixtures: real parts started per test (or per module) on free ports."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from tests.realparts import Mosquitto, SlurmCluster


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
