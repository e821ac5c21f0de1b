"""The goodput simulator behind ``ftd sim goodput``: what a fault-tolerance policy costs in training time.

One large training job runs for weeks of simulated time while faults arrive from a trace (a published
fault mix scaled to the job, :mod:`.faults`); the job model (:mod:`.model`) turns each fault into
lost time under two policies, no ftd and ftd, where ftd's decisions come from the real coordinator
engine on a simulated clock (:mod:`.bridge`); :mod:`.runner` compares them over a few seeds and sweeps
the checkpoint interval; :mod:`.report` prints the table and draws the plot. The fault mixes and the
set-ups, with a source for every number, are data: ``ftd/sim/data/*.toml``.
"""

from __future__ import annotations

# The dashboard reads the last run from this path (the coordinator knows nothing of the simulator).
from ftd.coordinator.api.dashboard import LAST_RUN, last_run_path

__all__ = ["LAST_RUN", "last_run_path"]
