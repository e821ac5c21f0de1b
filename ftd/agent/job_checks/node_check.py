"""The node's share of the RDMA path, for ``ftd preflight``: peermem, ACS and the IOMMU.

What: :func:`rdma_node_check` reads the node-level facts of :mod:`ftd.agent.job_checks.facts` (is the
node on InfiniBand, ``nvidia_peermem`` loaded, ACS on the bridges above the GPUs and NICs, the IOMMU
mode) and judges them like a job's (:func:`ftd.platform.rdma.judge`). A job's own facts (its ranks'
memlock and ``/dev/shm``, its rendezvous, NCCL's transport) exist only once it runs: they are checked
at its start, not here. Returns ``(status, reason)`` for the preflight runner's ``rdma`` check:
``fail`` on an error-level cause (``no_peermem`` on an IB node); ``skip`` when a node fact could not be
read (each named with its reason, with what passed: an unread fact is never a pass); else ``pass``,
the warnings (ACS, a translating IOMMU) named.

Why not in :mod:`ftd.agent.preflight` itself: the readers live here, beside the job check that uses
them; the preflight's callers (``ftd preflight``, the agent's hooks) hand this check to the runner.
"""

from __future__ import annotations

from ftd.agent.job_checks import facts
from ftd.agent.job_checks.checker import Roots
from ftd.config.schema import JobChecksConfig
from ftd.platform.rdma import Fact, PathFacts, judge

__all__ = ["NODE_FACTS", "rdma_node_check"]

NODE_FACTS = ("peermem", "acs", "iommu")


def rdma_node_check(cfg: JobChecksConfig, roots: Roots | None = None) -> tuple[str, str]:
    """``(pass | fail | skip, reason)``; see the module docstring."""
    where = roots or Roots()
    said = {"yes": True, "no": False}.get(cfg.infiniband)
    got = PathFacts(
        ib_cluster=facts.ib_node(where.sys, said),
        peermem=facts.peermem(where.modules),
        acs=facts.acs_ports(where.sys) if cfg.acs else Fact.unknown("turned off (acs = false)"),
        iommu=facts.iommu_mode(where.sys, where.cmdline),
    )
    verdict = judge(got)
    wanted = NODE_FACTS if cfg.acs else tuple(f for f in NODE_FACTS if f != "acs")  # off: not unknown
    unknown = {k: v for k, v in verdict.unknown.items() if k in wanted}
    passed = [p for p in verdict.passed if p.split(" ", 1)[0] in NODE_FACTS]
    errors = [c for c in verdict.causes if c.severity == "error"]
    warnings = [c for c in verdict.causes if c.severity != "error"]
    said_unknown = "; ".join(f"{k} unknown: {v}" for k, v in sorted(unknown.items()))
    if errors:
        return "fail", "; ".join(c.detail for c in errors)
    parts = [f"{', '.join(passed) or 'nothing'} passed"]
    parts += [f"warning: {c.detail}" for c in warnings]
    if said_unknown:  # not all of it could be read: not a pass (the preflight lists it as skipped)
        return "skip", "; ".join([said_unknown, *parts])
    return "pass", "; ".join(parts)
