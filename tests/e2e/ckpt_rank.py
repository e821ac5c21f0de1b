"""One rank of the checkpoint-tier test (tests/e2e/test_checkpoint_tier.py): real torch.distributed
(gloo, CPU), a DDP model, real files. ``save``: train, save with the tier at steps 2 and 4 (the shared
flush every 2nd save), dump what was saved. ``resume``: load_resume, dump what was loaded. ``move``:
each rank stands for a node of its own (``node{rank}``); the coordinator's partner choice (version 1,
each node to the next) is handed to every rank's client before the tier starts, then a new one
(version 2, each node to the previous) to rank 0's client only, between the saves of steps 2 and 4,
as an agent does when the coordinator's choice changes mid-run. ``due``: 40 steps saved where
``tier.due(step, 8)`` says, dump the steps saved and the landing lags agreed.

Usage: ckpt_rank.py PHASE RANK WORLD STORE TMP OUT
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ftd.client import Client, protocol
from ftd.client.checkpoint import CheckpointTier, capture_rng
from ftd.client.resume import load_resume


def digest(state: dict[str, torch.Tensor]) -> dict[str, str]:
    return {
        k: hashlib.sha256(v.detach().contiguous().numpy().tobytes()).hexdigest() for k, v in state.items()
    }


def main() -> None:
    phase, rank, world, store, tmp, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:]
    if phase == "move":
        socket.gethostname = lambda: f"node{rank}"  # type: ignore[assignment]  # one node per rank
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 8)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    local = os.path.join(tmp, f"node{rank}", "local")
    shared = os.path.join(tmp, "shared")
    client = Client(job="ckpt-test", rank=rank, connect=False)
    result: dict[str, object] = {"rank": rank}
    if phase == "move":
        nodes = [f"node{r}" for r in range(world)]
        first = {n: nodes[(i + 1) % world] for i, n in enumerate(nodes)}
        client._on_line(protocol.encode(protocol.partners("ckpt-test", first, 0, 1)), 0)
    if phase in ("save", "move"):
        tier = CheckpointTier(client, local, shared, every_k_flush=2, keep=2)
        saved = {}
        blocked = []
        for step in range(1, 6):
            opt.zero_grad()
            model(torch.randn(32, 256)).sum().backward()
            opt.step()
            if phase == "move" and step == 3 and rank == 0:  # the coordinator's choice changed
                assert tier.wait(300)  # after step 2's exchange, so that one used the first choice
                moved = {n: nodes[(i - 1) % world] for i, n in enumerate(nodes)}
                client._on_line(protocol.encode(protocol.partners("ckpt-test", moved, 0, 2)), 0)
            if step % 2 == 0:
                sd = model.module.state_dict()
                blocked.append(
                    tier.save(
                        step,
                        {
                            "model": sd,
                            "optim": opt.state_dict(),
                            "extra": {"step": step, "rng": capture_rng()},
                        },
                    )
                )
                saved[step] = digest(sd)
        assert tier.wait(300), "the background work did not finish"
        result.update(
            saved=saved,
            blocked=blocked,
            history=tier.history,
            partner_broken=tier.partner_broken,
            reports=[json.loads(m) for m in client._outbox],
        )
    elif phase == "due":  # saves planned by tier.due: every rank must take the very same steps
        tier = CheckpointTier(client, local, None, keep=2)
        steps_saved = []
        plans = []
        for step in range(1, 41):
            opt.zero_grad()
            model(torch.randn(32, 256)).sum().backward()
            opt.step()
            if tier.due(step, 8):
                tier.save(step, {"model": model.module.state_dict(), "extra": {"step": step}})
                steps_saved.append(step)
                plans.append(tier._plan_lag)
        assert tier.wait(300), "the background work did not finish"
        result.update(
            saves=steps_saved,
            plans=plans,
            lags=tier.landing_lags,
            landed=[h.get("landed_steps") for h in tier.history],
            partner_broken=tier.partner_broken,
        )
    else:
        resumed = load_resume(local, shared)
        if resumed is not None:
            result.update(
                step=resumed.step,
                level=resumed.level,
                manifest=resumed.manifest,
                loaded=digest(resumed.state["model"]),
                extra_step=resumed.state["extra"]["step"],
            )
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(result, f, default=str)


if __name__ == "__main__":
    main()
