"""A trainer whose start-up after ``Client()`` outlasts the agent's heartbeat timeout (issue #20, item 5).

``Client()`` first (as the README has it), then ``import torch`` and a model built, then (if that
was quicker than ``$FTD_TEST_STARTUP_S``) a wait up to it, so the start-up surely exceeds the
timeout the test gives the agent. Then it trains for ``$FTD_TEST_TRAIN_S`` seconds with a heartbeat
per step, then hangs (no heartbeats) for ``$FTD_TEST_HANG_S`` seconds and exits. JSON lines in
``$FTD_TEST_LOG``: ``client``, ``started`` (with ``startup_s``, seconds since ``Client()``),
``hang`` (with the step), ``exit``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from ftd.client import Client

LOG = Path(os.environ["FTD_TEST_LOG"])


def record(what: str, **fields: object) -> None:
    with LOG.open("a") as f:
        f.write(json.dumps({"what": what, "pid": os.getpid(), "t": time.time(), **fields}) + "\n")


def main() -> int:
    client = Client()
    began = time.monotonic()
    record("client")
    import torch  # the slow part of a real start-up

    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    floor = float(os.environ.get("FTD_TEST_STARTUP_S", "0"))
    while time.monotonic() - began < floor:
        time.sleep(0.05)
    record("started", startup_s=time.monotonic() - began)
    step = 0
    until = time.monotonic() + float(os.environ.get("FTD_TEST_TRAIN_S", "5"))
    while time.monotonic() < until:
        step += 1
        loss = model(torch.randn(8, 64)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.02)
        client.heartbeat(step)
    record("hang", step=step)
    time.sleep(float(os.environ.get("FTD_TEST_HANG_S", "10")))
    record("exit")
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
