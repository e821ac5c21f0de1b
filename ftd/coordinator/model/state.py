"""The coordinator's picture of the cluster: nodes, GPUs by UUID, and which ranks of which jobs run where.

Built from the bus: retained node status (online/offline, with the Last Will for crashes) and
retained job presence published by each agent. Rules read it through :class:`ClusterView`, a
read-only protocol, so a rule cannot change state behind the engine's back.

History (for rules such as ``repeat_offender``): :meth:`ClusterState.apply_event` is called by the
engine *after* the rules have evaluated an event, so a rule sees the history *before* the event it
is deciding on. Faults (severity >= error) are kept per node and per GPU UUID (bounded: the last
``HISTORY_LIMIT`` per node / GPU); every event, whatever its severity, is also kept per node
(``node_events``, same bound) so rules can link one incident's parts (an Xid 48 and its Xid 63, a
save asked for and the pressure that continues); every event carrying ``data.uuid`` updates that GPU's record
(which node it is in now, its PCI address), so a GPU moved to another node keeps its past. The
engine rebuilds this from the ledger's recent events at start-up.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from ftd.coordinator.model.checkpoints import CheckpointCatalogue
from ftd.coordinator.model.inventory import DriftChange, InventoryBook
from ftd.coordinator.model.moved import MovedJobs
from ftd.coordinator.model.pairs import PairBook
from ftd.coordinator.model.save_times import SaveTimes
from ftd.culprit.evidence import MAX_TEXT, PeerBlame
from ftd.culprit.peers import normalize_address, resolve_peer
from ftd.events import Event, JobPresence, Kind, NodeStatus, Severity
from ftd.plugin.save_path import FilesystemBook
from ftd.plugin.view import (
    HISTORY_LIMIT,
    FaultRecord,
    GpuRecord,
    JobRecord,
    NodeRecord,
    as_record,
    record_fields,
)

_WARNING_RANK = Severity.WARNING.rank
PEER_BLAMES_KEPT = 32  # per job, the newest (issue #33: the hang collection reads them)


class ClusterState:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeRecord] = {}
        self.jobs: dict[str, JobRecord] = {}
        self.gpus: dict[str, GpuRecord] = {}
        self.history: dict[str, deque[FaultRecord]] = {}  # node -> faults, oldest first
        # node -> why: drained or down by someone else (the scheduler says so; not ftd's budget)
        self.unavailable: dict[str, str] = {}
        # node -> every event, oldest first (incidents): record_fields' plain tuples, and the events'
        # data apart (same order), so the garbage collector stops tracking the millions of tuples a
        # large cluster's history holds and its full collections do not stall the coordinator
        self.recent: dict[str, deque[tuple[Any, ...]]] = {}
        self._recent_data: dict[str, deque[Mapping[str, Any]]] = {}
        self.filesystems = FilesystemBook()  # filesystems in trouble, by key and node (the save path)
        # node -> reasons of its active critical conditions, as its agent publishes them (ftd health)
        self.conditions: dict[str, list[str]] = {}
        # node -> the event kind of each of those conditions, same order ("unknown": an older agent)
        self.condition_kinds: dict[str, list[str]] = {}
        # job -> when ftd restarted it (requeued it through the scheduler), oldest first (bounded)
        self.restarts: dict[str, deque[float]] = {}
        # the nodes ftd drained (kept with mark_drained: the gate reads it per drain, not a scan)
        self._drained_by_ftd: set[str] = set()
        # address (normalised) -> the node whose agent announced it (NodeStatus.addresses, issue #33)
        self.address_book: dict[str, str] = {}
        # job -> the newest peer blames its ranks' logs made (a line naming another rank by address)
        self.peer_blames: dict[str, deque[PeerBlame]] = {}
        # each job's verified checkpoints per step and level, and the resume choice (issue #34)
        self.checkpoints = CheckpointCatalogue()
        # the newest pair test per pair, the fleet's baseline and the matrix (issue #35)
        self.pairs = PairBook()
        # how long each job's saves took per level (issue #37), for the decision against a deadline
        self.save_times = SaveTimes()
        # node -> each of its problems ("drained", "unavailable", "condition") -> when it began, so
        # the dashboard says when a node's problem began, not when its status last changed
        self.trouble_since: dict[str, dict[str, float]] = {}
        # the jobs ftd requeued that do not train again yet (shown as pending after requeue, #32)
        self.moved = MovedJobs()
        # what each node runs and its version drift against its hardware profile's peers (issue #36)
        self.inventory = InventoryBook()

    # --- updates from the bus --------------------------------------------------------------

    def _node(self, name: str) -> NodeRecord:
        record = self.nodes.get(name)
        if record is None:
            record = self.nodes[name] = NodeRecord(name)
        return record

    def apply_status(self, status: NodeStatus) -> bool:
        """Record a node's status; True when it changed."""
        node = self._node(status.node)
        online = status.state == "online"
        changed = node.online != online
        node.online = online
        node.status = str(status.state)
        node.last_change = status.ts or time.time()
        if status.addresses:  # a Last Will or an older agent says none: the last announced stay
            self._set_addresses(node, status.addresses)
        return changed

    def _set_addresses(self, node: NodeRecord, addresses: Sequence[str]) -> None:
        for old in node.addresses:
            if self.address_book.get(normalize_address(old)) == node.name:
                del self.address_book[normalize_address(old)]
        node.addresses = [a[:MAX_TEXT] for a in addresses[:64] if isinstance(a, str) and a]
        for address in node.addresses:
            self.address_book[normalize_address(address)] = node.name

    def node_of_address(self, address: str) -> str | None:
        """The node that announced ``address`` (a full host name also matches its short name)."""
        if not isinstance(address, str):
            return None
        return resolve_peer(address, self.address_book, normalized=True)

    def _note_peer_blame(self, event: Event, address: str) -> None:
        """A log line of ``event``'s node blames ``address``: kept per job (newest
        :data:`PEER_BLAMES_KEPT`), resolved to the node, and to the rank when the job has exactly one
        there."""
        job = event.data.get("job")
        jobs = [str(job)] if isinstance(job, str | int) and not isinstance(job, bool) and str(job) else []
        jobs = jobs or self.jobs_on_node(event.node)
        reporter_rank = event.data.get("rank")
        text = event.data.get("text")
        node = self.node_of_address(address)
        for name in jobs:
            rank = None
            record = self.jobs.get(name)
            if node is not None and record is not None:
                ranks = record.ranks_by_node.get(node, [])
                rank = ranks[0].rank if len(ranks) == 1 else None
            blame = PeerBlame(
                address=address[:MAX_TEXT],
                reporter_node=event.node,
                reporter_rank=reporter_rank if type(reporter_rank) is int else None,
                node=node,
                rank=rank,
                line=text[:MAX_TEXT] if isinstance(text, str) else "",
            )
            self.peer_blames.setdefault(name, deque(maxlen=PEER_BLAMES_KEPT)).append(blame)

    def job_peer_blames(self, job: str) -> list[PeerBlame]:
        """The job's recent peer blames, oldest first; one recorded before its node was known (the
        ledger's history replayed at start-up) is resolved now, where it can be."""
        out = []
        for blame in self.peer_blames.get(job, ()):
            if blame.node is None and (node := self.node_of_address(blame.address)) is not None:
                blame = PeerBlame(
                    address=blame.address,
                    reporter_node=blame.reporter_node,
                    reporter_rank=blame.reporter_rank,
                    node=node,
                    rank=blame.rank,
                    line=blame.line,
                )
            out.append(blame)
        return out

    def apply_presence(self, node: str, job: str, presence: JobPresence | None) -> None:
        """A node's retained presence of ``job``: its registered ranks, from the scheduler's Prolog its
        allocation there (a job without the client has only that), and its rank supervisor
        (``ftd run``: a presence with only a supervisor, e.g. a hot spare's, is a valid one)."""
        record = self.jobs.get(job)
        allocation = presence.allocation if presence is not None else None
        supervisor = presence.supervisor if presence is not None else None
        if presence is None or (not presence.ranks and allocation is None and supervisor is None):
            if record is not None:
                record.ranks_by_node.pop(node, None)
                record.allocations.pop(node, None)
                record.supervisors.pop(node, None)
                if not record.ranks_by_node and not record.allocations and not record.supervisors:
                    del self.jobs[job]
            return
        if record is None:
            record = self.jobs[job] = JobRecord(job)
        if presence.ranks:
            self.moved.trains_again(job)
        elif allocation is not None and allocation.started > 0:
            self.moved.trains_again(job, allocation.started)  # its Prolog: started (again?) here
        if presence.ranks:
            record.ranks_by_node[node] = list(presence.ranks)
        else:
            record.ranks_by_node.pop(node, None)
        if allocation is not None:
            record.allocations[node] = allocation
        else:
            record.allocations.pop(node, None)
        if supervisor is not None:
            record.supervisors[node] = supervisor
        else:
            record.supervisors.pop(node, None)
        self._node(node)

    def apply_conditions(
        self, node: str, reasons: list[str], kinds: Sequence[str] = (), since: float | None = None
    ) -> None:
        """The node's active critical conditions (its agent's ``conditions/ftd``) and the event kind of
        each (``kinds``, same order; "unknown" where the agent did not say); [] clears them.
        ``since``: when the agent published them (the first set's time is kept while any stays)."""
        self._trouble(node, "condition", bool(reasons), since, keep=True)
        if reasons:
            self.conditions[node] = list(reasons)
            known = list(kinds[: len(reasons)])
            self.condition_kinds[node] = known + ["unknown"] * (len(reasons) - len(known))
        else:
            self.conditions.pop(node, None)
            self.condition_kinds.pop(node, None)

    def mark_drained(self, node: str, reason: str, drained: bool = True, since: float | None = None) -> None:
        """ftd drained ``node`` (or, ``drained=False``, it is back in service): counted in ftd's
        blast-radius budget. Persisted and reconciled by :mod:`ftd.coordinator.upkeep.reconcile`.
        ``since``: when it was drained, where known (the ledger's drain); else now, the first time."""
        self._trouble(node, "drained", drained, since)
        record = self._node(node)
        record.drained_by_ftd = drained
        record.drain_reason = reason if drained else ""
        if drained:
            self._drained_by_ftd.add(node)
        else:
            self._drained_by_ftd.discard(node)

    def mark_unavailable(self, node: str, why: str | None, since: float | None = None) -> None:
        """Someone else (an operator, the scheduler) drained or downed ``node`` -- ``why`` -- or gave it
        back (``None``): capacity out of service, but never counted in ftd's drain budget. ``since``:
        when, where known (the ledger's drain); else now, the first time."""
        self._trouble(node, "unavailable", why is not None, since)
        if why is None:
            self.unavailable.pop(node, None)
        else:
            self.unavailable[node] = why

    def _trouble(self, node: str, facet: str, on: bool, since: float | None, keep: bool = False) -> None:
        """Note when one of a node's problems began (``on``) or forget it (over). A known ``since``
        replaces the first-seen time unless ``keep`` (a condition set republished on each change)."""
        facets = self.trouble_since.get(node)
        if not on:
            if facets is not None:
                facets.pop(facet, None)
                if not facets:
                    del self.trouble_since[node]
            return
        facets = self.trouble_since.setdefault(node, {})
        if facet not in facets:
            facets[facet] = since or time.time()
        elif since and not keep:
            facets[facet] = since

    def problem_since(self, node: str) -> float | None:
        """When the node's current problem began: the earliest of its problems still on (offline since
        its last status change, drained, unavailable, a condition); None when it has none."""
        times = list(self.trouble_since.get(node, {}).values())
        record = self.nodes.get(node)
        if record is not None and not record.online and record.last_change:
            times.append(record.last_change)
        return min(times) if times else None

    def note_restart(self, job: str, ts: float) -> None:
        """ftd restarted ``job`` at ``ts`` (its requeue returned): a fault of the job after this is
        a new occurrence of its problem, not part of the incident that caused the restart."""
        times = self.restarts.setdefault(job, deque(maxlen=HISTORY_LIMIT))
        if ts not in times:
            times.append(ts)
            if len(times) > 1 and times[-2] > ts:  # restored out of order (the ledger, at start-up)
                self.restarts[job] = deque(sorted(times), maxlen=HISTORY_LIMIT)

    def refresh_drift(self) -> list[DriftChange]:
        """Judge the inventories reported since the last pass (:class:`InventoryBook`); each node's
        record names its drifting fields (``NodeRecord.drift``, what rules read)."""
        changes = self.inventory.refresh()
        for change in changes:
            record = self.nodes.get(change.node)
            if record is not None:
                record.drift = change.report.fields
        return changes

    def drained_nodes(self) -> dict[str, str]:
        """The nodes ftd drained, with their reasons."""
        return {n.name: n.drain_reason for n in self.nodes.values() if n.drained_by_ftd}

    def _note_save_time(self, event: Event) -> None:
        """A verified tier checkpoint's ``save_s`` feeds the job's save-time model (issue #37 item 2)."""
        data = event.data
        job, level, step, save_s = data.get("job"), data.get("level"), data.get("step"), data.get("save_s")
        if data.get("ok") is not True or data.get("deleted") or not isinstance(job, str):
            return
        if not isinstance(level, str) or not isinstance(step, int) or isinstance(step, bool):
            return
        if isinstance(save_s, int | float) and not isinstance(save_s, bool):
            self.save_times.record_checkpoint(job, level, step, float(save_s))

    def apply_event(self, event: Event) -> None:
        """Fold an event into the history (called by the engine after the rules decided on it)."""
        self._node(event.node)
        if event.kind == Kind.CHECKPOINT:
            self.checkpoints.note(event)
            self._note_save_time(event)
        elif event.kind == Kind.INVENTORY:
            self.inventory.note(event.node, event.data, event.ts)
        elif event.kind == Kind.PAIR_TEST:
            self.pairs.note(event)
        uuid = event.data.get("uuid")
        gpu: GpuRecord | None = None
        if isinstance(uuid, str) and uuid:
            gpu = self.gpus.get(uuid)
            if gpu is None:
                gpu = self.gpus[uuid] = GpuRecord(uuid=uuid, node=event.node)
            gpu.node = event.node
            if not gpu.nodes_seen or gpu.nodes_seen[-1] != event.node:
                gpu.nodes_seen.append(event.node)
            pci = event.data.get("pci")
            if isinstance(pci, str) and pci:
                gpu.pci = pci
        # The jobs on the node, for an event naming none (info links nothing): one record built once.
        job = event.data.get("job")
        names_job = isinstance(job, str | int) and not isinstance(job, bool) and job != ""
        linked = not names_job and event.severity.rank >= _WARNING_RANK
        fields = record_fields(event, tuple(self.jobs_on_node(event.node)) if linked else ())
        recent = self.recent.get(event.node)
        if recent is None:  # (setdefault would build a deque on every call)
            recent = self.recent[event.node] = deque(maxlen=HISTORY_LIMIT)
            self._recent_data[event.node] = deque(maxlen=HISTORY_LIMIT)
        recent.append(fields)
        self._recent_data[event.node].append(event.data)
        peer = event.data.get("peer_address")
        if isinstance(peer, str) and peer:
            self._note_peer_blame(event, peer)
        fault = as_record(fields, event.data)
        self.filesystems.note(fault)  # the save path: which filesystems are in trouble where (#23)
        if event.severity.rank < Severity.ERROR.rank:
            return
        history = self.history.get(event.node)
        if history is None:
            history = self.history[event.node] = deque(maxlen=HISTORY_LIMIT)
        history.append(fault)
        if gpu is not None:
            gpu.faults.append(fault)

    # --- ClusterView -------------------------------------------------------------------------

    def node(self, name: str) -> NodeRecord | None:
        return self.nodes.get(name)

    def jobs_on_node(self, node: str) -> list[str]:
        """The jobs training on ``node`` (a job's hot spare or swapped-out node without ranks is not
        one of them: see :attr:`JobRecord.nodes`)."""
        return sorted(j.id for j in self.jobs.values() if j.trains_on(node))

    def job_nodes(self, job: str) -> list[str]:
        record = self.jobs.get(job)
        return record.nodes if record else []

    def online_nodes(self) -> list[str]:
        return sorted(n.name for n in self.nodes.values() if n.online)

    def node_names(self) -> list[str]:
        """Every node known (online or not): the cluster size the drain budget is a fraction of."""
        return list(self.nodes)

    def node_count(self) -> int:
        return len(self.nodes)

    def drained_by_ftd(self) -> frozenset[str]:
        """The nodes ftd drained (as :meth:`mark_drained` left them)."""
        return frozenset(self._drained_by_ftd)

    def gpu(self, uuid: str) -> GpuRecord | None:
        return self.gpus.get(uuid)

    def node_history(self, node: str) -> Sequence[FaultRecord]:
        return tuple(self.history.get(node, ()))

    def node_events(self, node: str) -> Sequence[FaultRecord]:
        recent = self.recent.get(node)
        return tuple(map(as_record, recent, self._recent_data[node])) if recent is not None else ()

    def job_restarts(self, job: str) -> Sequence[float]:
        return tuple(self.restarts.get(job, ()))

    def filesystem_troubles(self) -> Mapping[str, Mapping[str, FaultRecord]]:
        return self.filesystems.open
