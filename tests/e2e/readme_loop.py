"""The README's training loop, verbatim, as a Slurm batch job (issue #20, item 1).

The loop is read from README.md at run time (the ```python block holding ``client = Client()``) and
run as written; only the names it leaves to the reader are defined here: ``start`` (the step after
the newest checkpoint in ``$FTD_TEST_CKPT``), ``steps``, ``train_step()`` (a short sleep; it ends
the process with exit code 3 after ``$FTD_TEST_MAX_S`` seconds, so a job that is never stopped does
not run forever) and ``save_checkpoint(step)`` (writes a file, returns its path). Every process
records what it did as JSON lines in ``$FTD_TEST_LOG``: ``started`` (with ``start``), ``saved``,
``training`` (every 20 steps), ``left_loop`` (the loop ended by ``should_stop()``), each with the
Slurm restart count, so a test can tell the job's runs apart.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOG = Path(os.environ["FTD_TEST_LOG"])
CKPT = Path(os.environ["FTD_TEST_CKPT"])
MAX_S = float(os.environ.get("FTD_TEST_MAX_S", "120"))
RUN = int(os.environ.get("SLURM_RESTART_COUNT") or 0)


def readme_loop() -> str:
    text = (REPO / "README.md").read_text()
    for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
        if "client = Client()" in block and "should_stop()" in block:
            return str(block)
    raise SystemExit("README.md has no training loop with client = Client()")


def record(what: str, **fields: object) -> None:
    with LOG.open("a") as f:
        f.write(json.dumps({"what": what, "run": RUN, "pid": os.getpid(), "t": time.time(), **fields}) + "\n")


def main() -> int:
    CKPT.mkdir(parents=True, exist_ok=True)
    saved = sorted(int(p.stem.split("-")[1]) for p in CKPT.glob("step-*.ckpt"))
    began = time.monotonic()
    calls = 0

    def train_step() -> None:
        nonlocal calls
        calls += 1
        if calls % 20 == 0:
            record("training", calls=calls)
        time.sleep(0.05)
        if time.monotonic() - began > MAX_S:
            record("timeout")
            sys.exit(3)

    def save_checkpoint(step: int) -> str:
        path = CKPT / f"step-{step}.ckpt"
        path.write_text(str(step))
        record("saved", step=step)
        return str(path)

    namespace: dict[str, object] = {
        "start": (saved[-1] + 1) if saved else 1,
        "steps": 10**9,
        "train_step": train_step,
        "save_checkpoint": save_checkpoint,
    }
    record("started", start=namespace["start"])
    exec(compile(readme_loop(), "README.md", "exec"), namespace)  # the README's own code
    record("left_loop", step=namespace.get("step"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
