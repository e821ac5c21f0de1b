"""How long ``ftd run`` gives its ranks to save and leave when the scheduler tells it to stop.

What: :func:`stop_grace` picks the seconds from the ranks' SIGTERM to their SIGKILL: until the
deadline when one is known, else ``--stop-grace``. The deadline is the one the agent relayed (an
interruption's, epoch seconds) if any, else Slurm's: :func:`slurm_deadline` asks ``scontrol`` for the
job's ``PreemptTime`` plus its partition's ``GraceTime`` (a preempted job is ended then), else the
job's ``EndTime`` (a time limit). Why: a fixed 10 s is too short for a large save and too long for
nothing; Slurm does not put the grace in the job's environment, so it is read from ``scontrol``
(a missing, failing or slow ``scontrol`` means no deadline, never an error).
Standard library only, like the rest of the supervisor.
"""

from __future__ import annotations

import logging
import subprocess
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["MAX_GRACE_S", "parse_fields", "slurm_deadline", "slurm_time", "stop_grace"]

_log = logging.getLogger("ftd.supervisor")

#: A deadline further away than this is not the end of this stop (a time limit days ahead while a
#: user's ``scancel`` signals the job): ``--stop-grace`` applies instead.
MAX_GRACE_S = 3600.0
_SCONTROL_TIMEOUT_S = 5.0


def parse_fields(line: str) -> dict[str, str]:
    """``scontrol show ... -o`` output (``Key=value`` tokens separated by spaces) as a dict; a token
    without ``=`` is skipped (values with spaces, such as ``Reason``, keep their first word)."""
    out: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep and key:
            out[key] = value
    return out


def slurm_time(text: str | None) -> float | None:
    """``2026-12-04T20:01:53`` (``scontrol``'s local time) as epoch seconds; None for ``Unknown``,
    ``None`` or anything else."""
    if not text:
        return None
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def _seconds(text: str | None) -> float | None:
    """``GraceTime`` as ``scontrol show partition`` prints it (whole seconds)."""
    if text is None or not text.strip().isdecimal():
        return None
    return float(text.strip())


def _scontrol(args: list[str], env: Mapping[str, str]) -> str | None:
    try:
        done = subprocess.run(
            ["scontrol", *args],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=_SCONTROL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        _log.debug("ftd run: scontrol %s failed: %s", " ".join(args), exc)
        return None
    return done.stdout if done.returncode == 0 else None


def slurm_deadline(
    env: Mapping[str, str],
    scontrol: Callable[[list[str], Mapping[str, str]], str | None] = _scontrol,
) -> tuple[float, str] | None:
    """When Slurm ends this job (epoch seconds) and how that was learnt; None when not under Slurm
    or not known."""
    job = env.get("SLURM_JOB_ID", "").strip()
    if not job.isdecimal():
        return None
    text = scontrol(["show", "job", "-o", job], env)
    if not text:
        return None
    info = parse_fields(text)
    preempted = slurm_time(info.get("PreemptTime"))
    if preempted is not None and info.get("Partition"):
        part = scontrol(["show", "partition", "-o", info["Partition"]], env)
        grace = _seconds(parse_fields(part).get("GraceTime")) if part else None
        if grace is not None:
            return preempted + grace, f"Slurm preemption at {info['PreemptTime']} + GraceTime {grace:.0f} s"
    end = slurm_time(info.get("EndTime"))
    if end is not None and info.get("JobState") == "RUNNING":
        return end, f"Slurm EndTime {info['EndTime']}"
    return None


def stop_grace(
    default_s: float,
    now: float,
    deadline: tuple[float, str] | None,
) -> tuple[float, str]:
    """The ranks' grace from SIGTERM to SIGKILL and why: until ``deadline`` (epoch seconds, with
    where it came from) when it is ahead and within :data:`MAX_GRACE_S`, else ``default_s``."""
    if deadline is not None:
        left = deadline[0] - now
        if 0 < left <= MAX_GRACE_S:
            return left, deadline[1]
    return default_s, "--stop-grace"
