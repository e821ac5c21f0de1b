"""collect_hang_evidence (agent side): everything this node can say about a hung job, for the verdict.

Called by the agent for a ``collect_hang_evidence`` node directive (the coordinator side is
:mod:`ftd.coordinator.actions.diagnose_hang`)::

    evidence = await collect_hang_evidence(directive, ranks, Path(state_dir) / "diagnostics", node=name)
    ack = evidence_ack(directive, node, evidence)     # publish on topics.node_acks(node)

For *every* rank of the job on this node, all at once, the whole bounded by the directive's deadline
(80 % of it, so the answer is back before the coordinator stops waiting; a part still running then is
cancelled and named in ``errors``):

* the process state from ``/proc/PID/stat`` (running, sleeping, disk, stopped, zombie, gone);
* the last step and heartbeat age the local API knows (``RankInfo.step`` / ``last_beat``);
* the Python stacks: ``py-spy dump --native``, else plain, else ``--nonblocking`` (py-spy cannot
  suspend a SIGSTOPped process, but it can read it without suspending), parsed with
  :func:`ftd.culprit.stacks.parse_py_spy`; the raw output is kept beside the answer;
* PyTorch's flight recorder: first as the rank's own JSON dump, asked for over the trainer protocol
  (``ask_flight``: :meth:`ftd.agent.local_api.LocalApi.ask_flight`, any backend, works while the rank
  is blocked in a collective); else when the rank's environment (``/proc/PID/environ``) configures it:
  ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` -> one byte written to ``{pipe}{rank}.pipe`` (ProcessGroupNCCL's
  watchdog then dumps; gloo has no such pipe, its dump is taken by the training code itself), and the
  dump read from ``TORCH_FR_DUMP_TEMP_FILE`` / ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` + rank (default
  ``/tmp/nccl_trace_rank_``) when one is there: JSON only, a pickle is refused by
  :func:`ftd.culprit.flight.parse_flight_json`, never unpickled;
* the rank's ``NCCL_DEBUG_FILE`` (``%h``/``%p`` expanded) copied, its last bytes kept.

Once per node, NCCL RAS on ``localhost:28028`` (its line protocol: ``CLIENT PROTOCOL 2`` ->
``SERVER PROTOCOL n``, ``TIMEOUT t`` -> ``OK``, ``STATUS`` -> text until the server closes), bounded;
not answering is recorded in :class:`~ftd.culprit.evidence.RasStatus`, not an error.

Raw files land in ``{out_dir}/{action id}/`` (as :mod:`ftd.agent.diagnostics` does). The answer is one
:class:`~ftd.culprit.evidence.NodeEvidence`; :func:`evidence_ack` fits it into the bus's payload limit
(:data:`ftd.events.MAX_PAYLOAD_BYTES`): threads other than the main one go first, then frames, and
the cut is said in ``errors["size"]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import msgspec

from ftd.agent.diagnostics import _run, _tool
from ftd.culprit.evidence import (
    MAX_TEXT,
    FlightRecord,
    NodeEvidence,
    ProcessState,
    RankEvidence,
    RasStatus,
    ThreadStack,
)
from ftd.culprit.flight import parse_flight_json
from ftd.culprit.ras import missing_processes
from ftd.culprit.stacks import parse_py_spy
from ftd.events import MAX_PAYLOAD_BYTES, NODE_RANK, Ack, Directive, RankInfo

DEFAULT_DEADLINE_S = 15.0
RAS_PORT = 28028
RAS_PROTOCOL = 2
MAX_ENVIRON = 1 << 20  # bytes of /proc/PID/environ read
MAX_FLIGHT_BYTES = 8 << 20  # a flight-recorder dump larger than this is not read
MAX_DEBUG_FILE = 1 << 20  # the last bytes of an NCCL_DEBUG_FILE kept
MAX_RAS_BYTES = 64 << 10
ACK_BUDGET = MAX_PAYLOAD_BYTES - (16 << 10)  # room for the Ack's own fields
_STATES: dict[str, ProcessState] = {
    "R": "running",
    "S": "sleeping",
    "I": "sleeping",
    "D": "disk",
    "T": "stopped",
    "t": "stopped",
    "Z": "zombie",
    "X": "gone",
}
_FR_DUMP_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
_FR_DEFAULT_DUMP = "/tmp/nccl_trace_rank_"


def process_state(pid: int, proc: Path = Path("/proc")) -> ProcessState:
    """The state letter of ``/proc/PID/stat`` as a word; ``gone`` when there is no such process."""
    try:
        text = (proc / str(pid) / "stat").read_text(errors="replace")
    except FileNotFoundError:
        return "gone"
    except OSError:
        return "unknown"
    # "pid (comm) S ...": comm may hold spaces and parentheses; the state follows the last ")".
    _, _, rest = text.rpartition(")")
    fields = rest.split()
    return _STATES.get(fields[0], "unknown") if fields else "unknown"


def read_environ(pid: int, proc: Path = Path("/proc")) -> dict[str, str]:
    """The process's initial environment (``/proc/PID/environ``), bounded; {} when unreadable."""
    try:
        with open(proc / str(pid) / "environ", "rb") as fh:
            raw = fh.read(MAX_ENVIRON)
    except OSError:
        return {}
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def _last_line(data: bytes) -> str:
    lines = [line for line in data.decode(errors="replace").splitlines() if line.strip()]
    error = next((line for line in reversed(lines) if "Error" in line or "error" in line), None)
    return _cut((error or (lines[-1] if lines else "no output")).strip())


