"""Who is on the other end of the trainer socket, and which job its process belongs to.

Why: the agent relays a rank's acknowledgements to the coordinator as the truth about that job
("rank 0 saved step 1200 at /ckpt/1200"; then the job is stopped and requeued). Any process that
can open the socket could otherwise register as any job and rank and ack for it. So the kernel's
word about the peer (``SO_PEERCRED``: pid, uid, gid at ``connect()``) is read on every connection,
and a registration is accepted only for the job that process belongs to. Where that comes from,
in order (the first that answers wins; :func:`identify`):

1. **Slurm job cgroup** (``proctrack/cgroup``, ``task/cgroup``): a path component ``job_<id>`` in
   ``/proc/<pid>/cgroup``. The process cannot leave it.
2. **slurmstepd ancestry** (``proctrack/linuxproc``, no job cgroup): an ancestor process owned by
   root whose command line is ``slurmstepd: [<id>.<step>]``. An ordinary user cannot make a process
   of theirs the child of another job's root-owned step daemon.
3. **Kubernetes pod** (a ``kubepods`` cgroup with ``pod<uid>``): the job is ``FTD_JOB`` from the
   process environment, which the pod spec sets (from the pod's ``ftd.dev/job`` label through the
   downward API). This authenticates the pod spec, not more: only pods that mount the socket's
   directory (a hostPath volume) can connect at all, so the trust is the pod spec author's.
   The pod UID is kept for the logs.
4. **Trusted uid**: root or the agent's own uid (outside any job) may register any job: such a
   process could already read the agent's credentials or ptrace it, so checking it proves nothing.
5. **Process environment** (fallback, the reason is logged): ``FTD_JOB`` / ``SLURM_JOB_ID`` from
   ``/proc/<pid>/environ`` (reading it needs ``CAP_SYS_PTRACE`` for another user's process: the
   agent's unit keeps it). A claim for a Slurm job whose ``slurmstepd`` runs on this node is refused
   here: a process of that job would have been found through (1) or (2).

Nothing here raises for a vanished process or an unreadable file: the answer is an identity with
no jobs and the reason, which the local API refuses with that reason.
"""

from __future__ import annotations

import os
import re
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path

_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
MAX_ANCESTRY = 64
JOB_ENV = ("FTD_JOB", "SLURM_JOB_ID")

_SLURM_CGROUP_RE = re.compile(r"/job_(\d+)(?=/|$)")
_POD_RE = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_STEPD_RE = re.compile(rb"^slurmstepd: \[(\d+)\.[^\]\x00]+\]")


@dataclass(frozen=True)
class PeerCred:
    pid: int
    uid: int
    gid: int


@dataclass(frozen=True)
class JobIdentity:
    """Which jobs a peer process may register for, and how that was found out.

    ``source`` is one of ``cgroup``, ``slurmstepd``, ``pod``, ``trusted_uid``, ``environ``,
    ``unknown``; ``any_job`` is True only for ``trusted_uid``.
    """

    source: str
    jobs: frozenset[str] = field(default_factory=frozenset)
    detail: str = ""
    any_job: bool = False
    pod_uid: str | None = None

    def allows(self, job: str) -> bool:
        return self.any_job or job in self.jobs


