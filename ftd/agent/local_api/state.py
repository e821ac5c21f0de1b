"""What the local API keeps per connection: :class:`Conn`.

What: one connected client, its peer credentials and, once registered, its job, rank, pid, step and
last heartbeat. Why apart: a plain record shared by the server's handlers and the registration
check (:mod:`ftd.agent.local_api.registration`), with no behaviour beyond its :class:`RankInfo` view.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ftd.agent.peer import JobIdentity, PeerCred
from ftd.events import RankInfo, StepTiming

__all__ = ["Conn"]


@dataclass(eq=False)
class Conn:
    """One connected client (a rank once it has registered)."""

    writer: asyncio.StreamWriter
    connected_at: float
    job: str | None = None
    rank: int = -1
    local_rank: int | None = None
    pid: int | None = None
    step: int | None = None
    last_beat: float | None = None  # wall clock, reported in RankInfo
    last_beat_mono: float = 0.0  # registration time until the first heartbeat
    beaten: bool = False  # a heartbeat came: silence counts from the last one, not from registration
    startup_timeout_s: float | None = None  # the rank's own start-up timeout (None: the agent's)
    run: str | None = None  # the run of the job its process belongs to (None: not said)
    checkpoint_dir: str | None = None  # where the rank saves (None: not said), issue #23
    fallback_checkpoint_dir: str | None = None  # where it can save when that cannot take a save
    errors: int = 0
    cred: PeerCred | None = None  # SO_PEERCRED at connect (None where the OS has none)
    identity: JobIdentity | None = None
    supervising: str | None = None  # the job of a rank supervisor's connection (``ftd run``)
    timing: StepTiming | None = None  # the rank's latest step timing counters (issue #33)

    def info(self) -> RankInfo:
        return RankInfo(
            rank=self.rank,
            local_rank=self.local_rank,
            pid=self.pid,
            step=self.step,
            last_beat=self.last_beat,
            run=self.run,
            checkpoint_dir=self.checkpoint_dir,
            fallback_checkpoint_dir=self.fallback_checkpoint_dir,
            timing=self.timing,
        )