async def dump_stacks(
    spy: str, pid: int, target: Path, stem: str, timeout_s: float
) -> tuple[list[ThreadStack], list[str], str | None]:
    """py-spy's stacks of ``pid``: ``--native``, then plain, then ``--nonblocking`` (a stopped process
    cannot be suspended). Returns (threads, files kept, error or None)."""
    attempts = (("--native",), (), ("--nonblocking",))
    errors: list[str] = []
    files: list[str] = []
    for extra in attempts:
        try:
            rc, out, err = await _run([spy, "dump", *extra, "--pid", str(pid)], timeout_s)
        except OSError as exc:
            return [], files, f"cannot run py-spy: {exc}"
        how = extra[0].lstrip("-") if extra else "plain"
        if rc == 0:
            name = f"{stem}.{how}.txt"
            (target / name).write_bytes(out)
            files.append(name)
            threads, problems = parse_py_spy(out.decode(errors="replace"))
            if threads:
                note = "; ".join(errors + problems)[:MAX_TEXT] or None
                return threads, files, note
            errors.append(f"{how}: no thread parsed ({'; '.join(problems)[:200]})")
            continue
        name = f"{stem}.{how}.err"
        (target / name).write_bytes(err or out)
        files.append(name)
        errors.append(f"{how}: {_last_line(err or out)}")
        if rc is None:  # timed out: a second try would time out as well
            break
    return [], files, "; ".join(errors)[:MAX_TEXT] or "py-spy gave nothing"


def _trigger_pipe(path: str) -> str:
    """Write one byte to a flight-recorder pipe (non-blocking); '' when written, else why not."""
    try:
        if not stat.S_ISFIFO(os.stat(path).st_mode):
            return f"{path} is not a FIFO"
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return f"no pipe {path}"
    except OSError as exc:  # ENXIO: nobody reads it (no NCCL watchdog in the process)
        return f"cannot open {path}: {exc.strerror or exc}"
    try:
        os.write(fd, b"1")
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror or exc}"
    finally:
        os.close(fd)
    return ""


def _newest(base: str, rank: int) -> Path | None:
    exact = Path(f"{base}{rank}")
    found = [exact] if exact.is_file() else []
    parent = exact.parent
    with contextlib.suppress(OSError):  # TORCH_FR_DUMP_DYNAMIC_FILE_NAME adds a suffix
        found += [p for p in parent.glob(f"{exact.name}*") if p.is_file() and p != exact]
    if not found:
        return None
    return max(found, key=lambda p: p.stat().st_mtime)


