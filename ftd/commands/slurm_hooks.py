"""``ftd slurm prolog`` / ``ftd slurm epilog``: Slurm's Prolog and Epilog tell the node's agent about jobs.

What: slurmd runs the Prolog (as root) when a job starts on the node and the Epilog when it ends
there (``deploy/slurm/``). The Prolog sends ``job_start`` (job id, user, uid, GPUs from
``SLURM_JOB_GPUS`` or ``CUDA_VISIBLE_DEVICES``, tasks on this node, partition) over the agent's
local socket; the Epilog looks for the job's processes still alive (the "Kill task failed" case:
every process whose environment carries the job's ``SLURM_JOB_ID``, and among them those
``nvidia-smi`` lists as holding a GPU) and sends ``job_end`` with them. The agent publishes the job's
presence with its allocation, so the coordinator knows every job and where it runs even when no
trainer registers, and reports leftovers as a ``job_leftover`` event (see :mod:`ftd.agent.jobs`).

How they fail: both must be fast and must never hold up or fail a job because ftd is down. Each
waits at most ``--timeout`` seconds (default 2) for the agent, then prints a warning on stderr (it
ends up in slurmd's log) and exits 0. ``--gate`` makes an unreachable agent fail the Prolog (exit 1:
Slurm then drains the node and requeues the job) for sites that want no job to start unwatched.

Imports the standard library and :mod:`ftd.client.protocol` (with :mod:`ftd.client.ask`, which speaks
it) only: it starts in a few tens of ms.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ftd.client import protocol
from ftd.client.ask import ask

DEFAULT_TIMEOUT_S = 2.0
_TASKS_RE = re.compile(r"^([0-9]{1,9})")


def register(sub: Any) -> None:
    p = sub.add_parser("slurm", help="Slurm hooks: prolog and epilog (deploy/slurm)")
    hooks = p.add_subparsers(dest="hook", metavar="HOOK", required=True)
    for name, text in (
        ("prolog", "tell the local agent a job started here (Slurm Prolog)"),
        ("epilog", "tell the local agent a job ended here, with its leftover processes (Slurm Epilog)"),
    ):
        h = hooks.add_parser(name, help=text)
        h.add_argument(
            "--socket", default=None, help="agent socket (default: $FTD_SOCKET or /run/ftd/agent.sock)"
        )
        h.add_argument(
            "--config",
            default=None,
            metavar="PATH",
            help="the node's agent config (TOML): its agent.socket_path",
        )
        h.add_argument(
            "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds to wait for the agent"
        )
        if name == "prolog":
            h.add_argument(
                "--gate",
                action="store_true",
                help="exit 1 when the agent cannot be told (Slurm drains the node)",
            )
        else:
            h.add_argument(
                "--state-dir",
                default=os.environ.get("FTD_STATE_DIR", "/var/lib/ftd"),
                help="the agent's state_dir: where a job end is noted when the agent is unreachable",
            )
            h.add_argument(
                "--nvidia-smi",
                default=os.environ.get("FTD_NVIDIA_SMI", "nvidia-smi"),
                help="nvidia-smi to ask which processes hold a GPU (skipped when absent)",
            )
        h.set_defaults(handler=run)


def warn(message: str) -> None:
    print(f"ftd slurm hook: WARNING: {message}", file=sys.stderr)


# --- what Slurm tells the hooks -------------------------------------------------------------------


def gpus_from_env(env: Mapping[str, str]) -> list[str]:
    """The job's GPUs on this node: ``SLURM_JOB_GPUS`` (Prolog/Epilog), else ``CUDA_VISIBLE_DEVICES``."""
    for name in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS"):
        value = env.get(name, "").strip()
        if value and value.lower() not in ("nodevfiles", "none"):
            return [g.strip() for g in value.split(",") if g.strip()]
    return []


def tasks_from_env(env: Mapping[str, str]) -> int | None:
    """Tasks of the job on this node when Slurm says (``SLURM_NTASKS_PER_NODE``, the first count of
    ``SLURM_TASKS_PER_NODE`` such as ``2(x3)``); None when it does not (the Prolog often does not)."""
    for name in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        match = _TASKS_RE.match(env.get(name, ""))
        if match:
            return int(match.group(1))
    return None


def job_start_message(env: Mapping[str, str]) -> dict[str, Any] | None:
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job:
        return None
    uid_text = env.get("SLURM_JOB_UID", "")
    return protocol.job_start(
        job,
        user=env.get("SLURM_JOB_USER", ""),
        uid=int(uid_text) if uid_text.isdecimal() else None,
        gpus=gpus_from_env(env),
        tasks=tasks_from_env(env),
        partition=env.get("SLURM_JOB_PARTITION", ""),
    )


