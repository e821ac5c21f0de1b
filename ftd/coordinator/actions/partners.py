"""Where each node of a job keeps its checkpoint replicas (issue #34): the coordinator chooses, the
agents tell the ranks.

What: :func:`choose_partners` (pure) gives every training node of a job a partner node among the
job's other training nodes: one of another failure domain (its ``rack`` in ``coordinator.node_labels``)
where the job has one, never a node with an active critical condition, each node a partner to as few
others as possible, and the same answer for the same inputs (a choice changes only when a node comes,
goes or goes bad). :class:`CheckpointPartners` sends a job's choice to its nodes as a ``partners``
directive whenever it changes, with a version (the coordinator's clock in ns) that orders the
choices; the agent hands it to the job's ranks with the trainer protocol's
``partners`` op (:func:`ftd.client.protocol.partners`), and the checkpoint tier replicates each rank's
shard to the rank with the same local rank on its node's partner.

Why the coordinator: a replica is only worth its cost if it survives what kills its original, and
only the coordinator knows racks, conditions and which nodes the job trains on. A swapped-in spare
finds the lost node's shard on that node's partner; a restart reads it there
(:meth:`ftd.coordinator.model.checkpoints.CheckpointCatalogue.choose`).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Collection, Mapping, Sequence

from ftd.bus import topics
from ftd.coordinator.actions.directive import Publish, publish_with_retry
from ftd.events import Directive, encode
from ftd.logs import get_logger
from ftd.plugin.view import JobRecord

log = get_logger(__name__)

__all__ = ["CheckpointPartners", "choose_partners"]

PARTNERS_DEADLINE_S = 600.0  # how long the agent keeps it for ranks that register later
SEND_S = 5.0


def choose_partners(
    nodes: Sequence[str], rack_of: Mapping[str, str], bad: Collection[str] = ()
) -> dict[str, str]:
    """node -> its partner: another node of the job, of another rack when the job spans racks, never
    one in ``bad``; partners spread evenly (each node chosen by as few as possible); deterministic.
    A node with no possible partner (a one-node job, every other node bad) is left out."""
    ordered = sorted(set(nodes))
    fit = [n for n in ordered if n not in bad]
    load = dict.fromkeys(fit, 0)
    out: dict[str, str] = {}
    for index, node in enumerate(ordered):
        candidates = [n for n in fit if n != node]
        if not candidates:
            continue
        rack = rack_of.get(node)
        elsewhere = [n for n in candidates if rack is None or rack_of.get(n) != rack]
        pool = elsewhere or candidates

        def rank(n: str, index: int = index) -> tuple[int, int]:  # least chosen, then the next in order
            return load[n], (ordered.index(n) - index) % len(ordered)

        partner = min(pool, key=rank)
        out[node] = partner
        load[partner] += 1
    return out


class CheckpointPartners:
    """Sends each job's partner choice to its nodes when it changes (see the module docstring)."""

    def __init__(self, publish: Publish, rack_of: Mapping[str, str]) -> None:
        self._publish = publish
        self._rack_of = dict(rack_of)
        self._sent: dict[str, dict[str, str]] = {}  # job -> the choice last sent

    def forget(self, job: str) -> None:
        self._sent.pop(job, None)

    async def check(self, job: str, record: JobRecord | None, bad: Collection[str]) -> dict[str, str]:
        """Send ``job``'s choice if it changed; returns what was sent now ({} when nothing)."""
        if record is None or not record.ranks_by_node:
            self._sent.pop(job, None)
            return {}
        nodes = [n for n in record.nodes if record.ranks_by_node.get(n)]
        choice = choose_partners(nodes, self._rack_of, bad)
        if not choice or self._sent.get(job) == choice:
            return {}
        self._sent[job] = choice
        generation = record.generation
        # The version orders the choices for the ranks (the checkpoint tier applies the newest any
        # rank has); it is in the id too, so a choice that comes back (A, B, then A again) is not
        # dropped by the agent as a directive it has already seen.
        version = time.time_ns()
        digest = zlib.crc32(repr(sorted(choice.items())).encode())
        directive = Directive(
            id=f"partners-{job}-{digest:08x}-{version}",
            ts=time.time(),
            action="partners",
            job=job,
            reason="checkpoint replicas: each node's partner in another failure domain",
            deadline_s=PARTNERS_DEADLINE_S,
            params={"partners": choice, "generation": generation, "version": version},
        )
        try:
            for topic in topics.job_directives_for(sorted(choice)):
                await publish_with_retry(self._publish, topic, encode(directive), SEND_S)
        except Exception as exc:  # the bus is down: the next presence of the job tries again
            self._sent.pop(job, None)
            log.warning("checkpoint_partners_not_sent", job=job, error=str(exc)[:300])
            return {}
        log.info("checkpoint_partners_sent", job=job, partners=choice, directive=directive.id)
        return choice
