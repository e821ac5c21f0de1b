"""NCCL RAS's text status read for the processes it says are missing or dead.

What: RAS (NCCL >= 2.24, ``localhost:28028``, its ``STATUS`` answer; the agent's collector is in
:mod:`ftd.agent.hang_evidence`) prints a job summary, a communicators table, then an ``Errors``
section and a ``Warnings`` section. In ``Errors`` it names the processes it could not hear from:

* under ``INCOMPLETE`` ("Missing communicator data from N job processes") and ``DEAD`` ("N job
  processes are considered dead"): one line per process, ``Process PID on node HOST managing GPU ...``;
* under a communicator's ``#G-C (HASH) INCOMPLETE``: one line per missing rank of that communicator,
  ``Rank R -- GPU ... managed by process PID on node HOST`` (R is the rank *in that communicator*,
  not the job's rank, so only the process and the node are taken from it).

:func:`missing_processes` returns each (pid, host) once, in the order printed, from the ``Errors``
section only (the summary's outlier nodes and the warnings are about other things). Mapping a process
to the job's rank is the verdict's business (:mod:`ftd.culprit.verdict`): it knows each rank's pid and
node. The host is what RAS printed (an address or a name). Never raises; bounded.
"""

from __future__ import annotations

import re

import msgspec

__all__ = ["MAX_PROCESSES", "RasProcess", "missing_processes"]

MAX_PROCESSES = 64  # processes kept from one answer (each a pid and a host of at most 128 characters)

_PROCESS = re.compile(r"^\s*Process ([0-9]{1,10}) on node (\S{1,128}) managing GPU")
_RANK = re.compile(r"^\s*Rank [0-9]{1,10} -- .*\bmanaged by process ([0-9]{1,10}) on node (\S{1,128})\s*$")
_SECTION = re.compile(r"^(Errors|Warnings)\s*$")


class RasProcess(msgspec.Struct, frozen=True, kw_only=True):
    """A process RAS reports missing or dead: its pid and the node RAS printed for it."""

    pid: int
    host: str


def missing_processes(text: str) -> list[RasProcess]:
    """The processes RAS's ``Errors`` section names (see the module docstring); [] for anything else."""
    if not isinstance(text, str):
        return []
    found: list[RasProcess] = []
    seen: set[tuple[int, str]] = set()
    in_errors = False
    for line in text.splitlines():
        section = _SECTION.match(line)
        if section:
            in_errors = section.group(1) == "Errors"
            continue
        if not in_errors:
            continue
        match = _PROCESS.match(line) or _RANK.match(line)
        if match is None:
            continue
        key = (int(match.group(1)), match.group(2))
        if key in seen:
            continue
        seen.add(key)
        found.append(RasProcess(pid=key[0], host=key[1]))
        if len(found) >= MAX_PROCESSES:
            break
    return found
