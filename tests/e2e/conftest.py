"""Fixtures the end-to-end modules share.

``cluster``: one real multi-node Slurm (munged, slurmctld and one slurmd per node on free ports) per
module that asks for it, started once and stopped after the module's last test; tests call its
``reset()`` for a clean queue. Four nodes unless the module sets ``SLURM_NODES``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.multinode_slurm import MultiNodeSlurm


@pytest.fixture(scope="module")
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MultiNodeSlurm]:
    nodes = int(getattr(request.module, "SLURM_NODES", 4))
    slurm = MultiNodeSlurm(tmp_path_factory.mktemp("slurm"), nodes=nodes).start()
    try:
        yield slurm
    finally:
        slurm.stop()
