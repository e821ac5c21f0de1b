"""A real DDP rank (gloo, CPU) for the ``ftd run`` tests: joins the rendezvous ``ftd run`` gave it
(``env://``: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), all-reduces its rank + 1, writes
``$OUT_DIR/ddp-g<generation>-r<rank>.json`` (the sum, the world size, the port), then keeps
all-reducing until it is stopped."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
record = {
    "rank": rank,
    "world": world,
    "sum": value.item(),
    "port": os.environ["MASTER_PORT"],
    "warm": "FTD_WARM_READY_AT" in os.environ,  # started in a pre-started interpreter (ftd run --warm)
}
name = f"ddp-g{os.environ['FTD_GENERATION']}-r{rank}.json"
tmp = os.path.join(os.environ["OUT_DIR"], "." + name)
with open(tmp, "w") as f:
    json.dump(record, f)
os.replace(tmp, os.path.join(os.environ["OUT_DIR"], name))
while True:
    dist.all_reduce(torch.ones(1))
    time.sleep(0.2)
