"""The tests' multi-node Slurm: :class:`ftd.bench.slurm_multinode.MultiNodeSlurm` (one ``slurmd -N
node-i`` per node, every node runs jobs) whose missing binaries skip the test, or fail it under
``FTD_REQUIRE_REAL=1`` (:func:`tests.realparts.require_binary`). The cluster itself lives in the
package because ``ftd bench recovery`` runs it without the test tree.
"""

from __future__ import annotations

from ftd.bench.slurm_multinode import MultiNodeSlurm as BenchMultiNodeSlurm
from tests.realparts import require_binary

__all__ = ["MultiNodeSlurm"]


class MultiNodeSlurm(BenchMultiNodeSlurm):
    def require(self, name: str, *, package: str) -> str:
        return require_binary(name, package=package)
