"""The in-allocation restart's cost in the goodput simulator: ``ftd run`` with hot spares (issue #24).

What: :class:`RestartCosts` holds the seconds each term of an in-allocation restart takes, with the
figures measured by ``ftd bench recovery``; :func:`in_allocation_s` adds them up for a job. An
in-allocation restart (the coordinator's restart directive to the job's ``ftd run`` supervisors, in
place or with a hot spare taking the failed node's slot) costs, after the save (counted by the model as
``save_on_signal``):

1. ``stop_s``: the old generation's ranks stopped (SIGTERM to each rank's process group);
2. ``start_warm_s`` / ``start_cold_s``: the new generation's processes started, from the supervisor's
   pre-started interpreter with the trainer's imports loaded (``ftd run --warm``) or cold (a fresh
   interpreter importing torch);
3. ``rendezvous_first_step_s``: the fresh rendezvous (``MASTER_PORT`` + generation), the first
   optimizer set-up and the first training step after the resume;
4. the checkpoint load: the scenario's ``load_s`` (it depends on the job's checkpoint, not on ftd; the
   bench's checkpoint is a few kB, so its load is inside term 3).

A scheduler requeue (no spare left, or no supervisors) costs ``restart_s + load_s`` as before.

Why one place: every figure the simulator takes from the bench is here, with where it comes from, so
a new bench run changes one dataclass. Where the figures come from: ``ftd bench recovery`` on the
2-core development machine (load 2.0-2.2, three runs, docs/architecture.md section 10: real Slurm with
four slurmd nodes, a DDP job with gloo on CPU, ``ftd run --nodes 3 --spares 1``, Xid 79 on a training
node), seconds after the fault: ranks stopped 0.53-0.57 (median 0.55, which includes the ~ms
detection and the few-kB save), generation 1 started 0.89-0.95 (median 0.92) from warm interpreters,
first step 1.25-1.80 (median 1.71) warm and 3.6-4.9 (median 4.30) without ``--warm``. Hence
stop 0.55 s; warm start 0.92 - 0.55 = 0.37 s; rendezvous and first step 1.71 - 0.92 = 0.79 s; cold
start 0.37 + (4.30 - 1.71) = 2.96 s (what the cold path adds is the imports). Limit: the rendezvous
and first step were measured with 3 nodes; at thousands of nodes the communicator set-up takes longer
(not measured here): pass other costs to :func:`ftd.sim.goodput.model.simulate` to see what that does.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RestartCosts:
    """Seconds per term of an in-allocation restart; defaults: ``ftd bench recovery`` medians (above)."""

    stop_s: float = 0.55
    start_warm_s: float = 0.37
    start_cold_s: float = 2.96
    rendezvous_first_step_s: float = 0.79
    source: str = (
        "ftd bench recovery, 2-core machine, 3 training nodes + 1 spare, gloo CPU DDP, Xid 79, medians "
        "of three runs (docs/architecture.md section 10)"
    )


BENCH_COSTS = RestartCosts()


def in_allocation_s(load_s: float, *, warm: bool, costs: RestartCosts = BENCH_COSTS) -> float:
    """Seconds from the save done to the first step after the resume, for an in-allocation restart
    of a job whose checkpoint loads in ``load_s`` (``warm``: from pre-started interpreters)."""
    start = costs.start_warm_s if warm else costs.start_cold_s
    return costs.stop_s + start + costs.rendezvous_first_step_s + load_s


__all__ = ["BENCH_COSTS", "RestartCosts", "in_allocation_s"]
