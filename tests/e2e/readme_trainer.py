"""The README's training loop, verbatim, as one rank of a torch DDP job (gloo on CPU) under Slurm.

What: :func:`readme_loop` takes the ``python`` block of README.md that holds the loop (``client =
Client()`` ... ``if client.should_stop(): break``) at run time, never a copy; :func:`main` (run by
``srun``, one rank per node) supplies what the loop leaves to the user: ``start`` (the newest step
every rank has a checkpoint of), ``steps``, ``train_step()`` (one DDP step, an all-reduce of the
gradients) and ``save_checkpoint(step)`` (``torch.save`` to a temp file, renamed), then runs the block
in this module's globals. Every fact the operator-day test needs is a JSON line in
``$FTD_DAY_DIR/<job>-rank<r>.jsonl``, each with the job, its run (``SLURM_RESTART_COUNT``), rank, node
and pid: ``resumed`` (the step it starts from), ``step`` (every step trained), ``directive`` (every
save/stop this process received, with its id and parameters, once), ``saved`` (step, path), ``exit``.

Two additions to the user's side, both stated here because the loop is the README's: the
``Client`` methods the loop calls are wrapped to log the directives they see (the only way to know
which run received which directive), and ``should_stop`` is agreed across the ranks with one MAX
all-reduce (a stop reaches two nodes' agents at different moments; a DDP rank that left its loop one
step before its peer would leave the peer in an all-reduce). ``$FTD_DAY_STARTUP_S`` makes the first
``train_step`` of a process take that long (a lazy compile, a slow data loader): the start-up from
``Client()`` to the first heartbeat.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[2] / "README.md"
STEP_S = float(os.environ.get("FTD_DAY_STEP_S", "0.1"))


def readme_loop(readme: Path = README) -> str:
    """The README's ``python`` block with the client loop; ValueError when it is gone."""
    for block in re.findall(r"```python\n(.*?)```", readme.read_text(), flags=re.S):
        if "from ftd.client import Client" in block and "client.should_stop()" in block:
            return str(block)
    raise ValueError(f"{readme}: no python block with the ftd.client training loop")


def main() -> int:
    out = Path(os.environ["FTD_DAY_DIR"])
    job = os.environ["SLURM_JOB_ID"]
    rank = int(os.environ["SLURM_PROCID"])
    world = int(os.environ["SLURM_NTASKS"])
    run = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    node = os.environ.get("SLURMD_NODENAME", "?")
    log = out / f"{job}-rank{rank}.jsonl"

    def record(what: str, **fields: Any) -> None:
        line = {"what": what, "job": job, "run": run, "rank": rank, "node": node, "pid": os.getpid()}
        with log.open("a") as f:
            f.write(json.dumps({**line, "t": time.time(), **fields}) + "\n")

    record("process_start")
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if world > 1:
        port = int(os.environ["FTD_DAY_PORT_BASE"]) + run  # a new rendezvous port per run
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=120),
        )
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    net = DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = out / f"{job}-ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)

    def newest_common_step() -> int:
        per_rank = [
            {int(p.name.split("-")[1]) for p in ckpt.glob(f"step-*-rank{r}.pt")} for r in range(world)
        ]
        common = set.intersection(*per_rank) if per_rank else set()
        return max(common, default=0)

    start_step = newest_common_step()
    if start_step:
        state = torch.load(ckpt / f"step-{start_step}-rank{rank}.pt")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    record("resumed", step=start_step)

    startup_s = float(os.environ.get("FTD_DAY_STARTUP_S", "0"))
    first = [True]
    g: dict[str, Any] = {"__name__": "__readme__"}

    def train_step() -> None:
        if first[0] and startup_s:
            record("startup_work", seconds=startup_s)
            time.sleep(startup_s)
        first[0] = False
        step = int(g["step"])
        gen = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(8, 16, generator=gen)
        loss = net(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(STEP_S)
        record("step", step=step, loss=loss.item())

    def save_checkpoint(step: int) -> str:
        path = ckpt / f"step-{step}-rank{rank}.pt"
        tmp = path.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
        os.replace(tmp, path)
        record("saved", step=step, path=str(path))
        return str(path)

    from ftd.client import Client

    seen: set[str] = set()
    plain_save, plain_stop = Client.should_save, Client.should_stop

    def note(client: Client) -> None:
        info = client.pending_directive
        if info is not None and info.id not in seen:
            seen.add(info.id)
            record("directive", action=info.action, id=info.id, reason=info.reason, params=info.params)

    def should_save(self: Client) -> bool:
        note(self)
        return plain_save(self)

    def should_stop(self: Client) -> bool:
        note(self)
        local = plain_stop(self)
        if world == 1:
            return local
        flag = torch.tensor([1 if local else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    Client.should_save = should_save  # type: ignore[method-assign]
    Client.should_stop = should_stop  # type: ignore[method-assign]

    g.update(start=start_step + 1, steps=10**9, train_step=train_step, save_checkpoint=save_checkpoint)
    exec(compile(readme_loop(), str(README), "exec"), g)
    record("exit", step=g.get("step"))
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