# --- leftover processes (Epilog) ------------------------------------------------------------------


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _ppid(proc: Path, pid: int) -> int | None:
    stat = _read(proc / str(pid) / "stat")
    if stat is None:
        return None
    text = stat.decode(errors="replace")
    rest = text[text.rfind(")") + 1 :].split()
    try:
        return int(rest[1])
    except (IndexError, ValueError):
        return None


def _job_env(environ: bytes) -> tuple[str | None, str | None]:
    """(``SLURM_JOB_ID``, ``SLURM_CLUSTER_NAME``) of a process's environment, None where absent."""
    job = cluster = None
    for item in environ.split(b"\0"):
        if item.startswith(b"SLURM_JOB_ID="):
            job = item.split(b"=", 1)[1].decode(errors="replace")
        elif item.startswith(b"SLURM_CLUSTER_NAME="):
            cluster = item.split(b"=", 1)[1].decode(errors="replace")
    return job, cluster


def _is_job(environ: bytes, job: str, cluster: str | None) -> bool:
    """The environment is of ``job`` of ``cluster``: its job id, and its cluster where both say one
    (job ids are per cluster: two clusters' job 2 on one host are two jobs)."""
    theirs, their_cluster = _job_env(environ)
    return theirs == job and (cluster is None or their_cluster is None or their_cluster == cluster)


def job_processes(
    job: str, *, proc_root: str = "/proc", me: int | None = None, cluster: str | None = None
) -> list[dict[str, Any]]:
    """Processes still carrying ``SLURM_JOB_ID=job`` (and ``SLURM_CLUSTER_NAME=cluster``, where both
    say one) in their environment, except this hook itself (its ancestors and descendants: slurmd
    gives the Epilog the job's environment) and slurmstepd."""
    proc = Path(proc_root)
    me = os.getpid() if me is None else me
    parents: dict[int, int | None] = {}
    candidates: list[int] = []
    try:
        names = os.listdir(proc)
    except OSError:
        return []
    for name in names:
        if not name.isdecimal():
            continue
        pid = int(name)
        parents[pid] = _ppid(proc, pid)
        environ = _read(proc / name / "environ")
        if environ and _is_job(environ, job, cluster):
            candidates.append(pid)
    mine = {me}
    walker: int | None = me
    while walker is not None and walker > 1 and len(mine) < 256:  # my ancestors (slurmd's chain)
        walker = parents.get(walker) if walker in parents else _ppid(proc, walker)
        if walker is not None:
            mine.add(walker)

    def descends_from_me(pid: int) -> bool:
        seen = 0
        current: int | None = pid
        while current is not None and current > 1 and seen < 256:
            if current == me:
                return True
            current = parents.get(current)
            seen += 1
        return False

    found = []
    for pid in sorted(candidates):
        if pid in mine or descends_from_me(pid):
            continue
        comm = (_read(proc / str(pid) / "comm") or b"").decode(errors="replace").strip()
        cmdline = _read(proc / str(pid) / "cmdline") or b""
        if cmdline.startswith(b"slurmstepd"):
            continue
        try:
            uid = (proc / str(pid)).stat().st_uid
        except OSError:
            continue  # gone meanwhile
        found.append({"pid": pid, "name": comm[:256], "uid": uid})
    return found


