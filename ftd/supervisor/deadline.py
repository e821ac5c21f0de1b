"""How long ``ftd run`` gives its ranks to save and leave when the scheduler tells it to stop.

What: :func:`stop_grace` picks the seconds from the ranks' SIGTERM to their SIGKILL: until the
deadline when one is known, else ``--stop-grace``. The deadline is the one in the node's deadline
file if it holds a time ahead (``deadline`` beside the agent's socket, where the agent writes a cloud
notice's; or ``$FTD_DEADLINE_FILE``), else Slurm's: :func:`slurm_deadline` asks ``scontrol`` for the
preempted job's ``EndTime`` (``PreemptTime`` plus the grace), else the job's ``EndTime`` (a time
limit). Why: a fixed 10 s is too short for a large save and too long for
nothing; Slurm does not put the grace in the job's environment, so it is read from ``scontrol``
(a missing, failing or slow ``scontrol`` means no deadline, never an error).
The Slurm reader is the client's (:mod:`ftd.client.deadline`), which decides with it whether a
rank's save still fits. Standard library only, like the rest of the supervisor.
"""

from __future__ import annotations

from ftd.client.deadline import known_deadline, parse_fields, slurm_deadline, slurm_time

__all__ = ["MAX_GRACE_S", "known_deadline", "parse_fields", "slurm_deadline", "slurm_time", "stop_grace"]

#: A deadline further away than this is not the end of this stop (a time limit days ahead while a
#: user's ``scancel`` signals the job): ``--stop-grace`` applies instead.
MAX_GRACE_S = 3600.0


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
