"""A real DDP rank (gloo, CPU) for the slow-rank tests (issue #33): a tiny model under
``DistributedDataParallel`` with the torch helper's timing hook (:func:`ftd.client.torch.time_collectives`),
the save/stop agreement every step, a heartbeat per step. Each step does ``FTD_TEST_WORK_S`` of "work"
(a sleep: data loading, say; it keeps the 2-core machine free) before its forward pass, and
``FTD_TEST_SLOW_S`` more while the file ``FTD_TEST_SLOW_FILE`` exists (the test creates it to slow
this rank down). Prints ``registered`` once its client is registered; writes its step to
``$OUT_DIR/step-r<rank>`` every 10 steps."""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ftd.client import Client
from ftd.client.torch import TorchCoordinator, time_collectives

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=120))
rank = dist.get_rank()
client = Client(job=os.environ["FTD_TEST_JOB"], rank=rank, local_rank=0)
deadline = time.monotonic() + 60
while not client.connected and time.monotonic() < deadline:
    time.sleep(0.05)
print("registered" if client.connected else "not registered", flush=True)
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(32, 32))
time_collectives(model, client)
coord = TorchCoordinator(client)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
work_s = float(os.environ.get("FTD_TEST_WORK_S", "0.05"))
slow_s = float(os.environ.get("FTD_TEST_SLOW_S", "0.05"))
slow_file = os.environ.get("FTD_TEST_SLOW_FILE", "")
out = os.environ["OUT_DIR"]
step = 0
while True:
    time.sleep(work_s + (slow_s if slow_file and os.path.exists(slow_file) else 0.0))
    loss = model(torch.randn(8, 32)).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    client.heartbeat(step)
    coord.agree(step)  # saves and stops are not this test's business: the loop goes on
    if step % 10 == 0:
        with open(os.path.join(out, f".step-r{rank}"), "w") as f:
            f.write(str(step))
        os.replace(os.path.join(out, f".step-r{rank}"), os.path.join(out, f"step-r{rank}"))
    if os.path.exists(os.path.join(out, "stop")):
        sys.exit(0)
