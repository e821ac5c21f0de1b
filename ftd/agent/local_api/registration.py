"""Who may use the agent's socket, and who may register for which job (issue #11).

What: :func:`socket_gid` (the group ``agent.socket_group`` names: the socket is created with
``socket_mode``, 0660, and that group, so the users who run training jobs reach it and nobody else)
and :func:`refusal` (why a ``register`` must be refused on a connection). On every connection the
server reads the kernel's word about the peer (``SO_PEERCRED``) and finds the job its process belongs
to (:func:`ftd.agent.peer.identify`: Slurm job cgroup, slurmstepd ancestry, Kubernetes pod, root or
the agent's own uid, else the process environment). A ``register`` for any other job is refused, and
so is a claimed ``pid`` that is not the peer's own (a forged pid would point the diagnostics' py-spy
at someone else's process). Why apart: the rules are the security boundary of the socket, easier to
review on their own than inside the server's handlers.
"""

from __future__ import annotations

import grp

from ftd.agent.local_api import wire
from ftd.agent.local_api.state import Conn
from ftd.agent.peer import ProcFs

__all__ = ["refusal", "socket_gid"]


def refusal(conn: Conn, msg: wire.Register | wire.Supervise, proc: ProcFs) -> str | None:
    """Why ``msg`` may not register on this connection (None: it may). A rank supervisor's
    ``supervise`` (``ftd run``) has the same rights as a rank's ``register``."""
    cred, ident = conn.cred, conn.identity
    if cred is None or ident is None:
        return None  # no SO_PEERCRED on this platform: nothing to check against
    if not ident.allows(msg.job):
        have = "job " + ", ".join(sorted(ident.jobs)) if ident.jobs else "no job ftd can name"
        return (
            f"registration refused: this process (pid {cred.pid}, uid {cred.uid}) belongs to {have} "
            f"({ident.detail}), not job {msg.job}"
        )
    if ident.any_job or msg.pid is None or msg.pid == cred.pid:
        return None
    if msg.pid in proc.ns_pids(cred.pid):  # the same process seen from inside a container
        return None
    return f"registration refused: pid {msg.pid} is not this connection's process (pid {cred.pid})"


def socket_gid(group: str | int) -> int:
    """The gid of ``agent.socket_group``: a number, or a group name; unknown names raise ValueError."""
    if isinstance(group, int):
        return group
    if group.isdecimal():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(f"agent.socket_group: no group named {group!r} on this host") from None
