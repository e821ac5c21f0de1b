"""Slurm behind the :class:`~ftd.coordinator.actions.scheduler.Scheduler` seam, through ``scontrol``.

Why ``scontrol`` and not slurmrestd: it is on every Slurm login/controller host, needs no token setup,
and its behaviour is what operators already know. Every call is an asyncio subprocess with an argument
list (never a shell), ``SLURM_CONF`` exported when configured, and a timeout that kills the child.

What was checked against a real Slurm 22.05 (one slurmctld, one slurmd; ``tests/contract``):

* ``scontrol update nodename=N state=drain reason=...`` takes the reason as one argv element; no shell
  quoting is needed, but a ``"`` inside it is mangled (Slurm drops the last one) and ``sinfo -R``
  cannot show newlines, so reasons go through :func:`sanitize_reason`. ``scontrol show node -o``
  prints ``Reason=<text> [user@time]``; the suffix is stripped here.
* ``state=resume`` on a node that is not drained fails with "Invalid node state specified"; it is
  treated as a no-op (after checking that the node exists and is indeed not drained).
* ``scontrol update jobid=J excnodelist=...`` is refused for a RUNNING job ("Job is no longer pending
  execution"), so the exclusion has to be set after the requeue. It is accepted for a pending job,
  including one still COMPLETING right after the requeue.
* ``scontrol requeue J`` works for a running job and for a *finished* batch job (COMPLETED, FAILED,
  CANCELLED): the job goes back to PENDING with ``Restarts`` + 1. It fails with "Job is pending
  execution" when the job is already pending, and with "Requested operation is presently disabled"
  for a job submitted with ``--no-requeue``.
* A requeued job may not start again before the credential lifetime passes (``AuthInfo
  cred_expire``, default 120 s; ``EligibleTime`` shows it), so "requeue, then set the exclusion" is
  practically safe. To make it strictly safe, this module uses ``scontrol requeuehold J`` (pending and
  held, ``Reason=job_requeued_in_held_state``), then ``update excnodelist``, then ``scontrol release``:
  the job can never start on a node being excluded. Exclusions are merged with the job's existing
  ``ExcNodeList`` (a retried or second requeue never re-admits a node excluded earlier).
* A retried requeue of a job that is already pending only sets the exclusion (and releases the job if
  it is still held by an interrupted earlier requeue), so ``Restarts`` is not bumped twice.
* A requeued job excluded from every node of its partition simply stays PENDING; the same holds for a
  job whose only allowed nodes are drained.
* Holding (:class:`~ftd.coordinator.actions.scheduler.JobHolder`, the pinned-job hold):
  ``scontrol requeuehold J`` leaves the job PENDING, ``Restarts`` + 1, ``Reason=job_requeued_in_held_state``
  until ``scontrol release J``; a job already pending is held with ``scontrol hold J``
  (``Reason=JobHeldAdmin``). ``job_info().held`` is either reason (or ``JobHeldUser``).
* ``scontrol reboot ASAP nextstate=RESUME|DOWN reason=... NODE``: ``ASAP`` drains the node at once
  (no new jobs) and reboots it when idle, then it returns as ``nextstate`` says. slurmctld refuses it
  when ``RebootProgram`` is not set in slurm.conf; that is a :class:`SchedulerError` like any refusal.
* Unknown nodes and jobs: "Invalid node name specified" / "Node X not found" / "Invalid job id
  specified", exit status 1; these become :class:`SchedulerError`. Exclusion lists are validated
  before the job is touched, so a typo cannot leave a job held.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Sequence

from ftd.coordinator.actions.scheduler import (
    REBOOT_NEXTSTATES,
    JobInfo,
    NodeInfo,
    Reservation,
    SchedulerError,
    sanitize_reason,
)
from ftd.coordinator.decide.grace_audit import SlurmGrace

_NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_JOB_RE = re.compile(r"^[0-9]{1,20}([_+][0-9]{1,20})?$")
_KEY_RE = re.compile(r"^[A-Z][A-Za-z0-9_:/]*$")
# A node's Reason ends with " [user@time]"; a job's Reason is one word followed by the next key.
_NODE_REASON_RE = re.compile(r"(?:^| )Reason=(.*?) \[[^\]\s]*@[^\]\s]*\](?: |$)")
_REASON_RE = re.compile(r"(?:^| )Reason=(.*?)(?: [A-Z][A-Za-z]*=|$)")
_NULLS = {"", "(null)", "None", "N/A"}
HELD_BY_REQUEUE = "job_requeued_in_held_state"
HELD_REASONS = frozenset({HELD_BY_REQUEUE, "JobHeldAdmin", "JobHeldUser"})
# Job states in which the job's processes may be running on its NodeList (job_nodes).
_ACTIVE_STATES = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING", "RESIZING"}


def expand_hostlist(expr: str) -> tuple[str, ...]:
    """Expand a Slurm hostlist (``node-[1-3,7],gpu[01-02]x``) into names, keeping zero padding."""
    if expr.strip() in _NULLS:
        return ()
    items: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(expr):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            items.append(expr[start:i])
            start = i + 1
    items.append(expr[start:])
    out: list[str] = []
    for item in (x.strip() for x in items):
        if item:
            out.extend(_expand_item(item))
    return tuple(out)


def _expand_item(item: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", item)
    if m is None:
        return [item]
    head, tail = item[: m.start()], item[m.end() :]
    values: list[str] = []
    for part in m.group(1).split(","):
        lo, sep, hi = part.partition("-")
        if not sep:
            values.append(lo)
            continue
        width = len(lo)
        values.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return [name for v in values for name in _expand_item(head + v + tail)]


def parse_oneliner(line: str) -> dict[str, str]:
    """Parse one ``scontrol show ... -o`` record into ``{Key: value}``.

    Values may contain spaces (``Command=``, ``Reason=``): a token that does not start a new
    ``Key=`` is glued onto the previous value. ``Reason`` is re-read with a dedicated pattern because
    a free-text reason may itself contain ``word=value``.
    """
    out: dict[str, str] = {}
    key: str | None = None
    for token in line.strip().split(" "):
        name, sep, value = token.partition("=")
        if sep and _KEY_RE.match(name):
            key = name
            out[key] = value
        elif key is not None:
            out[key] += " " + token
    result = {k: v.strip() for k, v in out.items()}
    m = _NODE_REASON_RE.search(line.strip()) or _REASON_RE.search(line.strip())
    if m is not None:
        result["Reason"] = m.group(1).strip()
    return result


_TIMESTAMP_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}$")
_DURATION_RE = re.compile(r"^(?:([0-9]{1,6})-)?(?:([0-9]{1,9}):)?(?:([0-9]{1,9}):)?([0-9]{1,9})$")


def parse_duration(text: str) -> float | None:
    """Seconds in a Slurm duration as ``scontrol`` prints ``TimeLimit``/``RunTime`` (``[days-]hours:
    minutes:seconds``, ``minutes:seconds``, ``minutes``, ``days-hours``...); None for ``UNLIMITED``,
    ``Partition_Limit``, ``NONE`` and anything else that is not a duration. Never raises."""
    if not isinstance(text, str):
        return None
    m = _DURATION_RE.match(text.strip())
    if m is None:
        return None
    days, a, b, last = m.groups()
    if days is not None and b is None:  # days-hours, days-hours:minutes (Slurm's --time forms)
        hours, minutes, seconds = (int(a), int(last), 0) if a is not None else (int(last), 0, 0)
    elif b is not None:  # hours:minutes:seconds
        hours, minutes, seconds = int(a or 0), int(b), int(last)
    elif a is not None:  # minutes:seconds
        hours, minutes, seconds = 0, int(a), int(last)
    else:  # minutes
        hours, minutes, seconds = 0, int(last), 0
    return float(((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds)


def time_left(rec: dict[str, str]) -> float | None:
    """A running job's time limit minus its run time (``TimeLimit`` - ``RunTime``), at least 0; None
    when the job has no limit, is not running, or either field cannot be read."""
    if rec.get("JobState") not in _ACTIVE_STATES:
        return None
    limit, ran = parse_duration(rec.get("TimeLimit", "")), parse_duration(rec.get("RunTime", ""))
    if limit is None or ran is None:
        return None
    return max(0.0, limit - ran)


def parse_timestamp(text: str) -> float | None:
    """Epoch seconds of a time as ``scontrol`` prints ``EndTime``/``PreemptTime``
    (``2026-12-04T20:10:41``, the controller host's local time, which is this host's when both use
    the same zone); None for ``None``, ``Unknown`` and anything else. Never raises."""
    if not isinstance(text, str) or not _TIMESTAMP_RE.match(text.strip()):
        return None
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def _running_time(rec: dict[str, str], key: str) -> float | None:
    """``rec[key]`` as epoch seconds while the job is active; None otherwise (a pending job's
    ``EndTime`` is only the scheduler's guess)."""
    if rec.get("JobState") not in _ACTIVE_STATES:
        return None
    return parse_timestamp(rec.get(key, ""))


def parse_show_config(text: str) -> dict[str, str]:
    """``scontrol show config`` (``Key                = value`` lines) as ``{Key: value}``."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def grace_of(config_text: str, partitions_text: str) -> SlurmGrace:
    """KillWait from ``scontrol show config`` (``30 sec``) and each partition's GraceTime (seconds) and
    PreemptMode from ``scontrol show partition -o``; unreadable values are left out, never guessed."""
    kill_wait: float | None = None
    m = re.match(r"^([0-9]+)(?: sec)?$", parse_show_config(config_text).get("KillWait", ""))
    if m is not None:
        kill_wait = float(m.group(1))
    parts: dict[str, tuple[float, str]] = {}
    for line in partitions_text.splitlines():
        rec = parse_oneliner(line) if line.strip() else {}
        name, grace = rec.get("PartitionName"), rec.get("GraceTime", "")
        if name and grace.isascii() and grace.isdigit():  # "\u00b2" is a digit to isdigit() only
            parts[name] = (float(grace), rec.get("PreemptMode", "OFF"))
    return SlurmGrace(kill_wait_s=kill_wait, partitions=parts)


def _node_info(rec: dict[str, str]) -> NodeInfo:
    """A node's record of ``scontrol show node -o`` as :class:`NodeInfo`. ``State`` is e.g.
    ``IDLE+DRAIN``, ``DOWN+NOT_RESPONDING``, ``MIXED+DRAIN+FAIL`` (``*`` marks not responding in
    ``sinfo`` only); drained: a ``DRAIN*`` flag; down: ``DOWN`` or ``FAIL*``."""
    state = rec.get("State", "UNKNOWN")
    flags = tuple(f for f in state.split("+") if f)
    reason = rec.get("Reason")
    return NodeInfo(
        name=rec.get("NodeName", ""),
        state=state,
        flags=flags,
        drained=any(f.startswith("DRAIN") for f in flags),
        reason=None if reason in _NULLS else reason,
        down=any(f.rstrip("*").startswith(("DOWN", "FAIL")) for f in flags),
    )


def _check_node(node: str) -> str:
    if not _NODE_RE.match(node):
        raise SchedulerError(f"invalid node name {node!r}")
    return node


def _check_job(job: str) -> str:
    if not _JOB_RE.match(job):
        raise SchedulerError(f"invalid Slurm job id {job!r}")
    return job


async def run_command(
    argv: Sequence[str], *, slurm_conf: str | None, timeout_s: float
) -> tuple[int, str, str]:
    """Run a Slurm command (``scontrol``, ``scancel``) with ``SLURM_CONF`` when given: (rc, stdout,
    stderr). A command that cannot start or outlives ``timeout_s`` (killed) is a SchedulerError."""
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
    except OSError as exc:
        raise SchedulerError(f"cannot run {argv[0]}: {exc}", command=argv) from exc
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise SchedulerError(f"{argv[0]} timed out after {timeout_s}s (killed)", command=argv) from None
    except asyncio.CancelledError:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    rc = proc.returncode if proc.returncode is not None else -1
    return rc, out.decode(errors="replace"), err.decode(errors="replace")


class SlurmScheduler:
    """Drain, resume and requeue through ``scontrol`` (see the module docstring for the semantics)."""

    name = "slurm"
    holds_jobs = True

    def __init__(self, scontrol: str = "scontrol", slurm_conf: str | None = None, timeout_s: float = 30.0):
        self.scontrol = scontrol
        self.slurm_conf = slurm_conf
        self.timeout_s = timeout_s

    async def _run(self, *args: str, check: bool = True) -> tuple[int, str, str]:
        argv = (self.scontrol, *args)
        rc, stdout, stderr = await run_command(argv, slurm_conf=self.slurm_conf, timeout_s=self.timeout_s)
        if check and rc != 0:
            raise SchedulerError("scontrol failed", command=argv, returncode=rc, stderr=stderr or stdout)
        return rc, stdout, stderr

    # -- nodes ------------------------------------------------------------------------------------

    async def drain(self, node: str, reason: str) -> None:
        await self._run(
            "update", f"nodename={_check_node(node)}", "state=drain", f"reason={sanitize_reason(reason)}"
        )

    async def resume(self, node: str) -> None:
        rc, out, err = await self._run("update", f"nodename={_check_node(node)}", "state=resume", check=False)
        if rc == 0:
            return
        if "invalid node state" in (err + out).lower():
            info = await self.node_info(node)  # raises for an unknown node
            if not info.drained:
                return  # nothing to undo: resume is idempotent
        raise SchedulerError(
            "scontrol failed",
            command=[self.scontrol, "update", f"nodename={node}", "state=resume"],
            returncode=rc,
            stderr=err or out,
        )

    async def node_info(self, node: str) -> NodeInfo:
        _, out, _ = await self._run("show", "node", "-o", _check_node(node))
        for line in out.splitlines():
            rec = parse_oneliner(line)
            if rec.get("NodeName") == node:
                return _node_info(rec)
        raise SchedulerError(f"node {node!r} not found", command=[self.scontrol, "show", "node", "-o", node])

    async def list_nodes(self) -> list[NodeInfo]:
        """Every node: ``scontrol show node -o`` (one line per node, all of them), sorted by name."""
        _, out, _ = await self._run("show", "node", "-o")
        records = (parse_oneliner(line) for line in out.splitlines())
        infos = [_node_info(rec) for rec in records if rec.get("NodeName")]
        return sorted(infos, key=lambda info: info.name)

    async def _check_nodes_exist(self, nodes: Sequence[str]) -> None:
        if not nodes:
            return
        _, out, _ = await self._run("show", "node", "-o", ",".join(_check_node(n) for n in nodes))
        found = {parse_oneliner(line).get("NodeName") for line in out.splitlines()}
        missing = sorted(set(nodes) - found)
        if missing:
            raise SchedulerError(f"unknown node(s) {missing} in exclusion list")

    # -- jobs -------------------------------------------------------------------------------------

    async def job_info(self, job: str) -> JobInfo:
        _, out, _ = await self._run("show", "job", "-o", _check_job(job))
        lines = [line for line in out.splitlines() if line.strip()]
        if not lines:
            raise SchedulerError(f"job {job!r} not found", command=[self.scontrol, "show", "job", "-o", job])
        rec = parse_oneliner(lines[0])
        try:
            restarts = int(rec.get("Restarts", "0"))
        except ValueError:
            restarts = 0
        reason = rec.get("Reason")
        preempt = _running_time(rec, "PreemptTime")
        limited = time_left(rec) is not None
        return JobInfo(
            job=job,
            state=rec.get("JobState", "UNKNOWN"),
            nodes=expand_hostlist(rec.get("NodeList", "")),
            excluded=expand_hostlist(rec.get("ExcNodeList", "")),
            restarts=restarts,
            reason=None if reason in _NULLS else reason,
            required=expand_hostlist(rec.get("ReqNodeList", "")),
            held=rec.get("JobState") == "PENDING" and reason in HELD_REASONS,
            time_left_s=time_left(rec),
            # EndTime: the limit's end, or PreemptTime + GraceTime once preempted (a job without a
            # limit shows a guess a year ahead otherwise)
            end_time=_running_time(rec, "EndTime") if limited or preempt is not None else None,
            preempt_time=preempt,
            partition=rec.get("Partition", ""),
        )

    async def job_nodes(self, job: str) -> tuple[str, ...]:
        """The nodes ``job`` runs on now: ``scontrol show job -o`` NodeList of each of its records in an
        active state (RUNNING, COMPLETING, ...), expanded by ``scontrol show hostnames`` (Slurm's own
        hostlist parser, for any syntax it accepts). Empty for a pending, finished or unknown job and
        for an id that is not a Slurm job id; :class:`SchedulerError` when scontrol cannot answer."""
        if not _JOB_RE.match(job):
            return ()
        rc, out, err = await self._run("show", "job", "-o", job, check=False)
        if rc != 0:
            if "invalid job id" in (err + out).lower():
                return ()  # unknown, or purged after MinJobAge
            argv = [self.scontrol, "show", "job", "-o", job]
            raise SchedulerError("scontrol failed", command=argv, returncode=rc, stderr=err or out)
        lists = []
        for line in out.splitlines():
            rec = parse_oneliner(line) if line.strip() else {}
            if rec.get("JobState") in _ACTIVE_STATES and rec.get("NodeList", "") not in _NULLS:
                lists.append(rec["NodeList"])
        if not lists:
            return ()
        hostlist = ",".join(lists)
        if "[" not in hostlist:
            return tuple(dict.fromkeys(n for n in hostlist.split(",") if n))
        _, names, _ = await self._run("show", "hostnames", hostlist)
        return tuple(dict.fromkeys(n.strip() for n in names.splitlines() if n.strip()))

    async def running_job_nodes(self) -> dict[str, tuple[str, ...]]:
        """Every job in an active state and its nodes, from one ``scontrol show job -o`` (the
        placement cache's warm-up when the coordinator starts; hostlists expanded by
        :func:`expand_hostlist`, which agrees with ``scontrol show hostnames`` on Slurm's syntax)."""
        _, out, _ = await self._run("show", "job", "-o")
        found: dict[str, tuple[str, ...]] = {}
        for line in out.splitlines():
            rec = parse_oneliner(line) if line.strip() else {}
            job, nodes = rec.get("JobId"), rec.get("NodeList", "")
            if job and rec.get("JobState") in _ACTIVE_STATES and nodes not in _NULLS:
                found[job] = expand_hostlist(nodes)
        return found

    async def requeue(self, job: str, exclude: Sequence[str] = ()) -> None:
        _check_job(job)
        exclude = tuple(dict.fromkeys(exclude))
        await self._check_nodes_exist(exclude)
        rc, out, err = await self._run("requeuehold", job, check=False)
        held_by_us = rc == 0
        if rc != 0:
            if "pending execution" not in (err + out).lower():
                raise SchedulerError(
                    "scontrol failed",
                    command=[self.scontrol, "requeuehold", job],
                    returncode=rc,
                    stderr=err or out,
                )
            # Already pending: a retry, or a job that never started. Only the exclusion is left to do.
            held_by_us = (await self.job_info(job)).reason == HELD_BY_REQUEUE
        if exclude:
            current = (await self.job_info(job)).excluded
            merged = list(dict.fromkeys([*current, *exclude]))
            if set(merged) != set(current):
                try:
                    await self._run("update", f"jobid={job}", f"excnodelist={','.join(merged)}")
                except SchedulerError as exc:
                    held = " (the job is left held; retry the requeue or `scontrol release` it)"
                    raise SchedulerError(str(exc) + (held if held_by_us else "")) from exc
        if held_by_us:
            await self._run("release", job)

    async def requeue_held(self, job: str) -> None:
        """Requeue ``job`` held (``scontrol requeuehold``); one already pending is held instead."""
        _check_job(job)
        rc, out, err = await self._run("requeuehold", job, check=False)
        if rc == 0:
            return
        if "pending execution" not in (err + out).lower():
            argv = [self.scontrol, "requeuehold", job]
            raise SchedulerError("scontrol failed", command=argv, returncode=rc, stderr=err or out)
        if not (await self.job_info(job)).held:  # a retry, or a job that never started: hold it
            await self._run("hold", job)

    async def release(self, job: str) -> None:
        """Release a held ``job`` (``scontrol release``); a job that is not held is left as it is."""
        if (await self.job_info(_check_job(job))).held:
            await self._run("release", job)

    async def list_reservations(self) -> list[Reservation]:
        """Every reservation (``scontrol show reservation -o``; "No reservations in the system" is
        none); one whose StartTime cannot be read is left out."""
        _, out, _ = await self._run("show", "reservation", "-o")
        found = []
        for line in out.splitlines():
            rec = parse_oneliner(line) if line.strip() else {}
            start = parse_timestamp(rec.get("StartTime", ""))
            if not rec.get("ReservationName") or start is None:
                continue
            flags = {f.strip().upper() for f in rec.get("Flags", "").split(",")}
            found.append(
                Reservation(
                    name=rec["ReservationName"],
                    start=start,
                    end=parse_timestamp(rec.get("EndTime", "")),
                    nodes=expand_hostlist(rec.get("Nodes", "")),
                    maintenance="MAINT" in flags,
                )
            )
        return found

    async def grace(self) -> SlurmGrace:
        """What Slurm grants after its notice (KillWait, each partition's GraceTime and PreemptMode)."""
        _, config, _ = await self._run("show", "config")
        _, partitions, _ = await self._run("show", "partition", "-o")
        return grace_of(config, partitions)

    # -- reboot -----------------------------------------------------------------------------------

    async def reboot(self, node: str, reason: str, nextstate: str = "RESUME") -> None:
        if nextstate not in REBOOT_NEXTSTATES:
            raise SchedulerError(f"invalid nextstate {nextstate!r} (one of {sorted(REBOOT_NEXTSTATES)})")
        await self._run(
            "reboot", "ASAP", f"nextstate={nextstate}", f"reason={sanitize_reason(reason)}", _check_node(node)
        )
