"""Client: what a SIGTERM does to a whole training process with the client's defaults (issue #37).

Real processes: a loop shaped like the README's (heartbeat, save when asked, leave when asked), no
agent (the client fails open). A SIGTERM is a save then a stop, and the process exits 0 after it; a
second SIGTERM gets the default action (-15); under Slurm (``SLURM_JOB_ID`` set) the process waits
at exit for Slurm to end the job (``$FTD_TERM_WAIT_S``), and a SIGTERM during that wait ends it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e.daemons import REPO

LOOP = r"""
import json, os, sys, time
from ftd.client import Client
STEP_S = float(os.environ.get("STEP_S", "0.01"))
client = Client()
print(json.dumps({"ready": True}), flush=True)
step = 0
while True:
    step += 1
    client.heartbeat(step)
    time.sleep(STEP_S)
    if client.should_save():
        client.ack_saved(step, "/ckpt/%d" % step)
        print(json.dumps({"saved": step}), flush=True)
    if client.should_stop():
        break
print(json.dumps({"left": step, "exit_at": time.time()}), flush=True)
"""


def start(tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "FTD_", "STEP_S"))}
    full.update(PYTHONPATH=str(REPO), FTD_SOCKET=str(tmp_path / "absent.sock"), **env)
    proc = subprocess.Popen(
        [sys.executable, "-c", LOOP], env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert json.loads(proc.stdout.readline()) == {"ready": True}
    return proc


def lines(proc: subprocess.Popen[str]) -> list[dict[str, object]]:
    assert proc.stdout is not None
    return [json.loads(line) for line in proc.stdout.read().splitlines() if line.strip()]


def test_sigterm_saves_then_leaves_the_loop_and_exits_zero(tmp_path: Path) -> None:
    proc = start(tmp_path)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    out = lines(proc)
    saved = [o["saved"] for o in out if "saved" in o]
    left = [o["left"] for o in out if "left" in o]
    assert len(saved) == 1 and left == saved, out  # saved in the step it left: nothing lost


def test_sigterm_with_the_default_turned_off_kills_at_once(tmp_path: Path) -> None:
    proc = start(tmp_path, FTD_SIGNALS="0")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == -signal.SIGTERM
    assert lines(proc) == []


def test_under_slurm_the_process_waits_for_slurm_and_the_next_sigterm_ends_it(tmp_path: Path) -> None:
    proc = start(tmp_path, SLURM_JOB_ID="4242", FTD_TERM_WAIT_S="60")
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout is not None
    out = [json.loads(proc.stdout.readline()), json.loads(proc.stdout.readline())]
    assert out[1]["left"] == out[0]["saved"], out
    time.sleep(2.5)  # past the window in which a SIGTERM is the first one again (TERM_REPEAT_S)
    assert proc.poll() is None  # saved and left its loop, but waits for Slurm to end the job
    proc.send_signal(signal.SIGTERM)  # Slurm's SIGTERM at the end of the grace
    assert proc.wait(20) == -signal.SIGTERM
    assert proc.stderr is not None
    assert "waiting up to 60 s for Slurm to end the job" in proc.stderr.read()


def test_under_slurm_the_wait_is_bounded(tmp_path: Path) -> None:
    proc = start(tmp_path, SLURM_JOB_ID="4242", FTD_TERM_WAIT_S="1.5")
    time.sleep(0.3)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert 1.5 <= time.monotonic() - sent < 15


def test_a_second_sigterm_kills_a_rank_stuck_in_its_step_at_once(tmp_path: Path) -> None:
    proc = start(tmp_path, SLURM_JOB_ID="4242", FTD_TERM_WAIT_S="60", STEP_S="30")
    proc.send_signal(signal.SIGTERM)  # flags set; the step (30 s) goes on
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)  # the same SIGTERM by another path (Slurm and ftd run): no effect
    time.sleep(2.5)
    assert proc.poll() is None
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == -signal.SIGTERM
    assert time.monotonic() - sent < 10
    assert lines(proc) == []  # it never reached a save: the step did not end
