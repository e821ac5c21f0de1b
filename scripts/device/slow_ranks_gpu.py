"""Device check for issue #33 (not part of the suite): the torch helper's timing hook on CUDA tensors.

Run on a GPU machine from the repository root (``python3 scripts/device/slow_ranks_gpu.py``; ``$OUT``
gets each rank's counters): NCCL with one rank, then gloo with two ranks on the one GPU, rank 1
sleeping 50 ms a step, then without the sleep. It prints each rank's step timing counters per step
and the ratio of the two ranks' own work (docs/architecture.md §6, slow ranks, has one run's figures).
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.getcwd())
from ftd.client import Client
from ftd.client.torch import TorchCoordinator, time_collectives


def worker(rank, backend, world, port, slow_rank, slow_s, steps, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group(backend)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    c = Client(job="gpu", rank=rank, connect=False)
    net = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).to(dev)
    model = DistributedDataParallel(net, device_ids=[0])
    time_collectives(model, c)
    co = TorchCoordinator(c)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(256, 2048, device=dev)
    t0 = time.monotonic()
    for s in range(steps):
        if rank == slow_rank:
            time.sleep(slow_s)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        c.heartbeat(s)
        co.agree(s)
    torch.cuda.synchronize()
    snap = c._clock.snapshot()
    snap["wall_s"] = time.monotonic() - t0
    with open(f"{out}/{backend}-w{world}-r{rank}.json", "w") as f:
        json.dump(snap, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    out = os.environ.get("OUT", "/tmp")
    print("torch", torch.__version__, torch.cuda.get_device_name(0), flush=True)
    for backend, world, slow_rank, port in (
        ("nccl", 1, -1, 29611),
        ("gloo", 2, 1, 29612),
        ("gloo", 2, -1, 29613),
    ):
        tag = f"{backend}-w{world}-slow{slow_rank}"
        try:
            mp.spawn(worker, args=(backend, world, port, slow_rank, 0.05, 60, out), nprocs=world, join=True)
        except Exception as exc:
            print(tag, "FAILED", repr(exc)[:800], flush=True)
            continue
        rows = []
        for r in range(world):
            with open(f"{out}/{backend}-w{world}-r{r}.json") as f:
                snap = json.load(f)
            os.rename(f"{out}/{backend}-w{world}-r{r}.json", f"{out}/{tag}-r{r}.json")
            per = {
                k: (snap[k] / snap["steps"] if isinstance(snap[k], float) else snap[k])
                for k in ("step_s", "compute_s")
            }
            rows.append(per)
            print(
                tag,
                "rank",
                r,
                snap,
                "per step",
                {k: round(v, 5) if v is not None else None for k, v in per.items()},
                flush=True,
            )
        if world == 2 and all(r["compute_s"] for r in rows):
            print(
                tag,
                "compute ratio rank1/rank0",
                round(rows[1]["compute_s"] / rows[0]["compute_s"], 3),
                flush=True,
            )
