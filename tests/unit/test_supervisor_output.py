"""ftd run puts each rank's node and rank in front of every line it prints (issue #33): real processes,
real pipes."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

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


_WARM_RUNNER = """
import os, sys, time
from ftd.supervisor import output
from ftd.supervisor.warm import WarmPool, give
tmp = sys.argv[1]
env = dict(os.environ, PYTHONPATH=tmp + os.pathsep + os.environ.get("PYTHONPATH", ""))
pool = WarmPool(sys.executable, ["noisy_import"], env, 2, node=lambda: "node-7")
pool.fill()
deadline = time.monotonic() + 60
while not pool.ready() and time.monotonic() < deadline:
    time.sleep(0.05)
procs = pool.take(2)
for rank, proc in enumerate(procs):
    pool.name(proc, output.label("node-7", str(rank)))
    give(proc, [sys.executable, os.path.join(tmp, "rank.py")], dict(env, RANK=str(rank)), tmp)
for proc in procs:
    proc.wait(60)
time.sleep(0.5)  # the pumps drain what is left in the pipes
"""


def test_a_warm_ranks_lines_carry_its_rank_once_given_and_the_pool_s_before(tmp_path: Path) -> None:
    (tmp_path / "noisy_import.py").write_text("print('imported', flush=True)\n")
    (tmp_path / "rank.py").write_text(
        "import os, sys\n"
        "r = os.environ['RANK']\n"
        "for i in range(50):\n"
        "    print(f'out {r} {i}', flush=True)\n"
        "    print(f'err {r} {i}', file=sys.stderr, flush=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", _WARM_RUNNER, str(tmp_path)], capture_output=True, timeout=120, check=True
    )
    lines, errs = out.stdout.decode().splitlines(), out.stderr.decode().splitlines()
    assert lines.count("[node-7 warm] imported") == 2, lines  # each interpreter's import, before its rank
    for rank in ("0", "1"):
        mine = [ln.split("] ", 1)[1] for ln in lines if ln.startswith(f"[node-7 rank {rank}] ")]
        assert mine == [f"out {rank} {i}" for i in range(50)]
        assert len([ln for ln in errs if ln.startswith(f"[node-7 rank {rank}] err {rank} ")]) == 50
    assert all(ln.startswith("[node-7 ") for ln in lines)
