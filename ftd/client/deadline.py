"""When this job will be ended, and whether a save still fits before then (issue #37, items 3-4).

What: :func:`slurm_deadline` asks ``scontrol`` when Slurm ends this job (a preempted job's
``EndTime``, which slurmctld sets to ``PreemptTime`` plus the partition's or the QOS's ``GraceTime``,
or where it shows none the partition's ``GraceTime`` after ``PreemptTime``; else a running job's
``EndTime``);
:func:`known_deadline` prefers a deadline file (``$FTD_DEADLINE_FILE``: epoch seconds, written by
whoever knows better, e.g. a launcher) and falls back to Slurm. :class:`SaveClock` keeps how long
this rank's saves took (from the loop first seeing ``should_save()`` to its answer), and
:func:`skip_reason` says whether a save whose p95 is that long can still land before the deadline.

Why in the client: a SIGTERM is the only notice a plain training loop gets (no agent, no launcher),
and a save started too late is cut by SIGKILL: it only wastes the grace and risks a partial
checkpoint. A rank that has measured its own saves can tell, at the SIGTERM, that its save cannot
finish and stop at once instead, saying which checkpoint the job will resume from. Without a
measured save or without a deadline it saves as before (it cannot know better). Standard library
only; a missing, failing or slow ``scontrol`` is no deadline, never an error. The rank supervisor
(``ftd run``) uses the same Slurm reader.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import subprocess
import time

from ftd.client.protocol import DEFAULT_SOCKET

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = [
    "DEADLINE_FILE_ENV",
    "DEADLINE_FILE_NAME",
    "SaveClock",
    "deadline_file",
    "known_deadline",
    "parse_fields",
    "skip_reason",
    "slurm_deadline",
    "slurm_time",
]

_log = logging.getLogger("ftd.client")

#: A file holding the deadline (epoch seconds) for this process, written by whoever knows it.
DEADLINE_FILE_ENV = "FTD_DEADLINE_FILE"
#: Its name beside the agent's socket when ``$FTD_DEADLINE_FILE`` is not set (the agent writes it).
DEADLINE_FILE_NAME = "deadline"
#: A deadline file further ahead than this is not believed (a notice is minutes, not days, ahead).
MAX_AHEAD_S = 86400.0
#: Seconds kept after the save for the loop to leave and the process to be ended cleanly.
MARGIN_ENV = "FTD_SAVE_MARGIN_S"
DEFAULT_MARGIN_S = 2.0
_SCONTROL_TIMEOUT_S = 5.0
#: Saves kept for the p95: enough to move with the job, few enough to forget its cold first ones.
KEEP = 32


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
        _log.debug("ftd: scontrol %s failed: %s", " ".join(args), exc)
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
    end = slurm_time(info.get("EndTime"))
    if preempted is not None and end is not None and end > preempted:
        # slurmctld rewrites a preempted job's EndTime to PreemptTime + its grace, whether that grace
        # is the partition's or its QOS's (preempt/qos): the one figure that is right for both.
        return end, f"Slurm preemption at {info['PreemptTime']} + GraceTime {end - preempted:.0f} s"
    if preempted is not None and info.get("Partition"):
        part = scontrol(["show", "partition", "-o", info["Partition"]], env)
        part_grace = _seconds(parse_fields(part).get("GraceTime")) if part else None
        if part_grace is not None:
            return (
                preempted + part_grace,
                f"Slurm preemption at {info['PreemptTime']} + GraceTime {part_grace:.0f} s",
            )
    if end is not None and preempted is None and info.get("JobState") == "RUNNING":
        return end, f"Slurm EndTime {info['EndTime']}"
    return None


def deadline_file(env: Mapping[str, str], socket_path: str | None = None) -> str:
    """Where this node's deadline is written: ``$FTD_DEADLINE_FILE``, else ``deadline`` beside the
    agent's socket (``socket_path``, else ``$FTD_SOCKET``, else the default socket), where the agent
    writes a cloud notice's deadline for the node's processes."""
    explicit = env.get(DEADLINE_FILE_ENV, "")
    if explicit:
        return explicit
    socket = socket_path or env.get("FTD_SOCKET") or DEFAULT_SOCKET
    return os.path.join(os.path.dirname(socket) or ".", DEADLINE_FILE_NAME)


def known_deadline(
    env: Mapping[str, str],
    scontrol: Callable[[list[str], Mapping[str, str]], str | None] = _scontrol,
    *,
    socket_path: str | None = None,
    now: float | None = None,
) -> tuple[float, str] | None:
    """The deadline in the deadline file (:func:`deadline_file`) when it holds a time still ahead and
    within :data:`MAX_AHEAD_S`, else Slurm's. A deadline already past is a notice that is over: it
    is ignored, never taken as "no time left"."""
    path = deadline_file(env, socket_path)
    at = time.time() if now is None else now
    try:
        with open(path, encoding="utf-8") as f:
            value = float(f.read(64).strip())
        if math.isfinite(value) and at < value <= at + MAX_AHEAD_S:
            return value, f"deadline file {path}"
    except (OSError, ValueError):
        pass
    return slurm_deadline(env, scontrol)


def margin_s(env: Mapping[str, str]) -> float:
    """``$FTD_SAVE_MARGIN_S`` (seconds kept after a save), else :data:`DEFAULT_MARGIN_S`."""
    try:
        value = float(env.get(MARGIN_ENV, "") or DEFAULT_MARGIN_S)
    except ValueError:
        return DEFAULT_MARGIN_S
    return value if math.isfinite(value) and 0 <= value <= 3600 else DEFAULT_MARGIN_S


class SaveClock:
    """How long this rank's saves took: from the loop first seeing a wanted save to its answer."""

    def __init__(self, keep: int = KEEP) -> None:
        self._began: float | None = None
        self._taken: collections.deque[float] = collections.deque(maxlen=keep)

    def seen(self, now: float) -> None:
        """The loop saw ``should_save()`` true: the save starts (once per save)."""
        if self._began is None:
            self._began = now

    def answered(self, now: float, ok: bool) -> None:
        """The save was answered: a success is a measured save; either way the next one starts anew."""
        began, self._began = self._began, None
        if ok and began is not None and now >= began:
            self._taken.append(now - began)

    @property
    def count(self) -> int:
        return len(self._taken)

    def p95(self) -> float | None:
        """The nearest-rank p95 of the saves kept (a save that really took that long), or None."""
        if not self._taken:
            return None
        ordered = sorted(self._taken)
        return ordered[max(1, math.ceil(0.95 * len(ordered))) - 1]


def skip_reason(
    now: float, deadline: tuple[float, str] | None, p95: float | None, margin: float
) -> str | None:
    """Why a save should not be started (its p95 plus the margin does not fit before the deadline), or
    None to save: no deadline known, or no measured save, is a save (nothing says it cannot land)."""
    if deadline is None or p95 is None:
        return None
    left = deadline[0] - now
    if left >= p95 + margin:
        return None
    return (
        f"{max(left, 0.0):.1f} s left before the deadline ({deadline[1]}) and this rank's saves take "
        f"{p95:.1f} s (p95) + {margin:.1f} s margin: a save would not land"
    )
