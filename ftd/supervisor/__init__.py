"""The rank supervisor, ``ftd run [options] -- <training command>`` (issue #24).

What: one supervisor per node of a job (a task of ``srun``, or a pod's entrypoint) starts and
watches that node's ranks with the environment torchrun would give them, and talks to the node's
agent over its local socket: the agent stays the authority on the node and relays the
coordinator's ``restart`` directives, which start a new *generation* of every rank (a fresh
rendezvous: ``MASTER_PORT`` moves with the generation, so a rank of an older one can never join)
with the failed node's slot given to a hot spare. Nodes beyond the job's training slots are spares:
their supervisor waits idle (preflighted, optionally with a pre-started interpreter that has the
training imports loaded) until a restart gives it a slot.

Layout (one job each): :mod:`~ftd.supervisor.assignment` (pure: the generation-0 slot from options
and the environment, each rank's environment, what a restart directive means for this node),
:mod:`~ftd.supervisor.ranks` (the node's ranks as processes: start, stop with SIGTERM then SIGKILL,
exit codes), :mod:`~ftd.supervisor.warm` (the pre-started interpreter), :mod:`~ftd.supervisor.preflight`
(run the ``--preflight`` command), :mod:`~ftd.supervisor.agent_link` (the socket to the agent:
``supervise``, state updates, directives in, reconnect with backoff) and
:mod:`~ftd.supervisor.supervisor` (the loop). The command line is :mod:`ftd.commands.run`.

Why a ground-floor package beside :mod:`ftd.client`: it runs inside every training allocation, on
the trainer-only install (no structlog, no msgspec): the standard library and the client's protocol
only, and Python 3.9 syntax like the client.
"""

from __future__ import annotations

__all__: list[str] = []
