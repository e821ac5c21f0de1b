"""Run the preflight checks in order and give one verdict with a one-line reason.

:func:`run_preflight` is what ``ftd preflight`` and the agent's ``preflight`` node directive call
(the coordinator's return to service: :mod:`ftd.coordinator.upkeep.return_service`). The first
failing check decides the reason (``"gpu_inventory: 7 GPUs found, 8 expected"``); skipped checks
are listed with why. NVML comes from the backend passed in (the agent's, a fake in tests) or, when
none is, the real one; no NVML is a skip, never a failure on its own.

Fail closed: a preflight that could run no check at all (NVML failing, no torch, no DCGM, no site
command: every check skipped) did not show the node is fit, so it is not ``ok`` (``unchecked``;
``ftd preflight`` exits :data:`EXIT_UNCHECKED`). A gate that passed it would return a node with a
broken driver to service. A site whose nodes really have nothing to check opts out explicitly
(``agent.preflight.allow_unchecked``, ``ftd preflight --allow-unchecked``). NVML that starts but
sees no GPU is a failure of ``gpu_inventory``, not a pass that skips the rest, unless the node says it
has none (``nvml.expected_gpus = 0``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftd.agent.preflight import checks
from ftd.agent.preflight.checks import FAIL, CheckResult
from ftd.agent.watchers.nvml.backend import NvmlBackend, NvmlError
from ftd.config import AgentConfig

EXIT_FAILED = 1  # a check failed
EXIT_UNCHECKED = 3  # no check could run (every one skipped): not a pass unless allowed
CHECKS = (
    "gpu_inventory",
    "nvml_health",
    "ecc_remap",
    "gpu_compute",
    "dcgm_diag",
    "nccl_allreduce",
    "commands",
)


@dataclass(frozen=True)
class Report:
    ok: bool
    reason: str
    checks: list[CheckResult] = field(default_factory=list)
    unchecked: bool = False  # no check could run (every one skipped)

    @property
    def exit_code(self) -> int:
        """``ftd preflight``'s exit status: 0 passed, 1 a check failed, 3 nothing could be checked."""
        if self.ok:
            return 0
        return EXIT_UNCHECKED if self.unchecked else EXIT_FAILED

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "reason": self.reason,
            "unchecked": self.unchecked,
            "checks": [c.to_dict() for c in self.checks],
        }


def _open_backend(cfg: AgentConfig, backend: NvmlBackend | None) -> tuple[NvmlBackend | None, bool]:
    """(backend, opened here); None when NVML is off or not there. A backend handed in (the agent's
    own) is initialised again (NVML counts its inits) and left open."""
    if backend is not None:
        try:
            backend.init()
        except NvmlError:
            return None, False
        return backend, False
    if not cfg.nvml.enabled:
        return None, False
    from ftd.agent.watchers.nvml.real import RealNvml

    real = RealNvml()
    try:
        real.init()
    except NvmlError:
        return None, False
    return real, True


def run_preflight(
    cfg: AgentConfig,
    backend: NvmlBackend | None = None,
    *,
    skip: Collection[str] = (),
    allow_unchecked: bool | None = None,
    extra: Mapping[str, Callable[[], tuple[str, str]]] | None = None,
) -> Report:
    """Every check not in ``skip``, in :data:`CHECKS` order, then the ``extra`` ones the caller hands
    in (name -> a function answering ``(pass | fail | skip, reason)``: the RDMA node check of
    :mod:`ftd.agent.job_checks.node_check`); ``ok`` when none failed and at least one ran (or
    ``allow_unchecked``, default ``agent.preflight.allow_unchecked``)."""
    pf = cfg.preflight
    nvml, opened = _open_backend(cfg, backend)
    inventory = Path(cfg.state_dir) / "gpu-inventory.json"
    results: list[CheckResult] = []
    try:
        if "gpu_inventory" not in skip:
            result, gpus = checks.gpu_inventory(nvml, cfg.nvml.expected_gpus, inventory)
            results.append(result)
        else:
            gpus = []
        for name in CHECKS[1:]:
            if name in skip:
                continue
            if name == "nvml_health":
                results.append(checks.nvml_health(nvml, gpus))
            elif name == "ecc_remap":
                results.append(checks.ecc_remap(nvml, gpus))
            elif name == "gpu_compute":
                results.append(
                    checks.gpu_compute() if pf.gpu_compute else CheckResult(name, "skip", "turned off")
                )
            elif name == "dcgm_diag":
                results.append(
                    checks.dcgm_diag(timeout_s=pf.dcgm_timeout_s)
                    if pf.dcgm
                    else CheckResult(name, "skip", "turned off")
                )
            elif name == "nccl_allreduce":
                results.append(
                    checks.nccl_allreduce(pf.nccl_timeout_s)
                    if pf.nccl
                    else CheckResult(name, "skip", "turned off")
                )
            else:
                results.append(checks.commands(pf.commands, pf.command_timeout_s))
        for name, check in (extra or {}).items():
            if name in skip:
                continue
            try:
                status, reason = check()
            except Exception as exc:  # a broken extra check fails, it never passes
                status, reason = FAIL, f"{type(exc).__name__}: {exc}"[:300]
            results.append(CheckResult(name, status, reason))
    finally:
        if opened and nvml is not None:
            nvml.shutdown()
    failed = [r for r in results if r.status == FAIL]
    if failed:
        return Report(False, f"{failed[0].name}: {failed[0].reason}", results)
    if gpus:
        with contextlib.suppress(OSError):
            checks.record_inventory(inventory, gpus)
    # The extra checks do not count: an RDMA node check that passed says nothing of the GPUs, so a run
    # where none of CHECKS could run stays unchecked (fail closed).
    ran = sum(1 for r in results if r.status != "skip" and r.name in CHECKS)
    skipped = sum(1 for r in results if r.status == "skip")
    passed = f"{len(results) - skipped} check(s) passed, {skipped} skipped"
    passed += _gpu_checks_not_run(results, gpus)
    if ran == 0:
        allowed = pf.allow_unchecked if allow_unchecked is None else allow_unchecked
        if allowed:
            return Report(True, f"{passed} (unchecked: allowed)", results, unchecked=True)
        why = "; ".join(f"{r.name}: {r.reason}" for r in results) or "every check was skipped"
        reason = (
            f"no check could run, so this node's fitness is unknown ({why}); "
            "allow it with agent.preflight.allow_unchecked or --allow-unchecked"
        )
        return Report(False, reason, results, unchecked=True)
    return Report(True, passed, results)


def _gpu_checks_not_run(results: list[CheckResult], gpus: Collection[object]) -> str:
    """``"; not checked on this GPU node: ..."`` for each check that could not use the GPUs NVML found
    because torch is missing or sees no CUDA GPU (the documented install has no torch: the compute and
    NCCL checks of the return-to-service gate need it), or ``""``. A check the site turned off
    (``agent.preflight``) is not named: the site said so itself."""
    missed = [f"{r.name}: {r.reason}" for r in results if r.reason in (checks.NO_TORCH, checks.NO_CUDA)]
    if not gpus or not missed:
        return ""
    return f"; not checked on this GPU node: {'; '.join(missed)} (docs/operators.md: the full preflight)"


__all__ = ["CHECKS", "EXIT_FAILED", "EXIT_UNCHECKED", "Report", "run_preflight"]
