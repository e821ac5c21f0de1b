"""A training loop like ``trainer_job.py`` whose checkpoint takes a while: after ``save`` it records
``save_requested``, sleeps ``$FTD_TEST_SAVE_DELAY_S`` seconds (default 3), then saves and acks. The
crash test kills the coordinator inside that window."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from ftd.client import Client


def main() -> int:
    log = Path(os.environ["FTD_TEST_LOG"])
    delay = float(os.environ.get("FTD_TEST_SAVE_DELAY_S", "3"))
    client = Client()

    def record(what: str, **fields: object) -> None:
        with log.open("a") as f:
            f.write(
                json.dumps({"what": what, "job": client.job, "rank": client.rank, "t": time.time(), **fields})
            )
            f.write("\n")

    record("started")
    step = 0
    deadline = time.monotonic() + float(os.environ.get("FTD_TEST_MAX_S", "120"))
    while time.monotonic() < deadline:
        step += 1
        time.sleep(0.02)
        client.heartbeat(step)
        if client.should_save():
            record("save_requested", step=step)
            time.sleep(delay)
            path = log.parent / f"ckpt-{client.job}-{client.rank}-{step}.txt"
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
