"""Shared fixtures: real parts started per test (or per module) on free ports."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.realparts import Mosquitto


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    broker = Mosquitto(tmp_path / "mosquitto").start()
    try:
        yield broker
    finally:
        broker.stop()