async def flight_record(
    env: Mapping[str, str], rank: int, target: Path, stem: str, wait_s: float
) -> tuple[FlightRecord | None, str | None, list[str]]:
    """(FlightRecord | None, error or None, files kept) for one rank, per its environment."""
    configured = any(k in env for k in ("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", *_FR_DUMP_VARS)) or any(
        k.startswith("TORCH_FR_") for k in env
    )
    if not configured:
        return None, None, []
    base = next((env[k] for k in _FR_DUMP_VARS if env.get(k)), _FR_DEFAULT_DUMP)
    before = _newest(base, rank)
    before_mtime = before.stat().st_mtime if before is not None else 0.0
    notes: list[str] = []
    pipe_base = env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
    if pipe_base:
        why = await asyncio.to_thread(_trigger_pipe, f"{pipe_base}{rank}.pipe")
        if why:
            notes.append(why)
        else:  # the watchdog polls its pipe; wait for a newer dump, bounded
            end = time.monotonic() + wait_s
            while time.monotonic() < end:
                now = _newest(base, rank)
                if now is not None and now.stat().st_mtime > before_mtime:
                    break
                await asyncio.sleep(0.2)
    path = _newest(base, rank)
    if path is None:
        notes.append(f"no dump at {base}{rank}")
        return None, "; ".join(notes)[:MAX_TEXT], []
    try:
        size = path.stat().st_size
        if size > MAX_FLIGHT_BYTES:
            return None, f"{path}: {size} bytes, over the limit of {MAX_FLIGHT_BYTES}", []
        data = await asyncio.to_thread(path.read_bytes)
    except OSError as exc:
        return None, f"cannot read {path}: {exc}", []
    name = f"{stem}.flight"
    (target / name).write_bytes(data)
    record, error = parse_flight_json(data)
    if error:
        notes.append(f"{path}: {error}")
    return record, ("; ".join(notes)[:MAX_TEXT] or None), [name]


def _debug_file(env: Mapping[str, str], pid: int, node: str, target: Path, stem: str) -> tuple[str, str]:
    """Copy the tail of the rank's NCCL_DEBUG_FILE; (file kept or '', error or ''). NCCL expands
    ``%h`` to the host's own name up to its first dot (not ftd's node name: on the H200 device check
    the two differed and the file was not found) and ``%p`` to the process id."""
    pattern = env.get("NCCL_DEBUG_FILE")
    if not pattern:
        return "", ""
    host = socket.gethostname().split(".")[0]
    path = Path(pattern.replace("%h", host).replace("%p", str(pid)))
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - MAX_DEBUG_FILE))
            data = fh.read(MAX_DEBUG_FILE)
    except OSError as exc:
        return "", f"cannot read {path}: {exc.strerror or exc}"
    name = f"{stem}.nccl-debug.txt"
    (target / name).write_bytes(data)
    return name, ""


def _ras_exchange(host: str, port: int, timeout_s: float, save_to: Path | None = None) -> RasStatus:
    try:
        with socket.create_connection((host, port), timeout=min(timeout_s, 2.0)) as sock:
            sock.settimeout(timeout_s)
            reader = sock.makefile("rb")
            sock.sendall(f"CLIENT PROTOCOL {RAS_PROTOCOL}\n".encode())
            hello = reader.readline(1024).decode(errors="replace").strip()
            if not hello.upper().startswith("SERVER PROTOCOL"):
                return RasStatus(answered=False, error=_cut(f"unexpected greeting: {hello!r}"))
            sock.sendall(f"TIMEOUT {max(1, int(timeout_s) - 1)}\n".encode())
            ok = reader.readline(1024).decode(errors="replace").strip()
            if ok.upper() != "OK":
                return RasStatus(answered=False, error=_cut(f"TIMEOUT refused: {ok!r}"))
            sock.sendall(b"STATUS\n")
            text = reader.read(MAX_RAS_BYTES).decode(errors="replace")
    except OSError as exc:
        return RasStatus(answered=False, error=_cut(f"{host}:{port}: {exc.strerror or exc}"))
    if save_to is not None:  # the whole answer beside the other raw files (the evidence keeps its start)
        with contextlib.suppress(OSError):
            (save_to / "ras-status.txt").write_text(text, errors="replace")
    return RasStatus(answered=True, text=text[:MAX_TEXT], missing=missing_processes(text))


async def ras_status(host: str, port: int, timeout_s: float, save_to: Path | None = None) -> RasStatus:
    """NCCL RAS's status, bounded by ``timeout_s``; a node without it says so (``answered`` False).
    ``save_to``: a directory for the whole answer (``ras-status.txt``)."""
    return await asyncio.to_thread(_ras_exchange, host, port, timeout_s, save_to)


