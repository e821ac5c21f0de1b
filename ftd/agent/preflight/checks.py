"""The preflight checks, one function each: does this node deserve work (again)?

Each returns a :class:`CheckResult` -- ``pass``, ``fail`` with a one-line reason, or ``skip`` with
the reason it could not run (no NVML, no GPU, no torch, no DCGM: a check never fails for a tool
that is not there, it says so). In order:

* ``gpu_inventory``: GPU count against ``nvml.expected_gpus`` and the UUIDs against the node's
  recorded inventory (``{state_dir}/gpu-inventory.json``, written by the first passing run: a GPU
  swapped or gone since is named). NVML answering with 0 GPUs fails unless ``nvml.expected_gpus``
  is 0 (the explicit opt-out of a node without GPUs): otherwise every GPU check after it would skip
  and the node would pass with nothing checked;
* ``nvml_health``: every GPU answers NVML (not "GPU is lost"), no retired pages pending;
* ``ecc_remap``: no volatile uncorrectable (DBE) ECC errors, no row remap pending or failed, not past
  NVIDIA's SRAM replacement threshold (more than 4 uncorrectable SRAM errors over the GPU's life, or
  the driver's own threshold flag: :mod:`ftd.catalog.gpu_limits`);
* ``gpu_compute``: with torch and a CUDA GPU, allocate memory on each GPU and check a small matmul
  against the CPU;
* ``dcgm_diag``: ``dcgmi diag -r 1`` when DCGM is installed;
* ``nccl_allreduce``: with more than one GPU, a single-node NCCL all-reduce across all of them
  (one process per GPU, ``torch.distributed`` on loopback);
* ``commands``: the site's own checks (``agent.preflight.commands``), each must exit 0.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ftd.agent.watchers.nvml.backend import (
    GpuIdentity,
    NvmlBackend,
    NvmlError,
    NvmlGpuLost,
    NvmlNotSupported,
)
from ftd.catalog.gpu_limits import SRAM_UNCORRECTABLE_LIMIT, sram_over_limit

PASS, FAIL, SKIP = "pass", "fail", "skip"


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gpu_inventory(
    backend: NvmlBackend | None, expected: int | None, inventory_path: Path | None
) -> tuple[CheckResult, list[GpuIdentity]]:
    name = "gpu_inventory"
    if backend is None:
        return CheckResult(name, SKIP, "no NVML on this node"), []
    gpus: list[GpuIdentity] = []
    try:
        count = backend.device_count()
    except NvmlError as exc:
        return CheckResult(name, FAIL, f"GPU inventory unreadable: {exc}"), []
    for index in range(count):
        try:
            gpus.append(backend.identity(index))
        except NvmlGpuLost as exc:
            return CheckResult(name, FAIL, f"GPU {index} is lost: {exc}"), gpus
        except NvmlError as exc:
            return CheckResult(name, FAIL, f"GPU {index} unreadable: {exc}"), gpus
    if expected is not None and len(gpus) != expected:
        return CheckResult(name, FAIL, f"{len(gpus)} GPUs found, {expected} expected"), gpus
    if inventory_path is not None:
        try:
            recorded = json.loads(inventory_path.read_text())
        except FileNotFoundError:
            recorded = None
        except (OSError, ValueError) as exc:
            return CheckResult(name, FAIL, f"inventory {inventory_path} unreadable: {exc}"), gpus
        if isinstance(recorded, list):
            missing = sorted(set(recorded) - {g.uuid for g in gpus})
            if missing:
                return CheckResult(name, FAIL, f"GPU(s) gone from the inventory: {', '.join(missing)}"), gpus
    if not gpus and expected is None:
        # Nothing says this node should have none: 0 GPUs would pass here and skip every other
        # check (exit 0 with nothing checked). A node without GPUs says so: nvml.expected_gpus = 0.
        why = "NVML reports 0 GPUs and none are expected (a node without GPUs sets nvml.expected_gpus = 0)"
        return CheckResult(name, FAIL, why), gpus
    if not gpus:
        return CheckResult(name, PASS, "no GPU, as expected (nvml.expected_gpus = 0)"), gpus
    return CheckResult(name, PASS, f"{len(gpus)} GPU(s)"), gpus


def record_inventory(inventory_path: Path, gpus: Sequence[GpuIdentity]) -> None:
    """Remember the UUIDs of a passing node (only the first time: a swap is then named)."""
    if inventory_path.exists() or not gpus:
        return
    inventory_path.parent.mkdir(parents=True, exist_ok=True)
    inventory_path.write_text(json.dumps(sorted(g.uuid for g in gpus)))


def nvml_health(backend: NvmlBackend | None, gpus: Sequence[GpuIdentity]) -> CheckResult:
    name = "nvml_health"
    if backend is None or not gpus:
        return CheckResult(name, SKIP, "no NVML on this node" if backend is None else "no GPU")
    for gpu in gpus:
        try:
            backend.temperature_c(gpu.index)
            if backend.retired_pages_pending(gpu.index):
                why = f"GPU {gpu.index} ({gpu.pci}) has retired pages pending a reset"
                return CheckResult(name, FAIL, why)
        except NvmlGpuLost as exc:
            return CheckResult(name, FAIL, f"GPU {gpu.index} ({gpu.pci}) is lost: {exc}")
        except NvmlNotSupported:
            continue
        except NvmlError as exc:
            return CheckResult(name, FAIL, f"GPU {gpu.index} ({gpu.pci}) does not answer NVML: {exc}")
    return CheckResult(name, PASS)


def ecc_remap(backend: NvmlBackend | None, gpus: Sequence[GpuIdentity]) -> CheckResult:
    name = "ecc_remap"
    if backend is None or not gpus:
        return CheckResult(name, SKIP, "no NVML on this node" if backend is None else "no GPU")
    for gpu in gpus:
        where = f"GPU {gpu.index} ({gpu.pci})"
        try:
            ecc = backend.ecc_counters(gpu.index)
            if ecc.get("volatile_dbe", 0) > 0:
                return CheckResult(name, FAIL, f"{where}: {ecc['volatile_dbe']} uncorrectable ECC error(s)")
            sram = ecc.get("aggregate_dbe_sram", 0)
            if sram > SRAM_UNCORRECTABLE_LIMIT:
                why = (
                    f"{where}: {sram} uncorrectable SRAM errors over its life "
                    f"(more than {SRAM_UNCORRECTABLE_LIMIT}: replace the GPU)"
                )
                return CheckResult(name, FAIL, why)
            if sram_over_limit(ecc):
                why = f"{where}: the driver reports the SRAM error threshold exceeded (replace the GPU)"
                return CheckResult(name, FAIL, why)
        except NvmlNotSupported:
            pass
        except NvmlError as exc:
            return CheckResult(name, FAIL, f"{where}: ECC unreadable: {exc}")
        try:
            remap = backend.remapped_rows(gpu.index)
            if remap.failure:
                return CheckResult(name, FAIL, f"{where}: row remapping failed (out of spare rows)")
            if remap.pending:
                return CheckResult(name, FAIL, f"{where}: row remap pending (needs a GPU reset)")
        except NvmlNotSupported:
            pass
        except NvmlError as exc:
            return CheckResult(name, FAIL, f"{where}: remapped rows unreadable: {exc}")
    return CheckResult(name, PASS)


# Why a torch check could not run (the documented install has no torch; a CPU build, or one built for a
# newer CUDA than the driver, sees no GPU): the runner names these in its verdict on a GPU node.
NO_TORCH = "torch is not installed"
NO_CUDA = "torch sees no CUDA GPU"


def _torch_cuda() -> tuple[Any, str]:
    """torch when it is installed and sees a CUDA GPU, else (None, why not)."""
    try:
        import torch
    except ImportError:
        return None, NO_TORCH
    if not torch.cuda.is_available():
        return None, NO_CUDA
    return torch, ""


def gpu_compute(size: int = 1024, alloc_mb: int = 256) -> CheckResult:
    name = "gpu_compute"
    torch, why = _torch_cuda()
    if torch is None:
        return CheckResult(name, SKIP, why)
    a = torch.randn(size, size, generator=torch.Generator().manual_seed(0))
    b = torch.randn(size, size, generator=torch.Generator().manual_seed(1))
    expected = a @ b
    for index in range(torch.cuda.device_count()):
        device = torch.device("cuda", index)
        try:
            block = torch.empty(alloc_mb * (1 << 20) // 4, dtype=torch.float32, device=device)
            block.fill_(1.0)
            if float(block.sum().item()) != float(block.numel()):
                return CheckResult(name, FAIL, f"GPU {index}: memory does not hold what was written")
            del block
            got = (a.to(device) @ b.to(device)).cpu()
            torch.cuda.synchronize(device)
        except RuntimeError as exc:
            return CheckResult(name, FAIL, f"GPU {index}: {str(exc).splitlines()[0][:200]}")
        if not torch.allclose(got, expected, rtol=1e-2, atol=1e-2):
            return CheckResult(name, FAIL, f"GPU {index}: matmul differs from the CPU's")
    return CheckResult(name, PASS, f"{torch.cuda.device_count()} GPU(s)")


def dcgm_diag(dcgmi: str = "dcgmi", timeout_s: float = 300.0) -> CheckResult:
    name = "dcgm_diag"
    binary = shutil.which(dcgmi)
    if binary is None:
        return CheckResult(name, SKIP, "DCGM (dcgmi) is not installed")
    try:
        done = subprocess.run([binary, "diag", "-r", "1"], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return CheckResult(name, FAIL, f"dcgmi diag -r 1 did not finish in {timeout_s:g} s")
    except OSError as exc:
        return CheckResult(name, FAIL, f"dcgmi diag -r 1: {exc}")
    if done.returncode != 0 or "Fail" in done.stdout:
        output = (done.stdout + done.stderr).splitlines()
        lines = [ln.strip() for ln in output if "Fail" in ln or "Error" in ln]
        return CheckResult(name, FAIL, f"dcgmi diag -r 1 exit {done.returncode}: {(lines or ['?'])[0][:200]}")
    return CheckResult(name, PASS)


_ALLREDUCE = r"""
import os, sys, torch, torch.distributed as dist
rank, world = int(sys.argv[1]), int(sys.argv[2])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:" + sys.argv[3], rank=rank, world_size=world)
t = torch.full((1 << 20,), float(rank + 1), device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
ok = bool(torch.all(t == world * (world + 1) / 2).item())
dist.destroy_process_group()
sys.exit(0 if ok else 3)
"""


def nccl_allreduce(timeout_s: float = 120.0) -> CheckResult:
    name = "nccl_allreduce"
    torch, why = _torch_cuda()
    if torch is None:
        return CheckResult(name, SKIP, why)
    world = torch.cuda.device_count()
    if world < 2:
        return CheckResult(name, SKIP, f"{world} GPU: nothing to all-reduce across")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = [
        subprocess.Popen([sys.executable, "-c", _ALLREDUCE, str(r), str(world), port], stderr=subprocess.PIPE)
        for r in range(world)
    ]
    failed = []
    for rank, proc in enumerate(procs):
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            return CheckResult(name, FAIL, f"NCCL all-reduce across {world} GPUs hung past {timeout_s:g} s")
        if proc.returncode != 0:
            last = err.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
            failed.append(f"rank {rank} exit {proc.returncode}: {last[0][:160]}")
    if failed:
        return CheckResult(name, FAIL, "NCCL all-reduce failed: " + "; ".join(failed[:2]))
    return CheckResult(name, PASS, f"{world} GPUs")


def commands(argvs: Sequence[str], timeout_s: float) -> CheckResult:
    """The site's own checks: each command line must exit 0 (its last output line is the reason)."""
    name = "commands"
    if not argvs:
        return CheckResult(name, SKIP, "no agent.preflight.commands configured")
    for number, line in enumerate(argvs, 1):
        try:
            done = subprocess.run(
                line, shell=True, capture_output=True, text=True, timeout=timeout_s, env=dict(os.environ)
            )
        except subprocess.TimeoutExpired:
            return CheckResult(name, FAIL, f"command {number} did not finish in {timeout_s:g} s: {line[:80]}")
        if done.returncode != 0:
            # Its own last line says why (short: it ends up in Slurm's drain reason); else the command.
            last = (done.stdout + done.stderr).strip().splitlines()[-1:] or [line[:80]]
            return CheckResult(name, FAIL, f"command {number} exit {done.returncode}: {last[0][:160]}")
    return CheckResult(name, PASS, f"{len(argvs)} command(s)")


__all__ = [
    "FAIL",
    "PASS",
    "SKIP",
    "CheckResult",
    "commands",
    "dcgm_diag",
    "ecc_remap",
    "gpu_compute",
    "gpu_inventory",
    "nccl_allreduce",
    "nvml_health",
    "record_inventory",
]
