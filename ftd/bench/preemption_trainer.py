"""The training job of ``ftd bench preemption``: the README's loop with the client's defaults.

Run by ``srun`` in a ``--requeue`` batch job with no agent and no launcher (the plain loop the issue's
first target names). The loop is the README's, written out: ``Client()``, ``heartbeat(step)``,
``should_save()`` -> ``ack_saved(step, save_checkpoint(step))``, ``should_stop()`` -> break. The
client turns Slurm's SIGTERM at a preemption into a save then a stop, and waits for Slurm to end the
job so that Slurm requeues it.

``save_checkpoint`` takes ``$FTD_PREEMPT_SAVE_S`` seconds (a save that takes a few seconds by
default) and writes ``step-N.ckpt`` with the step and the SHA-256 of its payload, through a temporary
file and ``os.replace``, so a save cut short leaves no checkpoint. On start the job resumes from the
newest checkpoint whose digest verifies (a corrupt one is skipped and said so).

What it records, as JSON lines in ``$FTD_PREEMPT_LOG`` (one line per event, ``run`` = Slurm's restart
count): ``started`` (``start``: the step it begins at, ``resumed_from``: the verified checkpoint's
step or None, ``verified``), ``save_started`` / ``saved`` (``step``), ``left_loop`` (``step``),
``timeout`` (it trained past ``$FTD_PREEMPT_MAX_S`` without being stopped: exit 3).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

LOG = Path(os.environ.get("FTD_PREEMPT_LOG", "preempt.jsonl"))
CKPT = Path(os.environ.get("FTD_PREEMPT_CKPT", "ckpt"))
SAVE_S = float(os.environ.get("FTD_PREEMPT_SAVE_S", "2.0"))
STEP_S = float(os.environ.get("FTD_PREEMPT_STEP_S", "0.05"))
MAX_S = float(os.environ.get("FTD_PREEMPT_MAX_S", "240"))
RUN = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
PAYLOAD = 256 * 1024  # bytes of "state" per checkpoint


def record(what: str, **fields: object) -> None:
    with LOG.open("a") as f:
        f.write(json.dumps({"what": what, "run": RUN, "pid": os.getpid(), "t": time.time(), **fields}) + "\n")


def _payload(step: int) -> bytes:
    return hashlib.sha256(str(step).encode()).digest() * (PAYLOAD // 32)


def save_checkpoint(step: int) -> str:
    record("save_started", step=step)
    path = CKPT / f"step-{step}.ckpt"
    tmp = path.with_suffix(".tmp")
    payload = _payload(step)
    header = json.dumps({"step": step, "sha256": hashlib.sha256(payload).hexdigest()}).encode()
    time.sleep(SAVE_S)  # the save's own time (serialising, writing)
    with tmp.open("wb") as f:
        f.write(header + b"\n" + payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    record("saved", step=step)
    return str(path)


def verified(path: Path) -> int | None:
    """The step in ``path`` when its payload's digest matches its header, else None."""
    try:
        header, payload = path.read_bytes().split(b"\n", 1)
        meta = json.loads(header)
        if hashlib.sha256(payload).hexdigest() == meta["sha256"] and payload == _payload(int(meta["step"])):
            return int(meta["step"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def newest_verified() -> int | None:
    steps = sorted((int(p.stem.split("-")[1]) for p in CKPT.glob("step-*.ckpt")), reverse=True)
    for step in steps:
        if verified(CKPT / f"step-{step}.ckpt") == step:
            return step
        record("corrupt_checkpoint", step=step)
    return None


def main() -> int:
    from ftd.client import Client

    CKPT.mkdir(parents=True, exist_ok=True)
    resumed = newest_verified()
    start = resumed + 1 if resumed is not None else 1
    record("started", start=start, resumed_from=resumed, verified=resumed is not None)
    began = time.monotonic()
    step = start
    client = Client()
    for step in range(start, 10**9):
        time.sleep(STEP_S)  # train_step()
        if time.monotonic() - began > MAX_S:
            record("timeout", step=step)
            return 3
        client.heartbeat(step)
        if client.should_save():
            client.ack_saved(step, save_checkpoint(step))
        if client.should_stop():
            break
    record("left_loop", step=step)
    return 0  # the client's exit handler closes it and, after a SIGTERM, waits for Slurm


if __name__ == "__main__":
    sys.exit(main())