AskFlight = Callable[[str, int, float], Awaitable[tuple[bytes | None, str]]]
"""(job, rank, timeout) -> the rank's own JSON flight-recorder dump, or why not
(:meth:`ftd.agent.local_api.LocalApi.ask_flight`)."""


async def _rank(
    info: RankInfo,
    node: str,
    target: Path,
    spy: str | None,
    budget_s: float,
    now: float,
    job: str = "",
    ask_flight: AskFlight | None = None,
) -> RankEvidence:
    base = RankEvidence(
        rank=info.rank,
        node=node,
        pid=info.pid,
        last_step=info.step,
        beat_age_s=round(now - info.last_beat, 3) if info.last_beat is not None else None,
    )
    if info.pid is None:
        return msgspec.structs.replace(base, answered=False, errors={"pid": "no pid registered"})
    pid = info.pid
    errors: dict[str, str] = {}
    files: list[str] = []
    state = await asyncio.to_thread(process_state, pid)
    if state == "gone":
        return msgspec.structs.replace(base, state=state, errors={"stacks": f"no process {pid}"})
    env = await asyncio.to_thread(read_environ, pid)
    stem = f"rank-{info.rank}-pid-{pid}"
    stacks: list[ThreadStack] = []

    async def spy_part() -> None:
        nonlocal stacks
        if spy is None:
            errors["stacks"] = "py-spy not found"
            return
        stacks, kept, error = await dump_stacks(spy, pid, target, stem, budget_s)
        files.extend(kept)
        if error:
            errors["stacks"] = error

    flight_result: list[FlightRecord | None] = [None]

    async def flight_part() -> None:
        asked = ""
        # The rank's own JSON dump (any backend, never a pickle); a stopped or zombie process cannot
        # answer, and waiting for it would only hold up the evidence.
        if ask_flight is not None and job and state not in ("stopped", "zombie"):
            data, asked = await ask_flight(job, info.rank, budget_s * 0.5)
            if data is not None:
                name = f"{stem}.flight"
                await asyncio.to_thread((target / name).write_bytes, data)
                files.append(name)
                parsed, bad = parse_flight_json(data)
                flight_result[0] = parsed
                if bad:
                    errors["flight_recorder"] = f"the rank's dump: {bad}"[:MAX_TEXT]
                return
        env_rank = env.get("RANK")
        rank = int(env_rank) if env_rank and env_rank.isdigit() else info.rank
        record, error, kept = await flight_record(env, rank, target, stem, budget_s * 0.5)
        flight_result[0] = record
        files.extend(kept)
        why = "; ".join(x for x in (asked, error) if x)
        if why:
            errors["flight_recorder"] = why[:MAX_TEXT]

    async def debug_part() -> None:
        kept, error = await asyncio.to_thread(_debug_file, env, pid, node, target, stem)
        if kept:
            files.append(kept)
        if error:
            errors["nccl_debug_file"] = error

    await asyncio.gather(spy_part(), flight_part(), debug_part())
    state_after = await asyncio.to_thread(process_state, pid)
    if state_after != state and state_after in ("gone", "zombie", "stopped"):
        state = state_after
    return msgspec.structs.replace(
        base, state=state, stacks=stacks, flight=flight_result[0], errors=errors, files=sorted(files)
    )