def _smi_rows(nvidia_smi: str, query: str, timeout: float) -> list[list[str]]:
    """The CSV rows ``nvidia-smi --query-...`` prints ([] without it or on failure)."""
    binary = shutil.which(nvidia_smi)
    if binary is None:
        return []
    try:
        out = subprocess.run(
            [binary, query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        warn(f"{nvidia_smi} failed: {exc}")
        return []
    return [[p.strip() for p in line.split(",")] for line in out.stdout.splitlines() if line.strip()]


def gpu_pids(nvidia_smi: str, timeout: float) -> dict[int, str]:
    """pid -> GPU UUID of every compute process ``nvidia-smi`` lists ({} without it or on failure)."""
    rows = _smi_rows(nvidia_smi, "--query-compute-apps=pid,gpu_uuid", timeout)
    return {int(r[0]): r[1] for r in rows if len(r) >= 2 and r[0].isdecimal()}


def gpu_uuids(nvidia_smi: str, indexes: Iterable[str], timeout: float) -> set[str]:
    """The UUIDs of the GPUs with these indexes (the job's ``SLURM_JOB_GPUS``)."""
    wanted = set(indexes)
    rows = _smi_rows(nvidia_smi, "--query-gpu=index,uuid", timeout)
    return {r[1] for r in rows if len(r) >= 2 and r[0] in wanted}


def _other_job(job: str, pid: int, proc_root: str, cluster: str | None = None) -> bool:
    """True when process ``pid`` carries another job's ``SLURM_JOB_ID`` (or the same id of another
    cluster): it is that job's."""
    environ = _read(Path(proc_root) / str(pid) / "environ") or b""
    theirs, _ = _job_env(environ)
    return theirs is not None and not _is_job(environ, job, cluster)


def leftovers(
    job: str,
    nvidia_smi: str,
    timeout: float,
    proc_root: str = "/proc",
    gpus: Iterable[str] = (),
    cluster: str | None = None,
) -> list[dict[str, Any]]:
    """The job's processes still alive (marked with the GPU they hold), plus any compute process
    still on the job's own GPUs that belongs to no other job (one that escaped with its environment
    cleared). ``nvidia-smi`` is asked only when there is something to ask about."""
    procs = job_processes(job, proc_root=proc_root, cluster=cluster)
    gpus = list(gpus)
    if not procs and not gpus:
        return []
    held = gpu_pids(nvidia_smi, timeout)
    for p in procs:
        p["gpu"] = held.get(p["pid"])
    if gpus and held:
        mine = gpu_uuids(nvidia_smi, gpus, timeout)
        known = {p["pid"] for p in procs}
        for pid, uuid in sorted(held.items()):
            if uuid not in mine or pid in known or _other_job(job, pid, proc_root, cluster):
                continue
            try:
                uid = (Path(proc_root) / str(pid)).stat().st_uid
            except OSError:
                continue  # gone meanwhile (or not in this pid namespace)
            comm = (_read(Path(proc_root) / str(pid) / "comm") or b"").decode(errors="replace").strip()
            procs.append({"pid": pid, "name": comm[:256], "uid": uid, "gpu": uuid})
    return procs


# --- talking to the agent -------------------------------------------------------------------------


def socket_path_of(args: argparse.Namespace) -> str:
    """``--socket``, else ``agent.socket_path`` from ``--config``, else $FTD_SOCKET, else the default."""
    configured = None
    if getattr(args, "config", None):
        from ftd.config import load_config

        try:
            configured = load_config(args.config).agent.socket_path
        except ValueError as exc:  # ConfigError: said, and the hook goes on with the default socket
            warn(f"--config {args.config}: {exc}")
    return str(args.socket or configured or os.environ.get(protocol.SOCKET_ENV) or protocol.DEFAULT_SOCKET)


def tell(socket_path: str, message: Mapping[str, Any], timeout: float) -> str | None:
    """Send ``message``; None when the agent said ok, else why not."""
    try:
        reply = ask(socket_path, message, timeout)
    except (OSError, TimeoutError, ValueError) as exc:
        return f"agent not reachable at {socket_path}: {exc}"
    if reply.get("op") != protocol.OK:
        return f"agent refused {message.get('op')}: {reply.get('error', reply)}"
    return None


def run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    path = socket_path_of(args)
    if args.hook == "prolog":
        message = job_start_message(env)
        if message is None:
            warn("no SLURM_JOB_ID in the environment: not run by slurmd? nothing reported")
            return 0
        problem = tell(path, message, args.timeout)
        if problem is not None:
            warn(f"job {message['job']}: {problem}" + (" (gate: failing the prolog)" if args.gate else ""))
            return 1 if args.gate else 0
        return 0
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job:
        warn("no SLURM_JOB_ID in the environment: not run by slurmd? nothing reported")
        return 0
    left = leftovers(
        job,
        args.nvidia_smi,
        min(args.timeout, 2.0),
        gpus=gpus_from_env(env),
        cluster=env.get("SLURM_CLUSTER_NAME") or None,
    )
    if left:
        warn(f"job {job} left {len(left)} process(es) running: " + ", ".join(_describe(left)))
    problem = tell(path, protocol.job_end(job, left), args.timeout)
    if problem is not None:
        warn(f"job {job}: {problem}")
        note_ended(args.state_dir, job)
    return 0


def note_ended(state_dir: str, job: str) -> None:
    """Leave ``{state_dir}/ended-jobs/{job}`` for the agent to find when it is back (ftd.agent.jobs):
    a missed Epilog must not leave the job "running" on the node in ftd's view."""
    if not re.fullmatch(protocol.JOB_PATTERN, job) or len(job) > protocol.JOB_MAX:
        return
    spool = Path(state_dir) / "ended-jobs"
    try:
        spool.mkdir(mode=0o700, exist_ok=True)
        (spool / job).touch()
    except OSError as exc:
        warn(f"cannot note the end of job {job} in {spool}: {exc}")


def _describe(procs: Iterable[Mapping[str, Any]]) -> list[str]:
    return [f"{p['pid']} ({p['name']}{', GPU ' + str(p['gpu']) if p.get('gpu') else ''})" for p in procs]


def main(argv: list[str] | None = None) -> int:
    """``python -m ftd.commands.slurm_hooks prolog|epilog`` (without the rest of the CLI)."""
    parser = argparse.ArgumentParser(prog="ftd")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["slurm", *(sys.argv[1:] if argv is None else argv)])
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
