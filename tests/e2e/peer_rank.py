"""A real gloo rank (CPU) for the peer-naming e2e test (issue #33).

It registers with its node's agent (``ftd.client``: ``FTD_JOB``, ``RANK``, ``FTD_SOCKET``), joins a
two-rank gloo group (``MASTER_PORT`` on 127.0.0.1; ``GLOO_SOCKET_IFNAME`` picks the interface, so the
two ranks have different addresses), and all-reduces in a loop. Rank 1 dies hard (``os._exit``) once
``$OUT_DIR/die`` exists; rank 0's next all-reduce then fails with gloo's "Connection closed by peer
[ADDRESS]:PORT", printed to its stderr (the log the agent follows), and rank 0 stays registered until
it is stopped (it writes ``$OUT_DIR/rank0.failed``)."""

from __future__ import annotations

import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ftd.client import Client

rank = int(os.environ["RANK"])
out = Path(os.environ["OUT_DIR"])
client = Client(job=os.environ["FTD_JOB"], rank=rank)
dist.init_process_group(
    "gloo",
    init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
    rank=rank,
    world_size=2,
    timeout=timedelta(seconds=60),
)
step = 0
try:
    while True:
        step += 1
        dist.all_reduce(torch.ones(1))
        client.heartbeat(step)
        (out / f"rank{rank}.step").write_text(str(step))
        if rank == 1 and (out / "die").exists():
            os._exit(9)
        time.sleep(0.1)
except RuntimeError:
    # the traceback goes to stderr as an uncaught one would; the rank then stays registered (as a
    # trainer waiting for ftd's directive does) so that the coordinator still knows its job on this
    # node when the line's event arrives (a rank that exits at once can leave before it: see
    # docs/culprit.md)
    traceback.print_exc()
    sys.stderr.flush()
    (out / f"rank{rank}.failed").write_text(str(step))
    while not client.should_stop():
        time.sleep(0.2)
