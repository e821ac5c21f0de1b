"""``ftd run`` forwards the scheduler's signals to its ranks as what they mean (issue #37 item 4).

Real processes: ``ftd run`` (no agent at its socket: it runs generation 0 anyway) with two ranks, each
a loop shaped like the README's with the client's defaults, recording what it did as JSON lines.
SIGUSR1 to the supervisor (``sbatch --signal=USR1@600``) makes every rank save and go on; SIGTERM
makes every rank save and leave in the step it saved, well within the stop grace (no SIGKILL), and
the supervisor exits 143 saying which grace it gave and why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.e2e.daemons import REPO

RANK = r"""
import json, os, time
from ftd.client import Client
out = open(os.path.join(os.environ["OUT"], "rank%s.jsonl" % os.environ["RANK"]), "a")
def record(**kw):
    out.write(json.dumps(dict(kw, t=time.time())) + "\n"); out.flush()
client = Client()
record(what="started")
step = 0
while True:
    step += 1
    client.heartbeat(step)
    time.sleep(0.02)
    if client.should_save():
        client.ack_saved(step, "/ckpt/%d" % step)
        record(what="saved", step=step)
    if client.should_stop():
        break
record(what="left", step=step)
"""


def records(out: Path, rank: int) -> list[dict[str, Any]]:
    path = out / f"rank{rank}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_sigusr1_is_a_save_and_sigterm_a_save_then_stop_for_every_rank(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "FTD_"))}
    env.update(PYTHONPATH=str(REPO), OUT=str(tmp_path))
    log = (tmp_path / "supervisor.log").open("w")
    argv = [sys.executable, "-m", "ftd.cli", "run", "--nodes", "1", "--nproc-per-node", "2"]
    argv += ["--preflight", "none", "--job", "j1", "--socket", str(tmp_path / "absent.sock")]
    argv += ["--stop-grace", "30", "--no-prefix", "--", sys.executable, str(script)]
    sup = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: all(records(tmp_path, r) for r in (0, 1)), 60, "both ranks to start")
        time.sleep(0.5)

        sup.send_signal(signal.SIGUSR1)
        wait_for(lambda: all(len(records(tmp_path, r)) >= 2 for r in (0, 1)), 20, "both ranks to save")
        time.sleep(0.3)
        for r in (0, 1):
            assert [e["what"] for e in records(tmp_path, r)] == ["started", "saved"]  # saved, goes on
        assert sup.poll() is None

        sent = time.monotonic()
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(40) == 128 + signal.SIGTERM
        took = time.monotonic() - sent
        for r in (0, 1):
            done = records(tmp_path, r)
            assert [e["what"] for e in done] == ["started", "saved", "saved", "left"], done
            assert done[3]["step"] == done[2]["step"] > done[1]["step"]  # left in the step it saved
        assert took < 15, took  # the ranks left on their own: no SIGKILL after the 30 s grace
        text = (tmp_path / "supervisor.log").read_text()
        assert "SIGUSR1: asking generation 0's ranks" in text
        assert "SIGTERM: the ranks save and stop; 30.0 s until SIGKILL (--stop-grace)" in text
        assert "SIGKILL" not in text.replace("until SIGKILL", "")
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
        log.close()
