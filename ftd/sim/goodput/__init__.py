"""The goodput simulator behind ``ftd sim goodput``: what a fault-tolerance policy costs in training time.

One large training job runs for weeks of simulated time while faults arrive from a trace (a published
fault mix scaled to the job, :mod:`.faults`); the job model (:mod:`.model`) turns each fault into
lost time under two policies, no ftd and ftd, where ftd's decisions come from the real coordinator
engine on a simulated clock (:mod:`.bridge`); :mod:`.runner` compares them over a few seeds and sweeps
the checkpoint interval; :mod:`.report` prints the table and draws the plot. The fault mixes and the
set-ups, with a source for every number, are data: ``ftd/sim/data/*.toml``.
"""

from __future__ import annotations

from pathlib import Path

LAST_RUN = "goodput-last.json"


def last_run_path(ledger_path: str) -> Path | None:
    """Where ``ftd sim goodput --config`` leaves its last run for that coordinator's dashboard: beside
    the coordinator's ledger (its state directory). None for an in-memory ledger."""
    if ledger_path == ":memory:":
        return None
    return Path(ledger_path).parent / LAST_RUN
