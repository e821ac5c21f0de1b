"""A hung rank's own flight recorder, asked for over the trainer protocol (issue #33).

Real parts: two PyTorch ranks (gloo, CPU) as processes, each with the ftd client registered with a real
:class:`~ftd.agent.local_api.LocalApi` on a real unix socket. Rank 1 stops taking part after the first
all-reduce; rank 0 then waits in the second one. The agent asks both for their flight recorder: rank 0's
reader thread answers while its main thread is blocked in the collective, and its dump (JSON, never a
pickle) says it enqueued the second all-reduce and completed only the first; rank 1's says it never
enqueued a second. The same answer reaches the hang evidence through ``collect_hang_evidence``.
"""

from __future__ import annotations

import asyncio
import glob
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftd.agent.hang_evidence import collect_hang_evidence
from ftd.agent.local_api import LocalApi
from ftd.bench.slurm_cluster import free_port
from ftd.culprit.flight import parse_flight_json
from ftd.events import Directive
from tests.unit.helpers import until

torch = pytest.importorskip("torch")  # FTD_REQUIRE_REAL=1 turns a missing torch into a failure

JOB = "fr-1"
RANK = """
import os, sys, time
import torch, torch.distributed as dist
from ftd.client import Client
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", rank=rank, world_size=2)
client = Client(job="fr-1", rank=rank)
client.start()
t = torch.ones(8)
dist.all_reduce(t)
print("first done", flush=True)
if rank == 0:
    dist.all_reduce(t)  # rank 1 never joins: blocked here
else:
    time.sleep(600)
"""


@pytest.fixture
def ranks(api: LocalApi, tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    port = free_port()
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": "2",
        "FTD_SOCKET": api.socket_path,
        "TORCH_FR_BUFFER_SIZE": "64",
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp_path),  # where the ranks' dumps land: checked empty after reading
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK], env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, text=True
        )
        for r in (0, 1)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "first done"
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)


async def test_a_rank_blocked_in_a_collective_answers_with_its_flight_recorder(
    api: LocalApi, ranks: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    await until(lambda: len(api.jobs().get(JOB, [])) == 2, 30)
    await asyncio.sleep(0.5)  # rank 0 into its second all-reduce
    data, why = await api.ask_flight(JOB, 0, 20)
    assert data is not None, why
    record, error = parse_flight_json(data)
    assert not error and record is not None
    [(pg, status)] = record.pg_status.items()
    assert (status.last_enqueued, status.last_completed) == (2, 1), record
    assert [e.op for e in record.entries] == ["gloo:all_reduce", "gloo:all_reduce"]
    data1, why1 = await api.ask_flight(JOB, 1, 20)
    assert data1 is not None, why1
    record1, _ = parse_flight_json(data1)
    assert record1 is not None and record1.pg_status[pg].last_enqueued == 1
    assert glob.glob(str(tmp_path / "ftd-flight-*")) == []  # read once, removed
    assert (await api.ask_flight(JOB, 7, 1))[1] == f"rank 7 of job {JOB} is not connected to this agent"

    directive = Directive(id="d-1", ts=time.time(), action="collect_hang_evidence", job=JOB, deadline_s=30)
    evidence = await collect_hang_evidence(
        directive, api.jobs()[JOB], tmp_path / "out", node="node1", ask_flight=api.ask_flight
    )
    by_rank = {r.rank: r for r in evidence.ranks}
    assert by_rank[0].flight is not None and by_rank[0].flight.pg_status[pg].last_enqueued == 2
    assert by_rank[1].flight is not None and by_rank[1].flight.pg_status[pg].last_enqueued == 1
    assert "flight_recorder" not in by_rank[0].errors, by_rank[0].errors
    assert "rank-0-pid-" in " ".join(by_rank[0].files)
