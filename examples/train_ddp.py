"""A small, real DDP training job wired to ftd: save and stop when the agent (or a signal, a switch
file, the memory guard) asks, every rank at the same step, and resume from the newest complete
checkpoint.

Run it with torchrun (CPU, gloo)::

    torchrun --standalone --nproc-per-node=2 examples/train_ddp.py --steps 300 --ckpt-dir /tmp/ck

or on GPUs (nccl, one rank per GPU): ``--backend nccl`` (the default is nccl when CUDA is there).

What it shows:

- **Same step everywhere**: ``TorchCoordinator.agree`` all-reduces the save/stop flags each step
  (``--agree-every``), so all ranks save and stop at the same step.
- **Atomic checkpoints**: rank 0 writes ``ckpt-STEP.pt.tmp``, fsyncs, ``os.replace``s it to
  ``ckpt-STEP.pt``, then writes the manifest ``ckpt-STEP.json`` (size and sha256) the same way. A
  checkpoint without a manifest, or whose file does not match it, is never resumed from. The last
  two complete checkpoints are kept. Every rank acks only after a barrier, i.e. once the file is
  complete.
- **Deterministic**: the model's initial weights come from ``--seed``; the batch of each step is a
  function of (seed, step, rank) only, so a run resumed from step S replays exactly what the
  uninterrupted run did after S (Adam's state is in the checkpoint). One intra-op thread.
- **Observable**: rank 0 appends ``{"step", "loss"}`` per step to ``--metrics`` (JSON lines, losses
  with full float precision); every rank appends events (``started``, ``resumed``, ``saved``,
  ``stopped``, ``exit`` with ``outcome`` done/stopped/timeout).

Test knobs (environment): ``FTD_TEST_HANG_AT_STEP`` makes rank ``FTD_TEST_HANG_RANK`` (default 0)
sleep ``FTD_TEST_HANG_S`` seconds (default 3600) inside that step, once per checkpoint directory (a
marker file ``.hang-done`` stops the restarted job from hanging again): the rank stops
heart-beating, which is what the agent's hang detection watches.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ftd.client import Client
from ftd.client.torch import TorchCoordinator

IN_FEATURES, HIDDEN = 16, 64
_CKPT = re.compile(r"^ckpt-(\d+)\.json$")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--metrics", type=Path, default=None, help="JSON lines: per-step loss (rank 0), events")
    p.add_argument("--save-every", type=int, default=0, help="periodic checkpoint every N steps (0: off)")
    p.add_argument("--agree-every", type=int, default=1, help="all-reduce the ftd flags every N steps")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (tests)")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument("--max-seconds", type=float, default=0.0, help="give up after this long (0: never)")
    p.add_argument("--memory-guard-every", type=int, default=50, help="check memory every N steps (0: off)")
    return p.parse_args(argv)


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]


def target_weights(seed: int) -> torch.Tensor:
    return torch.randn(IN_FEATURES, 1, generator=torch.Generator().manual_seed(seed + 7))


def batch(seed: int, step: int, rank: int, size: int, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of ``rank`` at ``step``: a pure function of its arguments (resume replays it)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    x = torch.randn(size, IN_FEATURES, generator=g)
    y = torch.sin(x @ w) + 0.05 * torch.randn(size, 1, generator=g)
    return x, y


# --- checkpoints -------------------------------------------------------------------------------------


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save_checkpoint(ckpt_dir: Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write ``ckpt-STEP.pt`` then its manifest (both atomically); keep the newest ``keep``."""
    import io

    ckpt_dir.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    path = ckpt_dir / f"ckpt-{step:08d}.pt"
    _write_atomic(path, data)
    manifest = {
        "step": step,
        "file": path.name,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    _write_atomic(ckpt_dir / f"ckpt-{step:08d}.json", json.dumps(manifest).encode())
    for old_step, old_manifest in complete_checkpoints(ckpt_dir, verify=False)[keep:]:
        old_manifest.unlink(missing_ok=True)  # the manifest first: a half-deleted one is never used
        (ckpt_dir / f"ckpt-{old_step:08d}.pt").unlink(missing_ok=True)
    return path


def complete_checkpoints(ckpt_dir: Path, verify: bool = True) -> list[tuple[int, Path]]:
    """(step, manifest) of every checkpoint with a manifest (and, with ``verify``, a matching file),
    newest first."""
    found: list[tuple[int, Path]] = []
    if not ckpt_dir.is_dir():
        return found
    for entry in ckpt_dir.iterdir():
        m = _CKPT.match(entry.name)
        if not m:
            continue
        if verify:
            try:
                manifest = json.loads(entry.read_text())
                data = (ckpt_dir / manifest["file"]).read_bytes()
            except (OSError, ValueError, KeyError):
                continue
            if len(data) != manifest["size"] or hashlib.sha256(data).hexdigest() != manifest["sha256"]:
                continue
        found.append((int(m.group(1)), entry))
    return sorted(found, reverse=True)


def load_newest(ckpt_dir: Path) -> dict[str, Any] | None:
    for step, manifest_path in complete_checkpoints(ckpt_dir):
        manifest = json.loads(manifest_path.read_text())
        state: dict[str, Any] = torch.load(ckpt_dir / manifest["file"], map_location="cpu", weights_only=True)
        if state.get("step") == step:
            return state
    return None


# --- the job -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)

    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    distributed = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) >= 1
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if distributed:
        dist.init_process_group(backend)
        rank = dist.get_rank()
    world = dist.get_world_size() if distributed else 1

    log_file = open(args.metrics, "a", buffering=1) if args.metrics else None  # noqa: SIM115 - whole run

    def record(what: str, **fields: Any) -> None:
        if log_file is not None:
            log_file.write(json.dumps({"what": what, "rank": rank, "t": time.time(), **fields}) + "\n")

    # The ftd side: job from SLURM_JOB_ID/TORCHELASTIC_RUN_ID, rank from RANK, socket from FTD_SOCKET.
    client = Client(signals=True)
    coord = TorchCoordinator(client, every=args.agree_every)

    torch.manual_seed(args.seed)
    model = Mlp().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    start = 0
    state = load_newest(args.ckpt_dir)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
        record("resumed", step=start, job=client.job)
    record("started", step=start, job=client.job, world=world, backend=backend, device=str(device))
    ddp: nn.Module = DistributedDataParallel(model) if distributed else model
    w_true = target_weights(args.seed)
    loss_fn = nn.MSELoss()

    hang_at = int(os.environ.get("FTD_TEST_HANG_AT_STEP", "0") or 0)
    hang_rank = int(os.environ.get("FTD_TEST_HANG_RANK", "0"))
    hang_marker = args.ckpt_dir / ".hang-done"

    outcome = "done"
    step = start
    for step in range(start + 1, args.steps + 1):
        if hang_at and step == hang_at and rank == hang_rank and not hang_marker.exists():
            args.ckpt_dir.mkdir(parents=True, exist_ok=True)
            hang_marker.touch()
            record("hanging", step=step)
            time.sleep(float(os.environ.get("FTD_TEST_HANG_S", "3600")))
        x, y = batch(args.seed, step, rank, args.batch, w_true)
        loss = loss_fn(ddp(x.to(device)), y.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if rank == 0 and log_file is not None:
            log_file.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
        client.heartbeat(step)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if args.memory_guard_every and step % args.memory_guard_every == 0:
            client.memory_guard()
        save, stop = coord.agree(step)
        periodic = bool(args.save_every) and step % args.save_every == 0
        if save or periodic:
            path = args.ckpt_dir / f"ckpt-{step:08d}.pt"
            if rank == 0:
                state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
                save_checkpoint(args.ckpt_dir, step, state)
            if distributed:
                dist.barrier()  # every rank acks only once the checkpoint is complete
            if save:
                coord.saved(step, str(path))
            record("saved", step=step, path=str(path), requested=save)
        if stop:
            outcome = "stopped"
            record("stopped", step=step, reason=client.stop_reason or "directive")
            break
        if args.max_seconds and time.monotonic() - started > args.max_seconds:
            outcome = "timeout"
            break
    record("exit", step=step, outcome=outcome)
    client.close()
    if distributed:
        del ddp  # DDP's reducer holds the process group: drop it before the group goes
        dist.barrier()  # nobody tears the group down while a peer still talks to it
        dist.destroy_process_group()
    if log_file is not None:
        log_file.close()
    if outcome == "timeout":
        return 1
    # 0, or on Kubernetes 75 after ftd's stop directive: the Job's pod is then recreated (ftd.client)
    return client.exit_status()


if __name__ == "__main__":
    sys.exit(main())
