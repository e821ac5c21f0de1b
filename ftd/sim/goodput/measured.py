"""The goodput set-up built only from measured costs (issue #34): the ``measured`` scenario's numbers.

What: every cost the ``measured`` scenario of ``ftd/sim/data/llama3_faults.toml`` charges, derived here
from a measurement with its source, so a test can check the data file against the measurements:

- the blocked time of a periodic save (``save_s``) and the checkpoint load (``load_s``): the GPU
  measurement in ``ftd/sim/data/checkpoint_costs.json`` (one H200, the script that measured it is in
  the file), for one GPU's share of the Llama 3 405B training state: 405e9 parameters x 14 bytes
  (bf16 weights, fp32 master weights, Adam's two fp32 moments) / 16,384 GPUs = 346 MB, taken at the
  smallest measured size that holds it (346 MiB): an asynchronous save blocks training only while
  the state is copied into pinned host buffers; the write to disk runs behind the next steps;
- the in-allocation restart (stop, warm start, rendezvous and first step): ``ftd bench recovery``
  (:data:`ftd.sim.goodput.inalloc.BENCH_COSTS`); the scheduler requeue (``restart_s``): the same
  bench's requeue path, fault to first step, median of three runs (docs/architecture.md section 10);
- detection by ftd (``ftd_detect_s``): ``ftd bench e2e`` p99, as in the other scenarios;
- the checkpoint interval: the Young/Daly optimum from the measured save and the mix's job MTBF.

Why a module: the figures come from benches, and the scenario must not drift from them. What is not
a cost (the fault mix, the NCCL watchdog, the launcher's reaction, how often a bad node comes back,
repair times, spare counts) stays as in ``meta``/``ftd-spares``: those describe the site, not ftd.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ftd.sim.goodput.faults import FaultMix
from ftd.sim.goodput.runner import young_daly_s

LLAMA3_PARAMS = 405e9  # Llama 3 405B (Dubey et al. 2024)
BYTES_PER_PARAM = 14  # bf16 weights 2 + fp32 master weights 4 + Adam's two fp32 moments 8
REQUEUE_S = 9.9  # ftd bench recovery, scheduler requeue, fault -> first step, median of 9.8-10.0 s
ALLOC_SPARES = 16  # as ftd-spares: 16 hot spares in the allocation (0.8% of 2,048 nodes)
MEASUREMENTS = "checkpoint_costs.json"


class MeasureError(ValueError):
    """The measurements do not cover what was asked."""


@dataclass(frozen=True)
class SaveCosts:
    """Median seconds for one rank's state of ``state_bytes`` (a measured size)."""

    state_bytes: int
    snapshot_s: float  # the async save's blocked part: the copy into pinned host buffers
    flush_s: float  # its background part: the host copy written to the local disk
    sync_save_s: float  # a plain synchronous torch.save to the local disk: the baseline
    load_s: float  # torch.load onto the GPU
    source: str


def load_measurements() -> dict[str, Any]:
    text = resources.files("ftd.sim").joinpath("data", MEASUREMENTS).read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def per_gpu_state_bytes(params: float = LLAMA3_PARAMS, gpus: int = 16384) -> float:
    """One GPU's share of the training state when it is sharded evenly over ``gpus``."""
    return params * BYTES_PER_PARAM / gpus


def save_costs(state_bytes: float, data: dict[str, Any] | None = None) -> SaveCosts:
    """The costs measured at the smallest size that holds ``state_bytes`` (never extrapolated)."""
    data = data if data is not None else load_measurements()
    sizes = sorted(data["sizes"].values(), key=lambda s: s["bytes"])
    for size in sizes:
        if size["bytes"] >= state_bytes:
            m = size["median"]
            return SaveCosts(
                state_bytes=size["bytes"],
                snapshot_s=m["snapshot_pinned_s"],
                flush_s=m["flush_s"],
                sync_save_s=m["sync_save_s"],
                load_s=m["load_s"],
                source=f"{data['gpu']}, torch {data['torch']}: {data['measured']}",
            )
    largest = sizes[-1]["bytes"] if sizes else 0
    raise MeasureError(f"{state_bytes:.0f} bytes per rank: the largest measured is {largest}")


def measured_values(mix: FaultMix, job_gpus: int = 16384) -> dict[str, Any]:
    """The ``measured`` scenario's costs for ``mix`` (the rest of the scenario is the site's)."""
    costs = save_costs(per_gpu_state_bytes(gpus=job_gpus))
    return {
        "save_s": costs.snapshot_s,
        "load_s": costs.load_s,
        "restart_s": REQUEUE_S,
        "checkpoint_interval_s": young_daly_s(mix.job_mtbf_s(job_gpus), costs.snapshot_s),
        "in_allocation": True,
        "alloc_spares": ALLOC_SPARES,
        "warm_spares": True,
    }


__all__ = [
    "BYTES_PER_PARAM",
    "LLAMA3_PARAMS",
    "REQUEUE_S",
    "MeasureError",
    "SaveCosts",
    "load_measurements",
    "measured_values",
    "per_gpu_state_bytes",
    "save_costs",
]
