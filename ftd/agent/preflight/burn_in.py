"""Burn-in: the long, thorough check of a drained or new node, with a report (issue #36 item 4).

What, in order (each step a :class:`ftd.platform.burn_in.StepResult`):

1. ``dcgm``: ``dcgmi diag -r LEVEL -j`` (level 3 by default) when ``dcgmi`` is on PATH; else skipped;
2. ``memtest``: two patterns over most of each GPU's free memory (:mod:`ftd.agent.preflight.gpu_probe`,
   a child process with a deadline); skipped when torch is missing or sees no GPU;
3. ``matmul``: BF16 matrix-multiply TFLOPS per GPU (the same probe), judged against the profile's
   figure in ``ftd/catalog/hardware/burn_in.toml``, the fleet's figure when given, and the node's own
   median (:func:`ftd.platform.burn_in.judge_throughput`): a slow GPU fails;
4. ``pair``: the pair test against known-good nodes, an injected async callable (the pair-test part
   builds it); skipped with the reason when none is given.

Never on a training node: ``training()`` (the jobs the Prolog reported here and the ranks registered
with the agent) is asked before the run and before each step; a job here refuses the run or stops it
(verdict ``refused``). A step skipped leaves the verdict ``incomplete``, never ``passed``.

The report goes to ``{state_dir}/burn-in/latest.json`` and ``latest.txt`` (and a copy named by its
start time), where ``ftd preflight --burn-in`` and the agent's ``burn_in`` directive leave it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftd.agent.diagnostics import _run as run_bounded
from ftd.agent.watchers.nvml.backend import NvmlBackend, NvmlError
from ftd.catalog.hardware_profiles import load_hardware_catalog
from ftd.config.schema import AgentConfig, HardwareConfig
from ftd.fileio import write_atomic
from ftd.logs import get_logger
from ftd.platform.burn_in import BurnInReport, StepResult, judge_throughput

__all__ = ["BurnInPlan", "PairTest", "node_profile", "plan_for", "plan_from", "run_burn_in", "save_report"]

log = get_logger(__name__)

PairTest = Callable[[], Awaitable[StepResult]]
Training = Callable[[], Sequence[str]]
PROBE = (sys.executable, "-m", "ftd.agent.preflight.gpu_probe")
STEPS = ("dcgm", "memtest", "matmul", "pair")


@dataclass(frozen=True)
class BurnInPlan:
    """What a burn-in runs, and its thresholds (:func:`plan_from` fills it from config and catalog)."""

    dcgm_level: int = 3
    dcgm_timeout_s: float = 3600.0
    memtest_fraction: float = 0.9
    memtest_timeout_s: float = 1800.0
    matmul_seconds: float = 10.0
    matmul_timeout_s: float = 600.0
    expected_tflops: float | None = None
    min_fraction: float = 0.8
    fleet_tflops: float | None = None
    fleet_min_fraction: float = 0.85
    skip: frozenset[str] = frozenset()
    probe: tuple[str, ...] = PROBE
    dcgmi: str | None = field(default_factory=lambda: shutil.which("dcgmi"))


def plan_from(section: Mapping[str, Any] | None, **settings: Any) -> BurnInPlan:
    """A plan from the profile's ``burn_in`` catalog section (None: no profile) and ``settings``
    (BurnInPlan fields; they win over the section)."""
    sec = dict(section or {})

    def num(key: str, default: float | None) -> float | None:
        value = sec.get(key, default)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default

    base = BurnInPlan()
    values: dict[str, Any] = {
        "expected_tflops": num("matmul_tflops", None),
        "min_fraction": num("min_fraction", base.min_fraction),
        "fleet_min_fraction": num("fleet_min_fraction", base.fleet_min_fraction),
        "memtest_fraction": num("memtest_fraction", base.memtest_fraction),
        "matmul_seconds": num("matmul_seconds", base.matmul_seconds),
    }
    values.update(settings)  # the caller's word over the catalog's
    return BurnInPlan(**values)


async def _run(argv: Sequence[str], timeout_s: float) -> tuple[int | None, str, str]:
    """(exit status or None on timeout, stdout, stderr tail) of ``argv``; the child's process group is
    killed at the deadline (:func:`ftd.agent.diagnostics._run`, the agent's one bounded runner)."""
    code, out, err = await run_bounded(argv, timeout_s)
    return code, out.decode(errors="replace"), err.decode(errors="replace")[-500:]


async def _dcgm(plan: BurnInPlan) -> StepResult:
    if plan.dcgmi is None:
        return StepResult("dcgm", "skip", "dcgmi is not on PATH (DCGM not installed)")
    argv = [plan.dcgmi, "diag", "-r", str(plan.dcgm_level), "-j"]
    code, out, err = await _run(argv, plan.dcgm_timeout_s)
    if code is None:
        return StepResult(
            "dcgm", "fail", f"dcgmi diag -r {plan.dcgm_level} ran past {plan.dcgm_timeout_s:g} s"
        )
    figures: dict[str, Any] = {"exit": code}
    with contextlib.suppress(ValueError):
        figures["result"] = json.loads(out)
    if code != 0:
        tail = (err or out).strip().splitlines()[-1:] or ["no output"]
        return StepResult(
            "dcgm", "fail", f"dcgmi diag -r {plan.dcgm_level} exited {code}: {tail[0][:200]}", figures
        )
    return StepResult("dcgm", "pass", f"dcgmi diag -r {plan.dcgm_level} passed", figures)


async def _probe(
    plan: BurnInPlan, step: str, args: Sequence[str], timeout_s: float
) -> StepResult | dict[str, Any]:
    code, out, err = await _run([*plan.probe, step, *args], timeout_s)
    if code is None:
        return StepResult(step, "fail", f"the GPU probe ran past {timeout_s:g} s (a hung GPU?)")
    try:
        result = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
    except ValueError:
        result = None
    if not isinstance(result, dict):
        return StepResult(step, "fail", f"the GPU probe exited {code} without a report: {err.strip()[-200:]}")
    if isinstance(result.get("skip"), str):
        return StepResult(step, "skip", result["skip"][:200])
    return result


def _figures(result: Mapping[str, Any], key: str) -> dict[str, float]:
    raw = result.get(key)
    if not isinstance(raw, dict):
        return {}
    return {
        str(k): float(v) for k, v in raw.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }


async def _memtest(plan: BurnInPlan) -> StepResult:
    result = await _probe(plan, "memtest", ["--fraction", str(plan.memtest_fraction)], plan.memtest_timeout_s)
    if isinstance(result, StepResult):
        return result
    tested = _figures(result, "gpus")
    errors = {str(k): str(v)[:300] for k, v in dict(result.get("errors") or {}).items()}
    figures = {"gib_tested": tested, "errors": errors}
    if errors:
        gpu, why = sorted(errors.items())[0]
        return StepResult("memtest", "fail", f"GPU {gpu}: {why}", figures)
    if not tested:
        return StepResult("memtest", "fail", "no GPU was tested", figures)
    total = sum(tested.values())
    return StepResult(
        "memtest", "pass", f"{len(tested)} GPU(s), {total:.1f} GiB written and read back", figures
    )


async def _matmul(plan: BurnInPlan) -> StepResult:
    result = await _probe(plan, "matmul", ["--seconds", str(plan.matmul_seconds)], plan.matmul_timeout_s)
    if isinstance(result, StepResult):
        return result
    errors = {str(k): str(v)[:300] for k, v in dict(result.get("errors") or {}).items()}
    if errors:
        gpu, why = sorted(errors.items())[0]
        return StepResult("matmul", "fail", f"GPU {gpu}: {why}", {"errors": errors})
    judged = judge_throughput(
        _figures(result, "gpus"),
        expected=plan.expected_tflops,
        min_fraction=plan.min_fraction,
        fleet=plan.fleet_tflops,
        fleet_min_fraction=plan.fleet_min_fraction,
    )
    names = result.get("names")
    if isinstance(names, dict):
        judged.figures["names"] = {str(k): str(v)[:100] for k, v in names.items()}
    return judged


async def run_burn_in(
    node: str,
    plan: BurnInPlan,
    *,
    training: Training,
    pair_test: PairTest | None = None,
    profile: str | None = None,
) -> BurnInReport:
    """Run the plan's steps in order on ``node`` unless it trains (module docstring)."""
    report = BurnInReport(node=node, started=time.time(), profile=profile)

    async def pair() -> StepResult:
        if pair_test is None:
            return StepResult("pair", "skip", "no pair test wired into this burn-in")
        return await pair_test()

    steps: dict[str, Callable[[], Awaitable[StepResult]]] = {
        "dcgm": lambda: _dcgm(plan),
        "memtest": lambda: _memtest(plan),
        "matmul": lambda: _matmul(plan),
        "pair": pair,
    }
    for name in STEPS:
        jobs = list(training())
        if jobs:
            when = "before it started" if not report.steps else f"before step {name}"
            report.refused = f"the node runs job(s) {', '.join(sorted(jobs)[:8])} ({when})"
            break
        if name in plan.skip:
            report.steps.append(StepResult(name, "skip", "left out (--skip)"))
            continue
        began = time.monotonic()
        try:
            result = await steps[name]()
        except Exception as exc:  # a step that breaks fails; the burn-in goes on and reports it
            log.exception("burn_in_step_failed", step=name)
            result = StepResult(name, "fail", f"{type(exc).__name__}: {exc}"[:300])
        result = StepResult(
            result.name, result.status, result.reason, result.figures, time.monotonic() - began
        )
        report.steps.append(result)
        log.info("burn_in_step", step=name, status=result.status, reason=result.reason)
    report.finished = time.time()
    return report


def save_report(report: BurnInReport, directory: Path) -> Path:
    """Write the report as JSON and text (``latest.*`` and a copy per run); returns the JSON's path."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(report.started))
    body = json.dumps(report.to_dict(), indent=2, sort_keys=True).encode()
    text = report.text().encode()
    for name in (f"burn-in-{stamp}", "latest"):
        write_atomic(directory / f"{name}.json", body, fsync=True)
        write_atomic(directory / f"{name}.txt", text, fsync=True)
    return directory / f"burn-in-{stamp}.json"


def node_profile(hardware: HardwareConfig, backend: NvmlBackend | None) -> tuple[str | None, str]:
    """(the node's hardware profile or None, how it was found): ``hardware.profile`` when set, else
    the first GPU's NVML name matched against the catalog."""
    catalog = load_hardware_catalog(Path(hardware.catalog) if hardware.catalog else None)
    if hardware.profile:
        return hardware.profile, "hardware.profile"
    if backend is None:
        return None, "no NVML to read the GPU name"
    try:
        backend.init()
        try:
            name = backend.identity(0).name if backend.device_count() else ""
        finally:
            backend.shutdown()
    except NvmlError as exc:
        return None, f"NVML: {exc}"[:200]
    profile = catalog.profile_for_gpu(name) if name else None
    return profile, f"GPU name {name!r}" if name else "no GPU name"


def plan_for(cfg: AgentConfig, hardware: HardwareConfig, profile: str | None, **extra: Any) -> BurnInPlan:
    """The plan of ``agent.preflight``'s burn-in settings and ``profile``'s ``burn_in`` section;
    ``extra`` (BurnInPlan fields) wins over both."""
    catalog = load_hardware_catalog(Path(hardware.catalog) if hardware.catalog else None)
    pf = cfg.preflight
    settings: dict[str, Any] = {
        "dcgm_level": pf.burn_in_dcgm_level,
        "dcgm_timeout_s": pf.burn_in_dcgm_timeout_s,
        "memtest_timeout_s": pf.burn_in_memtest_timeout_s,
        "matmul_timeout_s": pf.burn_in_matmul_timeout_s,
        "fleet_tflops": pf.burn_in_fleet_tflops or None,
    }
    return plan_from(catalog.section("burn_in", profile), **{**settings, **extra})
