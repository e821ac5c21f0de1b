"""The diagnostic bundle of a node drained for repair: one tar.gz with a manifest (issue #36 item 5).

What goes in (each file listed in ``manifest.json`` with its size and SHA-256; each part that could
not be collected listed under ``missing`` with the reason, never silently absent):

* ``nvidia-bug-report.log.gz``: NVIDIA's ``nvidia-bug-report.sh`` when it is on PATH, bounded by a
  deadline (its own run takes minutes on a big node; killed at the deadline, the partial output kept);
* ``kmsg.txt``: the kernel log's window (the last ``kmsg_window_s`` seconds of ``/dev/kmsg`` records,
  read without blocking; the agent's ``kmsg_path``);
* ``nvml.json``: the NVML state of every GPU (identity, ECC counters, remapped rows, temperature,
  throttle reasons, power, PCIe replays), each call's error kept in place of its value;
* ``ftd/``: ftd's evidence for the node: the agent's state files (active conditions, jobs, GPU
  inventory, the latest burn-in report) and what the coordinator sent with the request (the drain's
  reason and the node's recent events, ``evidence.json``).

The bundle is ``{state_dir}/rma/{node}-{UTC time}.tar.gz``; the agent answers the coordinator's
``rma_bundle`` directive with its path and publishes an ``rma_bundle`` event (:mod:`ftd.agent.node_actions`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

__all__ = ["Bundle", "NvmlLike", "Runner", "collect_bundle", "kmsg_window", "nvml_state"]

STATE_FILES = (
    "conditions.json",
    "jobs.json",
    "gpu-inventory.json",
    "burn-in/latest.json",
    "burn-in/latest.txt",
)
MAX_KMSG_BYTES = 8 << 20
MAX_EVIDENCE_BYTES = 4 << 20


Runner = Callable[[Sequence[str], float], Awaitable[tuple[int | None, bytes, bytes]]]
"""(argv, timeout) -> (exit status or None at the deadline, stdout, stderr)."""


class NvmlLike(Protocol):
    """The NVML backend's calls the bundle uses (ftd.agent.watchers.nvml.backend.NvmlBackend)."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def device_count(self) -> int: ...
    def identity(self, index: int) -> Any: ...
    def ecc_counters(self, index: int) -> dict[str, int]: ...
    def remapped_rows(self, index: int) -> Any: ...
    def temperature_c(self, index: int) -> float: ...
    def throttle_reasons(self, index: int) -> int: ...
    def power_w(self, index: int) -> float: ...
    def pcie_replay_count(self, index: int) -> int: ...


@dataclass
class Bundle:
    path: str
    bytes: int
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def summary(self) -> str:
        gone = f"; missing: {', '.join(sorted(self.missing))}" if self.missing else ""
        return f"{len(self.files)} file(s), {self.bytes} bytes in {self.path}{gone}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "bytes": self.bytes,
            "files": self.files,
            "missing": self.missing,
            "seconds": round(self.seconds, 3),
        }


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def kmsg_window(path: str, window_s: float, now_us: int | None = None) -> tuple[str, str | None]:
    """(the records of the last ``window_s`` seconds as text, or why none could be read). ``path``
    is ``/dev/kmsg`` (read without blocking, from the start of the kernel's buffer) or a file in its
    record format; ``now_us`` is the kernel clock now (CLOCK_MONOTONIC; a test passes its own)."""
    now = now_us if now_us is not None else time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    since = now - int(window_s * 1_000_000)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return "", f"{path}: {_err(exc)}"
    chunks: list[bytes] = []
    total = 0
    try:
        while total < 64 * MAX_KMSG_BYTES:
            try:
                chunk = os.read(fd, 16384)
            except BlockingIOError:
                break  # /dev/kmsg: no more records
            except OSError as exc:
                if exc.errno == 32:  # EPIPE: records overwritten while reading; go on with the next
                    continue
                return "", f"{path}: {_err(exc)}"
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    kept: list[str] = []
    size = 0
    for raw in b"".join(chunks).decode(errors="replace").splitlines():
        head, sep, _ = raw.partition(";")
        fields = head.split(",")
        if sep and len(fields) >= 3 and fields[2].isdigit():
            keep = int(fields[2]) >= since
        else:
            keep = bool(kept) and raw.startswith(" ")  # a continuation line of a kept record
        if keep:
            kept.append(raw)
            size += len(raw) + 1
    while size > MAX_KMSG_BYTES and kept:
        size -= len(kept.pop(0)) + 1
    return "\n".join(kept) + ("\n" if kept else ""), None


