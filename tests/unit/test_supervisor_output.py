"""ftd run puts each rank's node and rank in front of every line it prints (issue #33): real processes,
real pipes."""

from __future__ import annotations

import io
import subprocess
import sys

from ftd.supervisor import output
from ftd.supervisor.ranks import RankGroup

_SCRIPT = (
    "import os, sys\n"
    "r = os.environ['RANK']\n"
    "for i in range(200):\n"
    "    print(f'out {r} {i}', flush=True)\n"
    "    print(f'err {r} {i}', file=sys.stderr, flush=True)\n"
    "sys.stdout.write('no newline at the end')\n"
)


def test_every_line_of_every_rank_is_prefixed_whole_and_nothing_is_lost() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _RUNNER],
        capture_output=True,
        timeout=60,
        check=True,
    )
    lines = out.stdout.decode().splitlines()
    errs = out.stderr.decode().splitlines()
    for rank, node in (("0", "node-1"), ("1", "node-1")):
        mine = [ln for ln in lines if ln.startswith(f"[{node} rank {rank}] ")]
        assert [ln.split("] ", 1)[1] for ln in mine[:-1]] == [f"out {rank} {i}" for i in range(200)]
        assert mine[-1] == f"[{node} rank {rank}] no newline at the end"
        assert len([ln for ln in errs if ln.startswith(f"[{node} rank {rank}] err {rank} ")]) == 200
    assert all(ln.startswith("[node-1 rank ") for ln in lines + errs)  # two ranks never interleave in a line


_RUNNER = f"""
import sys, time
from ftd.supervisor import output
from ftd.supervisor.ranks import RankGroup
import os
group = RankGroup(0)
envs = [dict(os.environ, RANK=str(r)) for r in (0, 1)]
labels = [output.label("node-1", "0"), output.label("node-1", "1")]
group.start_cold([sys.executable, "-c", {_SCRIPT!r}], envs, labels=labels)
while group.alive():
    time.sleep(0.05)
time.sleep(0.5)  # the pumps drain what is left in the pipes
"""


def test_a_line_longer_than_the_limit_is_cut_into_prefixed_pieces() -> None:
    source = io.BytesIO(b"x" * (output.MAX_LINE + 10) + b"\nshort\n")
    sink = io.BytesIO()
    thread = output.pump(b"[n rank 0] ", source, sink)  # type: ignore[arg-type]
    thread.join(10)
    got = sink.getvalue().split(b"\n")
    assert got[0] == b"[n rank 0] " + b"x" * output.MAX_LINE
    assert got[1] == b"[n rank 0] " + b"x" * 10 and got[2] == b"[n rank 0] short" and got[3] == b""


def test_without_labels_the_ranks_write_to_the_supervisor_s_own_streams() -> None:
    group = RankGroup(0)
    group.start_cold([sys.executable, "-c", "pass"], [{}])
    assert group.procs[0].stdout is None and group.procs[0].stderr is None
    group.procs[0].wait(30)
