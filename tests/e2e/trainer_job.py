"""A minimal training loop wired to the ftd client, run as a Slurm batch job by the e2e tests.

It records what it saw as JSON lines in ``$FTD_TEST_LOG`` so the test can assert on it:
``started``, ``saved`` (step, path), ``stopped`` (step). With ``$FTD_TEST_SAVE_DELAY_S`` its
checkpoint takes that long: it records ``save_requested`` first (the coordinator-crash test kills the
coordinator inside that window).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from ftd.client import Client


def main() -> int:
    log = Path(os.environ["FTD_TEST_LOG"])
    ckpt_dir = Path(os.environ.get("FTD_TEST_CKPT", log.parent))
    save_delay_s = float(os.environ.get("FTD_TEST_SAVE_DELAY_S", "0"))

    def record(what: str, **fields: object) -> None:
        with log.open("a") as f:
            f.write(
                json.dumps({"what": what, "job": client.job, "rank": client.rank, "t": time.time(), **fields})
                + "\n"
            )

    client = Client()  # job from SLURM_JOB_ID, rank from SLURM_PROCID, socket from FTD_SOCKET
    record("started")
    step = 0
    deadline = time.monotonic() + float(os.environ.get("FTD_TEST_MAX_S", "120"))
    while time.monotonic() < deadline:
        step += 1
        time.sleep(0.02)  # one "training step"
        client.heartbeat(step)
        if client.should_save():
            if save_delay_s:
                record("save_requested", step=step)
                time.sleep(save_delay_s)
            path = ckpt_dir / f"ckpt-{client.job}-{client.rank}-{step}.txt"
            path.write_text(str(step))
            client.ack_saved(step, str(path))
            record("saved", step=step, path=str(path))
        if client.should_stop():
            record("stopped", step=step)
            client.close()
            return 0
    record("timeout", step=step)
    return 1


if __name__ == "__main__":
    sys.exit(main())