async def collect_hang_evidence(
    directive: Directive,
    ranks: Sequence[RankInfo],
    out_dir: str | Path,
    *,
    node: str,
    py_spy: str | None = None,
    ras_host: str = "127.0.0.1",
    ras_port: int = RAS_PORT,
    clock: Callable[[], float] = time.time,
    ask_flight: AskFlight | None = None,
) -> NodeEvidence:
    """Collect the evidence of every rank in ``ranks`` at once, bounded by the directive's deadline.

    Never raises for a failing tool or a rank that cannot be looked at: that is in ``errors``."""
    started = time.monotonic()
    job = str(directive.job or directive.params.get("job") or "")
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in (directive.action_id or directive.id))
    target = Path(out_dir) / (name.strip("._") or "hang")
    target.mkdir(parents=True, exist_ok=True)
    deadline = directive.deadline_s or DEFAULT_DEADLINE_S
    budget = max(1.0, deadline * 0.8)
    wanted = directive.params.get("ranks")
    selected = [r for r in ranks if not isinstance(wanted, list) or not wanted or r.rank in wanted]
    spy = _tool("py-spy", py_spy)
    now = clock()
    per_rank = budget * 0.9
    tasks = [
        asyncio.ensure_future(_rank(r, node, target, spy, per_rank, now, job, ask_flight)) for r in selected
    ]
    ras_task = asyncio.ensure_future(ras_status(ras_host, ras_port, min(5.0, budget * 0.5), target))
    done, pending = await asyncio.wait([*tasks, ras_task], timeout=budget)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    errors: dict[str, str] = {}
    out: list[RankEvidence] = []
    for info, task in zip(selected, tasks, strict=True):
        if task in done and task.exception() is None:
            out.append(task.result())
            continue
        why = f"not collected within {budget:g}s" if task not in done else f"failed: {task.exception()!r}"
        errors[f"rank {info.rank}"] = _cut(why)
        out.append(RankEvidence(rank=info.rank, node=node, pid=info.pid, errors={"collect": _cut(why)}))
    ras: RasStatus
    if ras_task in done and ras_task.exception() is None:
        ras = ras_task.result()
    else:
        ras = RasStatus(answered=False, error="no answer in time")
    if isinstance(wanted, list):
        known = {r.rank for r in ranks}
        for rank in sorted(r for r in wanted if isinstance(r, int) and r not in known):
            out.append(RankEvidence(rank=rank, node=node, answered=False, errors={"agent": "not registered"}))
    return NodeEvidence(
        node=node,
        job=job,
        ranks=sorted(out, key=lambda r: r.rank),
        ras=ras,
        collected_s=round(time.monotonic() - started, 3),
        path=str(target),
        errors=errors,
    )


def _fit(evidence: NodeEvidence, budget: int) -> NodeEvidence:
    """Cut ``evidence`` until its JSON fits ``budget`` bytes: other threads first, then frames."""

    def size(ev: NodeEvidence) -> int:
        return len(msgspec.json.encode(ev))

    if size(evidence) <= budget:
        return evidence
    cuts: list[str] = []
    ranks = [
        msgspec.structs.replace(r, stacks=[t for t in r.stacks if t.main][:1] or r.stacks[:1])
        for r in evidence.ranks
    ]
    cuts.append("threads other than the main one dropped")
    evidence = msgspec.structs.replace(evidence, ranks=ranks)
    frames = 128
    while size(evidence) > budget and frames >= 4:
        ranks = [
            msgspec.structs.replace(
                r, stacks=[msgspec.structs.replace(t, frames=t.frames[:frames]) for t in r.stacks]
            )
            for r in evidence.ranks
        ]
        evidence = msgspec.structs.replace(evidence, ranks=ranks)
        cuts.append(f"frames cut to the innermost {frames}")
        frames //= 2
    if size(evidence) > budget:
        ranks = [msgspec.structs.replace(r, stacks=[], flight=None) for r in evidence.ranks]
        evidence = msgspec.structs.replace(evidence, ranks=ranks)
        cuts.append("stacks and flight records dropped")
    errors = {
        **evidence.errors,
        "size": _cut(f"over {budget} bytes: {cuts[-1]} (full files in {evidence.path})"),
    }
    return msgspec.structs.replace(evidence, errors=errors)


def evidence_ack(directive: Directive, node: str, evidence: NodeEvidence, *, budget: int = ACK_BUDGET) -> Ack:
    """The node-level Ack carrying ``evidence`` (cut to fit the bus's payload limit)."""
    fitted = _fit(evidence, budget)
    looked = sum(1 for r in fitted.ranks if r.answered)
    stacks = sum(1 for r in fitted.ranks if r.stacks)
    return Ack(
        directive_id=directive.id,
        job=directive.job or "",
        rank=NODE_RANK,
        node=node,
        ok=looked == len(fitted.ranks),
        path=fitted.path,
        reason=f"hang evidence: {len(fitted.ranks)} ranks, {stacks} with stacks, ras "
        + ("answered" if fitted.ras is not None and fitted.ras.answered else "absent"),
        ts=time.time(),
        data={"evidence": msgspec.to_builtins(fitted)},
    )
