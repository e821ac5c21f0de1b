"""One rank of the FSDP checkpoint-tier test (tests/e2e/test_checkpoint_fsdp.py): real
torch.distributed (gloo, CPU), a model sharded with FSDP2 ``fully_shard``, its sharded state
(``torch.distributed.checkpoint.state_dict.get_state_dict``: model and Adam state as DTensors) saved
through the tier as docs/checkpoints.md says, real files.

``save``: train, save at steps 2 and 4, dump digests of this rank's local shards. ``resume``: a fresh
model (another seed, so its parameters differ) and optimizer, ``load_resume``, the shards copied back
in place with ``copy_into`` and set with ``set_state_dict``; dump the digests before and after.

Usage: ckpt_fsdp_rank.py PHASE RANK WORLD STORE TMP OUT
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from ftd.client import Client
from ftd.client.checkpoint import CheckpointTier
from ftd.client.resume import copy_into, load_resume


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def digest(obj: Any, key: str = "") -> dict[str, str]:
    """sha256 of every tensor's local shard, by its place in the state (plain values by repr)."""
    if isinstance(obj, dict):
        out: dict[str, str] = {}
        for k, v in obj.items():
            out.update(digest(v, f"{key}/{k}"))
        return out
    if isinstance(obj, (list, tuple)):
        out = {}
        for i, v in enumerate(obj):
            out.update(digest(v, f"{key}/{i}"))
        return out
    if isinstance(obj, torch.Tensor):
        t = _local(obj).detach().contiguous()
        return {key: f"{t.dtype}{tuple(t.shape)}:" + hashlib.sha256(t.numpy().tobytes()).hexdigest()}
    return {key: repr(obj)}


def main() -> None:
    phase, rank, world, store, tmp, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:]
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0 if phase == "save" else 1234)  # the restart starts from other weights
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    local = os.path.join(tmp, f"node{rank}", "local")
    shared = os.path.join(tmp, "shared")
    client = Client(job="ckpt-fsdp", rank=rank, connect=False)
    result: dict[str, object] = {"rank": rank}
    if phase == "save":
        tier = CheckpointTier(client, local, shared, every_k_flush=2, keep=2)
        saved = {}
        for step in range(1, 6):
            opt.zero_grad()
            model(torch.randn(16, 64)).pow(2).sum().backward()
            opt.step()
            if step % 2 == 0:
                msd, osd = get_state_dict(model, opt)
                tier.save(step, {"model": msd, "optim": osd, "extra": {"step": step}})
                saved[step] = {"model": digest(msd), "optim": digest(osd)}
        assert tier.wait(300), "the background work did not finish"
        result.update(saved=saved, history=tier.history, partner_broken=tier.partner_broken)
    else:
        msd, osd = get_state_dict(model, opt)  # DTensors; the optimizer's state initialised
        result["fresh"] = {"model": digest(msd), "optim": digest(osd)}
        resumed = load_resume(local, shared)
        assert resumed is not None
        copy_into(msd, resumed.state["model"])
        copy_into(osd, resumed.state["optim"])
        set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
        msd, osd = get_state_dict(model, opt)  # read back from the live model and optimizer
        result.update(
            step=resumed.step,
            level=resumed.level,
            extra_step=resumed.state["extra"]["step"],
            loaded={"model": digest(msd), "optim": digest(osd)},
        )
        opt.zero_grad()
        model(torch.randn(16, 64)).pow(2).sum().backward()  # training goes on from the loaded state
        opt.step()
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(result, f, default=str)


if __name__ == "__main__":
    main()