def nvml_state(backend: NvmlLike | None) -> tuple[dict[str, Any], str | None]:
    """Every GPU's NVML state, each failing call's error in place of its value; (state, why none)."""
    if backend is None:
        return {}, "no NVML backend (agent.nvml.enabled is off or NVML is absent)"
    try:
        backend.init()
    except Exception as exc:
        return {}, f"NVML init: {_err(exc)}"
    gpus: list[dict[str, Any]] = []
    try:
        count = backend.device_count()
        for index in range(min(count, 64)):
            gpu: dict[str, Any] = {"index": index}
            for name in (
                "identity",
                "ecc_counters",
                "remapped_rows",
                "temperature_c",
                "throttle_reasons",
                "power_w",
                "pcie_replay_count",
            ):
                try:
                    value = getattr(backend, name)(index)
                except Exception as exc:
                    gpu[name] = {"error": _err(exc)}
                    continue
                gpu[name] = _plain(value)
            gpus.append(gpu)
    except Exception as exc:
        return {"gpus": gpus}, f"NVML: {_err(exc)}"
    finally:
        with contextlib.suppress(Exception):
            backend.shutdown()
    return {"gpus": gpus, "count": count}, None


def _plain(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return {k: _plain(getattr(value, k)) for k in value.__dataclass_fields__}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return repr(value)[:200]


async def _bug_report(out: Path, timeout_s: float, tool: str | None, run: Runner) -> str | None:
    """Run ``nvidia-bug-report.sh --output-file out/nvidia-bug-report.log``; None or why it failed."""
    if tool is None:
        return "nvidia-bug-report.sh is not on PATH"
    code, _, err = await run([tool, "--output-file", str(out / "nvidia-bug-report.log")], timeout_s)
    if code is None:
        return f"nvidia-bug-report.sh ran past {timeout_s:g} s (killed; partial output kept)"
    if code != 0:
        return f"nvidia-bug-report.sh exited {code}: {err.decode(errors='replace').strip()[-200:]}"
    return None


def _read_glob(where: Path, pattern: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in where.glob(pattern)}


async def collect_bundle(
    node: str,
    state_dir: Path,
    *,
    run: Runner,
    kmsg_path: str = "/dev/kmsg",
    kmsg_window_s: float = 3600.0,
    nvml: NvmlLike | None = None,
    evidence: Mapping[str, Any] | None = None,
    bug_report_timeout_s: float = 600.0,
    bug_report_tool: str | None = None,
    find_tool: bool = True,
    now_us: int | None = None,
) -> Bundle:
    """Collect the bundle (module docstring) and return where it is. ``run``: the agent's bounded
    command runner (:func:`ftd.agent.diagnostics._run`: the child's process group killed at the
    deadline); ``bug_report_tool``: the script's path (default: ``nvidia-bug-report.sh`` on PATH when
    ``find_tool``)."""
    began = time.monotonic()
    out_dir = state_dir / "rma"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    name = f"{node}-{stamp}"
    missing: dict[str, str] = {}
    members: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".collect-") as tmp:
        work = Path(tmp)
        tool = bug_report_tool or (shutil.which("nvidia-bug-report.sh") if find_tool else None)
        why = await _bug_report(work, bug_report_timeout_s, tool, run)
        produced = await asyncio.to_thread(
            lambda: {p.name: p.read_bytes() for p in work.glob("nvidia-bug-report.log*")}
        )
        members.update(sorted(produced.items()))
        if why is not None:
            missing["nvidia-bug-report"] = why
        elif not members:
            missing["nvidia-bug-report"] = "nvidia-bug-report.sh wrote no file"
    text, why = await asyncio.to_thread(kmsg_window, kmsg_path, kmsg_window_s, now_us)
    if why is None:
        members["kmsg.txt"] = text.encode()
    else:
        missing["kmsg"] = why
    state, why = await asyncio.to_thread(nvml_state, nvml)
    if state:
        members["nvml.json"] = json.dumps(state, indent=2, sort_keys=True).encode()
    if why is not None:
        missing["nvml"] = why
    for rel in STATE_FILES:
        try:
            members[f"ftd/{rel}"] = (state_dir / rel).read_bytes()[:MAX_EVIDENCE_BYTES]
        except FileNotFoundError:
            missing[f"ftd/{rel}"] = "not on this node (nothing recorded)"
        except OSError as exc:
            missing[f"ftd/{rel}"] = _err(exc)
    if evidence:
        members["ftd/evidence.json"] = json.dumps(
            dict(evidence), indent=2, sort_keys=True, default=str
        ).encode()[:MAX_EVIDENCE_BYTES]
    files = {
        member: {"bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}
        for member, body in members.items()
    }
    manifest = {
        "node": node,
        "collected": stamp,
        "files": files,
        "missing": missing,
        "kmsg_window_s": kmsg_window_s,
    }
    path = out_dir / f"{name}.tar.gz"
    tmp_path = out_dir / f".{name}.tar.gz.tmp"

    def write() -> None:
        with tarfile.open(tmp_path, "w:gz") as tar:
            for member, body in [
                ("manifest.json", json.dumps(manifest, indent=2).encode()),
                *members.items(),
            ]:
                info = tarfile.TarInfo(f"{name}/{member}")
                info.size = len(body)
                info.mtime = int(time.time())
                info.mode = 0o600
                tar.addfile(info, io.BytesIO(body))
        os.chmod(tmp_path, 0o600)
        os.replace(tmp_path, path)

    await asyncio.to_thread(write)
    return Bundle(str(path), path.stat().st_size, files, missing, time.monotonic() - began)
