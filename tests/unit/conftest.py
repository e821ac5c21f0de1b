"""Fixtures shared by the unit tests of the agent's local API and of the trainer client."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator

import pytest

from ftd.agent.local_api import LocalApi
from tests.unit.helpers import Recorder


@pytest.fixture
def sockdir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="ftd", dir="/tmp")  # unix socket paths must stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def rec() -> Recorder:
    return Recorder()


@pytest.fixture
async def api(sockdir: str, rec: Recorder) -> AsyncIterator[LocalApi]:
    """A started LocalApi whose socket lies in a directory it has to create (``run/``)."""
    server = LocalApi(os.path.join(sockdir, "run", "a.sock"), "node1", rec.on_presence, rec.on_ack)
    await server.start()
    yield server
    await server.stop()
