"""GPU reset on a coordinator directive (``action = "gpu_reset"`` on ``ftd/v1/nodes/{node}/directives``).

Safety first (docs/architecture.md §11.3: "GPU reset never runs while a process holds the GPU"):

1. resolve the target GPU from ``directive.params`` (``pci``, ``uuid`` or ``index``) against
   ``nvidia-smi --query-gpu=index,pci.bus_id,uuid``; an unknown GPU fails;
2. list the compute processes (``nvidia-smi --query-compute-apps=pid,gpu_uuid``); if any holds the
   target, or the list cannot be obtained at all, the reset is **refused** (never reset blind);
3. run ``nvidia-smi -r -i <pci>``; a non-zero exit (or a timeout) **fails**;
4. re-check: the GPU must be listed again with its UUID and no process on it, else it **failed**.

``params["check_only"]`` (the coordinator's check after a reboot it asked for): steps 1 and 4 only,
no reset -- the GPU listed with its UUID is **healthy** (an ok answer), else **failed**.

The outcome is reported twice: as a ``gpu_health`` event (data: result = ``reset_ok`` / ``refused`` /
``failed``, reason, gpu, directive_id) for the ledger, and as an :class:`~ftd.events.Ack` on
``ftd/v1/nodes/{node}/acks`` (``directive_id``, ``ok``, ``reason``; ``job`` is the directive's job or
``""`` and ``rank`` is ``-1``: it is the node answering, not a trainer) so the coordinator can wait on
it. Resets are serialised, and a re-delivered directive (QoS 1 duplicate) gets the first answer
again instead of a second reset.

The command runner is injectable (:data:`Runner`), so tests exercise the parsing and the decision
logic with a fake ``nvidia-smi`` and never touch a real GPU.
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ftd.events import NODE_RANK, Ack, Directive, Event, Kind, Severity, make_event
from ftd.logs import get_logger

__all__ = ["GpuResetter", "ResetResult", "Runner", "subprocess_runner"]

log = get_logger(__name__)

Runner = Callable[[list[str]], Awaitable[tuple[int, str]]]
"""Runs argv; returns (exit status, stdout+stderr). A timeout or missing binary returns (-1, reason)."""


def subprocess_runner(timeout_s: float = 60.0) -> Runner:
    async def run(argv: list[str]) -> tuple[int, str]:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
            )
        except OSError as exc:
            return -1, f"cannot run {argv[0]}: {exc}"
        try:
            async with asyncio.timeout(timeout_s):
                out, _ = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return -1, f"{argv[0]} timed out after {timeout_s}s"
        return proc.returncode or 0, out.decode("utf-8", errors="replace")

    return run


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    pci: str
    uuid: str


@dataclass(frozen=True, slots=True)
class ResetResult:
    result: str  # reset_ok | healthy (check_only) | refused | failed
    reason: str
    gpu: Gpu | None = None

    @property
    def ok(self) -> bool:
        return self.result in ("reset_ok", "healthy")


def _norm_pci(value: str) -> str:
    """``00000000:3B:00.0`` / ``0000:3b:00.0`` / ``3b:00.0`` -> ``0000:3b:00.0``."""
    text = value.strip().lower()
    match = re.fullmatch(r"(?:([0-9a-f]{4,8}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])", text)
    if not match:
        return text
    domain = (match.group(1) or "0000")[-4:]
    return f"{domain}:{match.group(2)}:{match.group(3)}.{match.group(4)}"


class GpuResetter:
    def __init__(self, node: str, *, runner: Runner | None = None, smi: str = "nvidia-smi") -> None:
        self.node = node
        self._run = runner or subprocess_runner()
        self._smi = smi
        self._lock = asyncio.Lock()
        self._answered: OrderedDict[str, ResetResult] = OrderedDict()

    async def gpus(self) -> list[Gpu] | str:
        rc, out = await self._run([self._smi, "--query-gpu=index,pci.bus_id,uuid", "--format=csv,noheader"])
        if rc != 0:
            return f"cannot list GPUs (exit {rc}): {out.strip()[:200]}"
        found: list[Gpu] = []
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 3 and parts[0].isdecimal():
                found.append(Gpu(int(parts[0]), _norm_pci(parts[1]), parts[2]))
        return found

    async def holders(self) -> list[tuple[int, str]] | str:
        """(pid, gpu uuid) of every compute process, or a reason why they cannot be listed."""
        rc, out = await self._run([self._smi, "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"])
        if rc != 0:
            return f"cannot list GPU processes (exit {rc}): {out.strip()[:200]}"
        found: list[tuple[int, str]] = []
        for line in out.splitlines():
            if not line.strip() or "No running" in line:
                continue
            parts = [p.strip() for p in line.split(",")]
            if len(parts) < 2 or not parts[0].isdecimal():
                return f"unexpected process list line {line.strip()[:100]!r}"  # refuse rather than guess
            found.append((int(parts[0]), parts[1]))
        return found

    def _target(self, directive: Directive, gpus: list[Gpu]) -> Gpu | str:
        params = directive.params
        if isinstance(params.get("pci"), str):
            want = _norm_pci(params["pci"])
            match = [g for g in gpus if g.pci == want]
        elif isinstance(params.get("uuid"), str):
            match = [g for g in gpus if g.uuid == params["uuid"]]
        elif isinstance(params.get("index"), int) and not isinstance(params.get("index"), bool):
            match = [g for g in gpus if g.index == params["index"]]
        else:
            return "directive names no GPU (params.pci, params.uuid or params.index)"
        return match[0] if match else f"no such GPU on this node: {params}"

    async def reset(self, directive: Directive) -> ResetResult:
        """Decide and (maybe) reset; see the module docstring."""
        cached = self._answered.get(directive.id)
        if cached is not None:
            return cached
        async with self._lock:
            cached = self._answered.get(directive.id)
            if cached is not None:
                return cached
            result = await self._reset(directive)
            self._answered[directive.id] = result
            while len(self._answered) > 256:
                self._answered.popitem(last=False)
        log.info("gpu_reset", result=result.result, reason=result.reason, directive_id=directive.id)
        return result

    async def _reset(self, directive: Directive) -> ResetResult:
        gpus = await self.gpus()
        if isinstance(gpus, str):
            return ResetResult("failed", gpus)
        target = self._target(directive, gpus)
        if isinstance(target, str):
            return ResetResult("failed", target)
        if directive.params.get("check_only") is True:
            return ResetResult("healthy", f"listed as {target.uuid} at {target.pci}", target)
        holders = await self.holders()
        if isinstance(holders, str):
            return ResetResult("refused", holders, target)
        pids = sorted(pid for pid, uuid in holders if uuid == target.uuid)
        if pids:
            return ResetResult("refused", f"GPU in use by pid(s) {', '.join(map(str, pids))}", target)
        rc, out = await self._run([self._smi, "-r", "-i", target.pci])
        if rc != 0:
            return ResetResult("failed", f"nvidia-smi -r exit {rc}: {out.strip()[:300]}", target)
        after = await self.gpus()
        if isinstance(after, str):
            return ResetResult("failed", f"after reset: {after}", target)
        if not any(g.uuid == target.uuid for g in after):
            return ResetResult("failed", "GPU not listed after reset", target)
        return ResetResult("reset_ok", out.strip()[:300] or "reset", target)

    def report(self, directive: Directive, result: ResetResult) -> tuple[Event, Ack]:
        """The ``gpu_health`` event and the :class:`Ack` answering ``directive``."""
        gpu = result.gpu
        data: dict[str, object] = {
            "result": result.result,
            "reason": result.reason,
            "directive_id": directive.id,
            "action_id": directive.action_id,
        }
        if gpu is not None:
            data.update({"pci": gpu.pci, "uuid": gpu.uuid, "index": gpu.index})
        severity = {"reset_ok": Severity.INFO, "healthy": Severity.INFO, "refused": Severity.WARNING}.get(
            result.result, Severity.ERROR
        )
        event = make_event(self.node, Kind.GPU_HEALTH, severity=severity, source="gpu_reset", data=data)
        ack = Ack(
            directive_id=directive.id,
            job=directive.job or "",
            rank=NODE_RANK,
            node=self.node,
            ok=result.ok,
            reason=f"{result.result}: {result.reason}",
            ts=event.ts,
        )
        return event, ack