def peer_cred(sock: socket.socket) -> PeerCred | None:
    """The peer's (pid, uid, gid) of a connected unix socket; None where the OS has no SO_PEERCRED."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, option, _CRED.size)
    except OSError:
        return None
    pid, uid, gid = _CRED.unpack(raw)
    return PeerCred(pid=pid, uid=uid, gid=gid)


# --- parsers (pure) --------------------------------------------------------------------------------


def _cgroup_paths(text: str) -> list[str]:
    """The paths of ``/proc/<pid>/cgroup`` lines (``hierarchy:controllers:path``)."""
    paths = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            paths.append(parts[2])
    return paths


def slurm_job_from_cgroup(text: str) -> str | None:
    """The Slurm job id of a ``job_<id>`` component in any cgroup path of the process, else None."""
    for path in _cgroup_paths(text):
        match = _SLURM_CGROUP_RE.search(path)
        if match:
            return match.group(1)
    return None


def pod_uid_from_cgroup(text: str) -> str | None:
    """The Kubernetes pod UID of a ``kubepods`` cgroup path (cgroupfs or systemd driver), else None."""
    for path in _cgroup_paths(text):
        if "kubepods" not in path:
            continue
        match = _POD_RE.search(path)
        if match:
            return match.group(1).replace("_", "-")
    return None


def slurmstepd_job(cmdline: bytes) -> str | None:
    """The job id of a ``slurmstepd: [<id>.<step>]`` command line, else None."""
    match = _STEPD_RE.match(cmdline)
    return match.group(1).decode() if match else None


def parse_environ(data: bytes) -> dict[str, str]:
    """``/proc/<pid>/environ`` (NUL-separated ``NAME=value``) as a dict; undecodable bytes replaced."""
    env: dict[str, str] = {}
    for item in data.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env


def parent_pid(stat: str) -> int | None:
    """The ppid field of ``/proc/<pid>/stat`` (the command name may hold spaces and parentheses)."""
    rest = stat[stat.rfind(")") + 1 :].split()
    try:
        return int(rest[1])
    except (IndexError, ValueError):
        return None


# --- reading /proc ---------------------------------------------------------------------------------


class ProcFs:
    """Reads of ``/proc`` (``root`` is a directory laid out the same way in tests)."""

    def __init__(self, root: str | Path = "/proc") -> None:
        self.root = Path(root)

    def read(self, pid: int, name: str) -> bytes | None:
        try:
            return (self.root / str(pid) / name).read_bytes()
        except OSError:
            return None

    def owner(self, pid: int) -> int | None:
        try:
            return (self.root / str(pid)).stat().st_uid
        except OSError:
            return None

    def ns_pids(self, pid: int) -> list[int]:
        """``pid`` as seen from each pid namespace it is in (``NSpid:`` of its status; a container's
        process has its own pid inside): [pid] outside containers, [] if it is gone."""
        raw = self.read(pid, "status")
        for line in (raw or b"").decode(errors="replace").splitlines():
            if line.startswith("NSpid:"):
                try:
                    return [int(x) for x in line.split()[1:]]
                except ValueError:
                    return []
        return []

    def pids(self) -> list[int]:
        try:
            return [int(name) for name in os.listdir(self.root) if name.isdecimal()]
        except OSError:
            return []

    def slurmstepd_of(self, pid: int) -> str | None:
        """The job of a root-owned ``slurmstepd`` process ``pid``, else None."""
        if self.owner(pid) != 0:
            return None
        cmdline = self.read(pid, "cmdline")
        return slurmstepd_job(cmdline) if cmdline else None

    def ancestors(self, pid: int) -> list[int]:
        """``pid``'s parent, grandparent, ... (stops at pid 1, a loop or MAX_ANCESTRY)."""
        out: list[int] = []
        current = pid
        while len(out) < MAX_ANCESTRY:
            raw = self.read(current, "stat")
            ppid = parent_pid(raw.decode(errors="replace")) if raw else None
            if ppid is None or ppid <= 1 or ppid in out or ppid == pid:
                break
            out.append(ppid)
            current = ppid
        return out

    def local_slurm_jobs(self) -> set[str]:
        """Jobs with a root-owned slurmstepd on this node."""
        jobs = set()
        for pid in self.pids():
            job = self.slurmstepd_of(pid)
            if job is not None:
                jobs.add(job)
        return jobs


def identify(pid: int, uid: int, *, trusted_uids: frozenset[int], proc: ProcFs | None = None) -> JobIdentity:
    """Which jobs process ``pid`` (running as ``uid``) belongs to; see the module docstring."""
    proc = proc or ProcFs()
    cgroup = (proc.read(pid, "cgroup") or b"").decode(errors="replace")
    job = slurm_job_from_cgroup(cgroup)
    if job is not None:
        return JobIdentity("cgroup", frozenset({job}), f"Slurm job cgroup job_{job}")
    for ancestor in proc.ancestors(pid):
        job = proc.slurmstepd_of(ancestor)
        if job is not None:
            return JobIdentity("slurmstepd", frozenset({job}), f"descends from slurmstepd of job {job}")
    pod = pod_uid_from_cgroup(cgroup)
    if pod is not None:
        env = parse_environ(proc.read(pid, "environ") or b"")
        jobs = frozenset({env["FTD_JOB"]} if env.get("FTD_JOB") else ())
        detail = f"Kubernetes pod {pod}: job from the pod's FTD_JOB"
        if not jobs:
            detail = f"Kubernetes pod {pod} sets no FTD_JOB (set it from the ftd.dev/job label)"
        return JobIdentity("pod", jobs, detail, pod_uid=pod)
    if uid in trusted_uids:
        return JobIdentity("trusted_uid", detail=f"uid {uid} (root or the agent's own)", any_job=True)
    raw = proc.read(pid, "environ")
    if raw is None:
        return JobIdentity(
            "unknown",
            detail="no job cgroup, no slurmstepd ancestor, and its environment is unreadable "
            "(the agent needs CAP_SYS_PTRACE)",
        )
    env = parse_environ(raw)
    claimed = {env[name] for name in JOB_ENV if env.get(name)}
    running = proc.local_slurm_jobs() if claimed else set()
    jobs = frozenset(claimed - running)
    detail = (
        "no job cgroup and no slurmstepd ancestor (proctrack/linuxproc?): job from the process environment"
    )
    if claimed & running:
        detail += f"; not job(s) {','.join(sorted(claimed & running))}: they run under Slurm here"
    if not claimed:
        detail = "no job cgroup, no slurmstepd ancestor, and no FTD_JOB or SLURM_JOB_ID in its environment"
    return JobIdentity("environ", jobs, detail)


__all__ = [
    "JobIdentity",
    "PeerCred",
    "ProcFs",
    "identify",
    "parse_environ",
    "peer_cred",
    "pod_uid_from_cgroup",
    "slurm_job_from_cgroup",
    "slurmstepd_job",
]
