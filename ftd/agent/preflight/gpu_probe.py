"""The burn-in's GPU steps, run as a child process: ``python -m ftd.agent.preflight.gpu_probe STEP``.

What: ``memtest --fraction F`` writes two patterns over ``F`` of each GPU's free memory and reads
them back (a mismatch or an allocation failure is that GPU's error); ``matmul --seconds S`` runs
BF16 8192 x 8192 matrix multiplies on each GPU for about ``S`` s after a warm-up and reports its
TFLOPS. Prints one JSON object: ``{"gpus": {index: figure}, "errors": {index: why}}``, or
``{"skip": why}`` when torch is missing or sees no CUDA GPU.

Why a child process: a CUDA fault (Xid, ECC) can kill or hang the process that meets it; the
burn-in's orchestrator (:mod:`ftd.agent.preflight.burn_in`) bounds it with a deadline and survives it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

__all__ = ["main"]

_CHUNK = 1 << 30  # bytes per tensor of the memory test


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return "torch sees no CUDA GPU"
    return torch


def memtest(torch: Any, fraction: float) -> dict[str, Any]:
    gpus: dict[str, float] = {}
    errors: dict[str, str] = {}
    for index in range(torch.cuda.device_count()):
        dev = torch.device("cuda", index)
        try:
            free, _ = torch.cuda.mem_get_info(dev)
            target = int(free * fraction)
            chunks = []
            done = 0
            while done + 8 <= target:
                size = min(_CHUNK, target - done) // 8
                if size == 0:
                    break
                chunks.append(torch.empty(size, dtype=torch.int64, device=dev))
                done += size * 8
            bad = 0
            for pattern in (0x5555_5555_5555_5555, -0x5555_5555_5555_5556):  # 0101..., 1010...
                for i, chunk in enumerate(chunks):
                    chunk.copy_(torch.arange(chunk.numel(), device=dev, dtype=torch.int64) ^ (pattern + i))
                for i, chunk in enumerate(chunks):
                    want = torch.arange(chunk.numel(), device=dev, dtype=torch.int64) ^ (pattern + i)
                    bad += int((chunk != want).sum().item())
            torch.cuda.synchronize(dev)
            del chunks
            torch.cuda.empty_cache()
            gpus[str(index)] = round(done / (1 << 30), 2)
            if bad:
                errors[str(index)] = f"{bad} word(s) read back wrong over {done / (1 << 30):.1f} GiB"
        except Exception as exc:  # CUDA errors surface as RuntimeError; any error is this GPU's
            errors[str(index)] = f"{type(exc).__name__}: {exc}"[:300]
    return {"gpus": gpus, "errors": errors, "unit": "GiB tested"}


def matmul(torch: Any, seconds: float, n: int = 8192) -> dict[str, Any]:
    gpus: dict[str, float] = {}
    names: dict[str, str] = {}
    errors: dict[str, str] = {}
    for index in range(torch.cuda.device_count()):
        dev = torch.device("cuda", index)
        try:
            a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
            b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
            for _ in range(5):
                torch.matmul(a, b)
            torch.cuda.synchronize(dev)
            iters, started = 0, time.perf_counter()
            while True:
                for _ in range(10):
                    torch.matmul(a, b)
                iters += 10
                torch.cuda.synchronize(dev)
                took = time.perf_counter() - started
                if took >= seconds:
                    break
            gpus[str(index)] = round(2 * n**3 * iters / took / 1e12, 1)
            names[str(index)] = str(torch.cuda.get_device_name(dev))
        except Exception as exc:
            errors[str(index)] = f"{type(exc).__name__}: {exc}"[:300]
    return {"gpus": gpus, "errors": errors, "unit": "TFLOPS", "names": names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_probe")
    parser.add_argument("step", choices=("memtest", "matmul"))
    parser.add_argument("--fraction", type=float, default=0.9)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    torch = _torch()
    if isinstance(torch, str):
        print(json.dumps({"skip": torch}))
        return 0
    if args.step == "memtest":
        out = memtest(torch, min(max(args.fraction, 0.0), 0.98))
    else:
        out = matmul(torch, max(args.seconds, 0.5))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
