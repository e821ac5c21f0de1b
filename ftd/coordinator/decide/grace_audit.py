"""The grace audit (issue #37 item 5): do the layers that decide how long a job lives after its notice
leave it time to save? Pure: the caller reads the settings (Slurm: ``scontrol show config`` KillWait,
``scontrol show partition`` GraceTime and PreemptMode; Kubernetes: the pods'
``terminationGracePeriodSeconds``; the launcher's ``ftd run --stop-grace``) and the
job's save time (a measured one where there is one, else ``coordinator.save_deadline_s``), and gets one
:class:`GraceFinding` per layer too short, each naming the setting to change.

Why: a checkpoint that needs 90 s in a partition with ``GraceTime=30`` is lost at every preemption,
and nothing says so until the restart finds an old checkpoint. The numbers are all readable ahead of
time, so ``ftd check-config --grace`` can say it before the first preemption.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["GraceFinding", "SlurmGrace", "audit_grace", "audit_pod_grace"]


@dataclass(frozen=True, slots=True)
class SlurmGrace:
    """What Slurm grants after its notice: KillWait (slurm.conf), and per partition its GraceTime and
    PreemptMode (``OFF``: never preempted)."""

    kill_wait_s: float | None
    partitions: Mapping[str, tuple[float, str]]  # partition -> (GraceTime s, PreemptMode)


@dataclass(frozen=True, slots=True)
class GraceFinding:
    setting: str  # what to change, as the operator would type it
    message: str


def audit_grace(slurm: SlurmGrace, save_s: float, stop_grace_s: float | None = None) -> list[GraceFinding]:
    """Every layer whose grace is shorter than ``save_s`` (or that outlasts the layer below it)."""
    found: list[GraceFinding] = []
    kw = slurm.kill_wait_s
    if kw is not None and kw < save_s:
        found.append(
            GraceFinding(
                "slurm.conf KillWait / sbatch --signal",
                f"at its time limit a job gets SIGTERM and SIGKILL {kw:g}s later, less than its save time "
                f"{save_s:g}s: raise KillWait, or submit with --signal=B:USR1@{int(save_s * 1.5) + 30} so "
                "ftd is told before the limit",
            )
        )
    for name, (grace, mode) in sorted(slurm.partitions.items()):
        if mode.upper() in {"OFF", ""} or grace >= save_s:
            continue
        found.append(
            GraceFinding(
                f"slurm.conf PartitionName={name} GraceTime",
                f"partition {name} (PreemptMode={mode}) gives a preempted job GraceTime={grace:g}s, less "
                f"than its save time {save_s:g}s: set GraceTime to at least {int(save_s) + 1}",
            )
        )
    if stop_grace_s is not None:
        if stop_grace_s < save_s:
            found.append(
                GraceFinding(
                    "ftd run --stop-grace",
                    f"the launcher kills the ranks {stop_grace_s:g}s after SIGTERM, less than the save time "
                    f"{save_s:g}s: raise --stop-grace",
                )
            )
        if kw is not None and stop_grace_s > kw:
            found.append(
                GraceFinding(
                    "ftd run --stop-grace / slurm.conf KillWait",
                    f"--stop-grace {stop_grace_s:g}s outlasts KillWait {kw:g}s: Slurm's SIGKILL comes first; "
                    "raise KillWait or lower --stop-grace",
                )
            )
    return found


def audit_pod_grace(grace_s: float, save_s: float) -> list[GraceFinding]:
    """A job's pods whose termination grace (the shortest of them) is shorter than its save time."""
    if grace_s >= save_s:
        return []
    return [
        GraceFinding(
            "pod spec.terminationGracePeriodSeconds",
            f"the job's pods get SIGKILL {grace_s:g}s after SIGTERM (deletion, eviction, node shutdown), "
            f"less than its save time {save_s:g}s: set terminationGracePeriodSeconds to at least "
            f"{int(save_s) + 10}",
        )
    ]
