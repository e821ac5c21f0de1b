"""``ftd bench checkpoint``: what the checkpoint tier (issue #34) costs the training loop, and how long
its background work takes.

Cases (``--cases``, comma-separated; the fault cases join this registry, :data:`CASES`):

- ``blocked``: for states of 10 MB, 100 MB and 1 GB (``--sizes`` in MB), float32 tensors of up to
  64 MB each, as a model and its optimizer would hold them: the seconds a plain synchronous
  ``torch.save`` of the state to the shared directory takes (the baseline: what a loop that saves
  its own way waits: ``sync_save_s`` with the file fsynced, as closing it on NFS does and as a
  checkpoint that survives its node must be; ``sync_save_page_cache_s`` without), against the seconds
  :meth:`~ftd.client.checkpoint.CheckpointTier.save` blocks the loop (the snapshot into CPU staging),
  the first save (buffers allocated) apart from the steady ones (buffers reused), then the
  background local write (fsync and manifest included) and shared flush. ``ratio`` = steady blocked
  / durable synchronous save, the figure judged (<= 0.1); ``ratio_page_cache`` against the save
  that only reached this machine's page cache is printed beside it, unjudged: the snapshot is a
  memory copy, and on a CPU-only host it cannot be ten times cheaper than a serialisation into
  memory (both run at memory speed); from a GPU it is a device-to-host copy into pinned memory.
- ``partner``: two real ranks (gloo on CPU, processes of their own) save the same sizes with the
  tier: the blocked time there, and how long the replica to the partner took.

Both directories are on this machine's disk (``--dir``, default a temporary directory): the shared
directory of a cluster is usually slower, which makes the baseline slower and the ratio smaller.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

SIZES_MB = (10, 100, 1000)
_TENSOR_MB = 64


def _state(mb: int) -> dict[str, Any]:
    import torch

    left = mb * 1024 * 1024 // 4  # float32 elements
    tensors = {}
    i = 0
    while left > 0:
        n = min(left, _TENSOR_MB * 1024 * 1024 // 4)
        tensors[f"layer{i}.weight"] = torch.randn(n)
        left -= n
        i += 1
    half = len(tensors) // 2 or 1
    names = list(tensors)
    return {
        "model": {k: tensors[k] for k in names[:half]},
        "optim": {"state": {k: tensors[k] for k in names[half:]}, "param_groups": [{"lr": 1e-3}]},
        "extra": {"step": 0},
    }


def _sync_save(state: dict[str, Any], directory: str, rounds: int) -> tuple[float, float]:
    """Median seconds of ``torch.save`` to ``directory``, and of the same save made durable (the
    file fsynced: what closing it on NFS does, and what a checkpoint must be to survive the node)."""
    import torch

    plain, durable = [], []
    for i in range(rounds):
        path = os.path.join(directory, f"sync-{i}.pt")
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(state, f)
            t1 = time.perf_counter()
            f.flush()
            os.fsync(f.fileno())
        t2 = time.perf_counter()
        plain.append(t1 - t0)
        durable.append(t2 - t0)
        os.unlink(path)
    return statistics.median(plain), statistics.median(durable)


def _case_blocked(sizes: list[int], root: str, rounds: int) -> dict[str, Any]:
    from ftd.client.checkpoint import CheckpointTier

    out: dict[str, Any] = {}
    for mb in sizes:
        state = _state(mb)
        base = os.path.join(root, f"blocked-{mb}")
        shared = os.path.join(base, "shared")
        os.makedirs(shared, exist_ok=True)
        sync_s, durable_s = _sync_save(state, shared, rounds)
        local = os.path.join(base, "local")
        tier = CheckpointTier(None, local, shared, every_k_flush=1, keep=1, partner=False)
        blocked = []
        for step in range(rounds + 1):
            blocked.append(tier.save(step, state))
            tier.wait()
        steady = statistics.median(blocked[1:])
        history = [h for h in tier.history if "local_s" in h][1:]
        tier.close()
        overlap = _overlapped(state, os.path.join(base, "overlap"), rounds)
        out[f"{mb}MB"] = {
            "sync_save_s": round(durable_s, 4),
            "sync_save_page_cache_s": round(sync_s, 4),
            "blocked_first_s": round(blocked[0], 4),
            "blocked_s": round(steady, 4),
            "ratio": round(steady / durable_s, 4) if durable_s > 0 else None,
            "ratio_page_cache": round(steady / sync_s, 4) if sync_s > 0 else None,
            "local_s": _median(history, "local_s"),
            "flush_s": _median(history, "shared_s"),
            "errors": [v for h in tier.history for k, v in h.items() if k in ("error", "local", "shared")],
            "overlap": {
                **overlap,
                "ratio": round(overlap["blocked_s"] / durable_s, 4) if durable_s > 0 else None,
            },
        }
        del state, tier
        shutil.rmtree(base, ignore_errors=True)
    return out


def _overlapped(state: dict[str, Any], local: str, rounds: int) -> dict[str, Any]:
    """The tier with ``overlap=True`` in a loop that trains the state's tensors: each step computes a
    gradient per tensor (one read and one write of the state: the least a backward pass over these
    weights does) and takes a real ``torch.optim.SGD`` step (whose pre-hook waits for the snapshot's
    copy). A save comes after a step, as in a loop; the copy then runs beside the next step's
    gradients. Per save, blocked = the seconds ``save()`` took + the seconds the next step waited;
    the loop's step time with the save's background write running beside it against without."""
    import torch

    params = [torch.nn.Parameter(t) for t in _tensors(state)]  # sharing the state's storage
    opt = torch.optim.SGD(params, lr=1e-9)
    tier = _overlap_tier(local)

    def grads() -> None:
        for p in params:
            p.grad = p.detach() * 1e-3

    def step() -> float:
        t0 = time.perf_counter()
        grads()
        opt.step()
        return time.perf_counter() - t0

    try:
        plain = [step() for _ in range(rounds + 1)][1:]
        saves, waits, during = [], [], []
        for i in range(rounds + 1):
            t0 = time.perf_counter()
            tier.save(i, state)  # after a step, as a loop saves
            saves.append(time.perf_counter() - t0)
            before = len(tier.step_waits)
            grads()  # the next step's backward: the copy runs beside it
            opt.step()  # waits for the copy when it is not done yet
            waits.append(sum(tier.step_waits[before:]))
            during.append(step())  # the next step, the background write still running beside it
            tier.wait()
        blocked = [a + b for a, b in zip(saves, waits, strict=True)][1:]
        history = [h for h in tier.history if "copy_s" in h][1:]
        return {
            "blocked_s": round(statistics.median(blocked), 4),
            "save_s": round(statistics.median(saves[1:]), 4),
            "step_wait_s": round(statistics.median(waits[1:]), 4),
            "copy_s": _median(history, "copy_s"),
            "step_s": round(statistics.median(plain), 4),
            "step_s_during_write": round(statistics.median(during[1:]), 4),
            "errors": [v for h in tier.history for k, v in h.items() if k in ("error", "local")],
        }
    finally:
        tier.close()
        for p in params:
            p.grad = None


def _overlap_tier(local: str) -> Any:
    """A local-only tier with the overlapped snapshot (torch imported only when the bench runs)."""
    from ftd.client.checkpoint import CheckpointTier

    return CheckpointTier(None, local, None, keep=1, partner=False, overlap=True)


def _tensors(obj: Any) -> list[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, list | tuple):
        return [t for v in obj for t in _tensors(v)]
    return []


def _median(history: list[dict[str, Any]], key: str) -> float | None:
    values = [h[key] for h in history if key in h]
    return round(statistics.median(values), 4) if values else None


def _case_partner(sizes: list[int], root: str, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mb in sizes:
        base = os.path.join(root, f"partner-{mb}")
        os.makedirs(base, exist_ok=True)
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "ftd.bench.checkpoint", str(r), str(mb), base, str(rounds)],
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )
            for r in range(2)
        ]
        codes = [p.wait(timeout=1800) for p in procs]
        results = []
        for r in range(2):
            path = os.path.join(base, f"rank{r}.json")
            if os.path.exists(path):
                with open(path) as f:
                    results.append(json.load(f))
        out[f"{mb}MB"] = {
            "exit_codes": codes,
            "blocked_s": max((r["blocked_s"] for r in results), default=None),
            "partner_s": max((r["partner_s"] for r in results if r["partner_s"] is not None), default=None),
            "partner_broken": [r["partner_broken"] for r in results if r["partner_broken"]],
        }
        shutil.rmtree(base, ignore_errors=True)
    return out


#: name -> function(sizes in MB, scratch directory, rounds) -> that case's figures.
CASES: dict[str, Callable[[list[int], str, int], dict[str, Any]]] = {
    "blocked": _case_blocked,
    "partner": _case_partner,
}


def bench_checkpoint(
    cases: list[str] | None = None,
    sizes: list[int] | None = None,
    samples: int | None = None,
    runs: int | None = None,
) -> dict[str, Any]:
    """The cases named (default every one): those of :data:`CASES`, and the fault cases
    (:mod:`ftd.bench.checkpoint_cases`, real Slurm and a DDP job; ``runs`` of each), under ``faults``."""
    from ftd.bench.checkpoint_faults import CASES as FAULT_CASES

    chosen = cases or [*CASES, *FAULT_CASES]
    unknown = sorted(set(chosen) - set(CASES) - set(FAULT_CASES))
    if unknown:
        known = ", ".join([*CASES, *FAULT_CASES])
        raise SystemExit(f"ftd bench checkpoint: unknown case(s) {', '.join(unknown)} (known: {known})")
    sizes = sizes or list(SIZES_MB)
    rounds = samples or 3
    root = tempfile.mkdtemp(prefix="ftd-bench-ckpt-", dir=os.environ.get("FTD_BENCH_DIR"))
    try:
        result: dict[str, Any] = {"sizes_mb": sizes, "rounds": rounds, "load": round(os.getloadavg()[0], 2)}
        for name in chosen:
            if name in CASES:
                result[name] = CASES[name](sizes, root, rounds)
        faults = [name for name in chosen if name in FAULT_CASES]
        if faults:
            from ftd.bench.checkpoint_cases import bench_faults

            result["faults"] = bench_faults(faults, runs or 1)
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _rank_main(rank: int, mb: int, base: str, rounds: int) -> None:
    """One rank of the ``partner`` case (``python -m ftd.bench.checkpoint RANK MB DIR ROUNDS``)."""
    import torch.distributed as dist

    from ftd.client.checkpoint import CheckpointTier

    store = dist.FileStore(os.path.join(base, "store"), 2)  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    state = _state(mb)
    tier = CheckpointTier(None, os.path.join(base, f"node{rank}"), None, keep=1)
    blocked = []
    for step in range(rounds + 1):
        blocked.append(tier.save(step, state))
        tier.wait()
    history = [h for h in tier.history if "partner_s" in h][1:]
    with open(os.path.join(base, f"rank{rank}.json"), "w") as f:
        json.dump(
            {
                "blocked_s": round(statistics.median(blocked[1:]), 4),
                "partner_s": _median(history, "partner_s"),
                "partner_broken": tier.partner_broken,
            },
            f,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
