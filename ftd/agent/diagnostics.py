"""collect_diagnostics (agent side): stack dumps of this node's ranks and ``nvidia-smi -q``.

Called by the agent for a ``collect_diagnostics`` node directive (the coordinator side is
:mod:`ftd.coordinator.actions.diagnostics`)::

    result = await collect_diagnostics(directive, ranks, Path(config.state_dir) / "diagnostics")
    ack = result.to_ack(directive, node)          # publish on topics.node_acks(node)

``ranks`` are the :class:`~ftd.events.RankInfo` of the directive's job on this node (from
``LocalApi.jobs()[job]``; every registered rank when the directive names no job); when
``directive.params["ranks"]`` lists rank numbers only those are dumped. For each rank with a pid,
``py-spy dump --pid PID`` runs (all ranks at once, each with a timeout; the child is killed on
expiry); ``nvidia-smi -q`` runs when the binary is present. Everything lands in
``{out_dir}/{action id}/``: ``rank-{rank}-pid-{pid}.txt`` (or ``.err`` with the failure),
``nvidia-smi.txt`` and ``manifest.json`` (the result). A repeated directive (a resumed coordinator
action) finds the manifest and returns the recorded result instead of dumping again.

py-spy needs ptrace rights over the ranks: root, or ``CAP_SYS_PTRACE``, or the same user with
``kernel.yama.ptrace_scope = 0``. A refusal is reported per rank, never raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ftd.events import NODE_RANK, Ack, Directive, RankInfo

DEFAULT_TIMEOUT_S = 20.0
REQUIRED_CAPABILITIES: tuple[str, ...] = ("CAP_SYS_PTRACE",)
"""Capabilities py-spy needs to read the stacks of ranks that run as other users (the agent's
systemd unit must keep them in its bounding set; tests/unit/test_systemd_units.py checks)."""
REQUIRED_SYSCALLS: tuple[str, ...] = ("ptrace", "process_vm_readv", "wait4")
"""System calls ``py-spy dump`` makes beyond ordinary file and memory I/O: it stops each thread
(ptrace + wait4) and copies the interpreter's memory (process_vm_readv). Measured with
``strace -f -c py-spy dump`` (tests/unit/test_systemd_units.py re-measures it where strace exists);
the agent's unit must allow them (``@system-service`` has no ``ptrace``)."""
_SAFE_RE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class DiagnosticsResult:
    ok: bool  # every requested rank dumped (and nvidia-smi, when present, answered)
    path: str  # the directory holding the files
    summary: str  # one line, e.g. "py-spy 4/4 ranks; nvidia-smi ok"
    files: list[str] = field(default_factory=list)  # file names inside ``path``
    errors: dict[str, str] = field(default_factory=dict)  # "rank 3" / "nvidia-smi" -> why

    def to_ack(self, directive: Directive, node: str) -> Ack:
        """The node-level Ack: ``path`` is the directory, ``files`` what is in it, ``reason`` the summary."""
        return Ack(
            directive_id=directive.id,
            job=directive.job or "",
            rank=NODE_RANK,
            node=node,
            ok=self.ok,
            path=self.path,
            reason=self.summary,
            files=list(self.files),
            ts=time.time(),
        )


async def _run(argv: Sequence[str], timeout_s: float) -> tuple[int | None, bytes, bytes]:
    """Run ``argv``; (returncode, stdout, stderr), returncode None on timeout (the child is killed)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await proc.communicate()
    except (TimeoutError, asyncio.CancelledError) as exc:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        if isinstance(exc, asyncio.CancelledError):
            raise
        return None, b"", f"timed out after {timeout_s:g}s (killed)".encode()
    return proc.returncode, out, err


def _tool(name: str, given: str | None) -> str | None:
    if given is not None:
        return given if (os.path.sep in given and os.access(given, os.X_OK)) or shutil.which(given) else None
    found = shutil.which(name)
    if found is None:  # py-spy installed in the same venv as ftd, not on $PATH
        import sys

        candidate = Path(sys.executable).with_name(name)
        found = str(candidate) if os.access(candidate, os.X_OK) else None
    return found


async def collect_diagnostics(
    directive: Directive,
    ranks: Sequence[RankInfo],
    out_dir: str | Path,
    *,
    timeout_s: float | None = None,
    py_spy: str | None = None,
    nvidia_smi: str | None = None,
) -> DiagnosticsResult:
    """Dump every rank's Python stacks and the GPUs' state under ``out_dir/{action id}/``.

    ``timeout_s`` bounds each command (default: 20 s, or less to fit ``directive.deadline_s``).
    Never raises for a failing tool: failures are in ``errors`` and ``ok`` is False.
    """
    name = _SAFE_RE.sub("_", directive.action_id or directive.id).strip("._") or "diagnostics"
    target = Path(out_dir) / name
    manifest = target / "manifest.json"
    if manifest.exists():  # a repeated directive: answer from the record
        try:
            return DiagnosticsResult(**json.loads(manifest.read_text()))
        except (ValueError, TypeError):
            pass
    target.mkdir(parents=True, exist_ok=True)
    if timeout_s is None:
        timeout_s = DEFAULT_TIMEOUT_S
        if directive.deadline_s:
            timeout_s = max(1.0, min(timeout_s, directive.deadline_s * 0.8))

    wanted = directive.params.get("ranks") if isinstance(directive.params.get("ranks"), list) else None
    selected = [r for r in ranks if not wanted or r.rank in wanted]
    files: list[str] = []
    errors: dict[str, str] = {}
    spy = _tool("py-spy", py_spy)

    async def dump(rank: RankInfo) -> None:
        key = f"rank {rank.rank}"
        if rank.pid is None:
            errors[key] = "no pid registered"
            return
        stem = f"rank-{rank.rank}-pid-{rank.pid}"
        if spy is None:
            errors[key] = "py-spy not found"
            return
        try:
            rc, out, err = await _run([spy, "dump", "--pid", str(rank.pid)], timeout_s)
        except OSError as exc:
            errors[key] = f"cannot run py-spy: {exc}"
            return
        if rc == 0:
            (target / f"{stem}.txt").write_bytes(out)
            files.append(f"{stem}.txt")
        else:
            text = (err or out).decode(errors="replace").strip()
            (target / f"{stem}.err").write_text(text + "\n")
            files.append(f"{stem}.err")
            errors[key] = (text.splitlines() or [f"exit status {rc}"])[-1][:200]

    async def smi() -> str:
        tool = _tool("nvidia-smi", nvidia_smi)
        if tool is None:
            return "nvidia-smi absent"
        try:
            rc, out, err = await _run([tool, "-q"], timeout_s)
        except OSError as exc:
            errors["nvidia-smi"] = str(exc)
            return "nvidia-smi failed"
        (target / "nvidia-smi.txt").write_bytes(out if rc == 0 else out + err)
        files.append("nvidia-smi.txt")
        if rc != 0:
            errors["nvidia-smi"] = (err or out).decode(errors="replace").strip()[:200] or f"exit status {rc}"
            return "nvidia-smi failed"
        return "nvidia-smi ok"

    results = await asyncio.gather(smi(), *(dump(r) for r in selected))
    dumped = sum(1 for r in selected if f"rank {r.rank}" not in errors)
    summary = f"py-spy {dumped}/{len(selected)} ranks; {results[0]}"
    if errors:
        first = sorted(errors.items())[0]
        summary += f"; {first[0]}: {first[1]}"[:300]
    result = DiagnosticsResult(
        ok=not errors, path=str(target), summary=summary, files=sorted(files), errors=errors
    )
    manifest.write_text(json.dumps(asdict(result), indent=1) + "\n")
    return result
