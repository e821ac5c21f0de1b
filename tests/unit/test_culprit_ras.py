"""NCCL RAS's STATUS text read for the processes it reports missing or dead
(:mod:`ftd.culprit.ras`), and the verdict mapping them to the job's ranks.

The sample is written here in the layout NCCL 2.28's RAS client prints (src/ras/client_support.cc's
format strings), with this test's own pids, hosts and hashes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as hs

from ftd.culprit.evidence import JobEvidence, NodeEvidence, RankEvidence, RasStatus
from ftd.culprit.ras import MAX_PROCESSES, RasProcess, missing_processes
from ftd.culprit.verdict import fuse
from tests.properties import examples

STATUS = """\
Job summary
===========

  Nodes  Processes         GPUs  Processes     GPUs
(total)   per node  per process    (total)  (total)
      3          1            1          3        3

The outlier node:
  Node 10.9.0.4 running process 7302

Communicators... (0.02s)
=============

Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
    #  in group  per comm  per node  per comm  in group
    0         1         3         1         3         2   RUNNING  INCOMPLETE

Errors
======

INCOMPLETE
  Missing communicator data from 1 job process
  Process 7302 on node 10.9.0.4 managing GPU 0

DEAD
  1 job process is considered dead (unreachable via the RAS network)
  Process 8811 on node gpu-b.cluster.example managing GPUs 0,1

#0-0 (00f00dcafe001234) INCOMPLETE
  Missing communicator data from 1 rank
  Rank 2 -- GPU 0 (NVML 0) managed by process 7302 on node 10.9.0.4

Warnings
========

#0-0 (00f00dcafe001234) MISMATCH
  Process 5555 on node 10.9.0.9 managing GPU 3
"""


def test_the_errors_section_names_each_missing_or_dead_process_once() -> None:
    assert missing_processes(STATUS) == [
        RasProcess(pid=7302, host="10.9.0.4"),
        RasProcess(pid=8811, host="gpu-b.cluster.example"),
    ]  # not the summary's outlier node, not the warnings; 7302 once though printed twice


def test_no_errors_section_or_junk_is_nothing() -> None:
    assert missing_processes("Job summary\n===========\n  Process 1 on node x managing GPU 0\n") == []
    assert missing_processes("") == [] and missing_processes(None) == []  # type: ignore[arg-type]
    many = "Errors\n" + "".join(f"  Process {p} on node n{p} managing GPU 0\n" for p in range(1000))
    assert len(missing_processes(many)) == MAX_PROCESSES


@settings(max_examples=examples(500), deadline=None)
@given(hs.text(max_size=400))
def test_any_text_reads_without_raising(text: str) -> None:
    for proc in missing_processes("Errors\n" + text):
        assert proc.pid >= 0 and 0 < len(proc.host) <= 128


def _job(ras: RasStatus) -> JobEvidence:
    layout = {"gpu-a": [0], "gpu-b": [1], "gpu-c": [2]}
    pids = {0: 7001, 1: 8811, 2: 7302}
    nodes = {
        node: NodeEvidence(
            node=node,
            job="9",
            ranks=[RankEvidence(rank=r, node=node, pid=pids[r], state="sleeping") for r in ranks],
            ras=ras if node == "gpu-a" else None,
        )
        for node, ranks in layout.items()
    }
    return JobEvidence(job="9", expected=layout, nodes=nodes)


def test_the_verdict_maps_ras_processes_to_ranks_by_pid_and_node() -> None:
    one = RasStatus(answered=True, missing=[RasProcess(pid=7302, host="10.9.0.4")])
    verdict = fuse(_job(one))
    assert (verdict.kind, verdict.confident, verdict.culprit_ranks) == ("culprit", False, [2])
    assert verdict.culprit_nodes == ["gpu-c"] and "NCCL RAS misses rank 2" in verdict.why
    unknown = RasStatus(answered=True, missing=[RasProcess(pid=4242, host="10.9.0.7")])
    assert fuse(_job(unknown)).kind == "unknown"  # a process of no rank we know names nobody


def test_a_pid_on_two_nodes_is_told_apart_by_the_node_ras_printed() -> None:
    job = _job(RasStatus(answered=True, missing=[RasProcess(pid=8811, host="gpu-b.cluster.example")]))
    twin = RankEvidence(rank=0, node="gpu-a", pid=8811, state="sleeping")  # same pid on another node
    job.nodes["gpu-a"] = NodeEvidence(node="gpu-a", job="9", ranks=[twin], ras=job.nodes["gpu-a"].ras)
    assert fuse(job).culprit_ranks == [1]
    by_address = RasStatus(answered=True, missing=[RasProcess(pid=8811, host="10.9.0.5")])
    job.nodes["gpu-a"] = NodeEvidence(node="gpu-a", job="9", ranks=[twin], ras=by_address)
    assert fuse(job).kind == "unknown"  # an address for a repeated pid: cannot be told
