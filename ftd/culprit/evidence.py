"""The shapes of hang evidence and of the verdict: the contract between the agent and the coordinator.

An agent answers a ``collect_hang_evidence`` directive with one :class:`NodeEvidence` (in its
node-level :class:`~ftd.events.Ack`'s ``data["evidence"]``, encoded with :func:`msgspec.to_builtins`);
the coordinator gathers every node's into one :class:`JobEvidence` and draws a :class:`Verdict`
from them. Every piece of evidence says where it came from (``source``), and
what could not be collected is itself evidence: a rank or node that did not answer is named, never
dropped.

Sizes are bounded where the agent builds these (:data:`MAX_FRAMES`, :data:`MAX_THREADS`,
:data:`MAX_FLIGHT_ENTRIES`): a stack of 100,000 frames is cut, and the cut is said in ``errors``.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from ftd.culprit.ras import RasProcess

MAX_THREADS = 64  # threads kept per rank (the main thread first)
MAX_FRAMES = 256  # frames kept per thread (innermost first; the cut drops the outermost)
MAX_FLIGHT_ENTRIES = 512  # flight-recorder entries kept per rank (the newest)
MAX_FLIGHT_PGS = 64  # process groups kept per rank in a flight record's pg_status
MAX_TEXT = 512  # characters kept of any one string (a function name, a file, an error)

ProcessState = Literal["running", "sleeping", "disk", "stopped", "zombie", "gone", "unknown"]
"""A rank's process as /proc/PID/stat says: R, S, D, T/t, Z; ``gone`` when there is no such pid."""


class Frame(msgspec.Struct, frozen=True, kw_only=True):
    function: str
    file: str = ""
    line: int | None = None
    native: bool = False  # a C/C++ frame (py-spy --native), not a Python one


class ThreadStack(msgspec.Struct, frozen=True, kw_only=True):
    thread: str  # py-spy's thread id or name, as it printed it
    frames: list[Frame]  # innermost first
    main: bool = False  # the process's main thread (where a training loop runs)
    idle: bool | None = None  # py-spy's own idle marker, when it gave one


class FlightEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One collective of PyTorch's flight recorder, as a rank saw it."""

    seq: int  # collective_seq_id: the n-th collective this rank issued in its process group
    pg: str = ""  # the process group's name or id
    op: str = ""  # profiling_name, e.g. "gloo:all_reduce" / "nccl:all_reduce"
    state: str = ""  # "scheduled", "started" or "completed"


class FlightPgStatus(msgspec.Struct, frozen=True, kw_only=True):
    """The flight recorder's own summary of one process group on one rank (its ``pg_status``): the
    last collective seq this rank enqueued, started and completed there (None: none, or not tracked --
    gloo reports no "started")."""

    last_enqueued: int | None = None
    last_started: int | None = None
    last_completed: int | None = None


class FlightRecord(msgspec.Struct, frozen=True, kw_only=True):
    entries: list[FlightEntry]  # oldest first, at most MAX_FLIGHT_ENTRIES (the newest kept)
    version: str = ""  # the dump's own version field
    pg_status: dict[str, FlightPgStatus] = msgspec.field(default_factory=dict)  # pg id -> summary


class RankEvidence(msgspec.Struct, frozen=True, kw_only=True):
    rank: int
    node: str
    pid: int | None = None
    answered: bool = True  # False: the agent had no way to look at this rank (no pid, not registered)
    state: ProcessState = "unknown"
    last_step: int | None = None
    beat_age_s: float | None = None  # seconds since its last heartbeat, when collected
    stacks: list[ThreadStack] = msgspec.field(default_factory=list)
    flight: FlightRecord | None = None
    errors: dict[str, str] = msgspec.field(default_factory=dict)  # source -> why it is missing or cut
    files: list[str] = msgspec.field(default_factory=list)  # raw files kept on the node (dumps, logs)


class RasStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What NCCL RAS (localhost:28028) said, where it answered."""

    answered: bool
    missing_ranks: list[int] = msgspec.field(default_factory=list)
    # the processes its Errors section names (missing, dead), read from the whole answer on the node
    missing: list[RasProcess] = msgspec.field(default_factory=list)
    text: str = ""  # the first MAX_TEXT characters of its answer
    error: str = ""


class NodeEvidence(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    job: str
    ranks: list[RankEvidence]
    ras: RasStatus | None = None
    collected_s: float = 0.0  # how long the collection took on the node
    path: str = ""  # the directory on the node holding the raw files
    errors: dict[str, str] = msgspec.field(default_factory=dict)


class PeerBlame(msgspec.Struct, frozen=True, kw_only=True):
    """An error printed by one rank that names another by address ("Connect to ADDR failed")."""

    address: str
    reporter_node: str
    reporter_rank: int | None = None
    node: str | None = None  # the node that owns the address, when resolved
    rank: int | None = None
    line: str = ""  # the first MAX_TEXT characters of the log line


class JobEvidence(msgspec.Struct, frozen=True, kw_only=True):
    job: str
    expected: dict[str, list[int]]  # node -> the job's ranks the coordinator knows there
    nodes: dict[str, NodeEvidence]  # the nodes that answered
    unanswered_nodes: list[str] = msgspec.field(default_factory=list)
    peer_blames: list[PeerBlame] = msgspec.field(default_factory=list)
    trigger: str = ""  # what started the collection (an event kind and its subject)


VerdictKind = Literal["culprit", "job_wide", "unknown"]


class EvidenceItem(msgspec.Struct, frozen=True, kw_only=True):
    source: str  # "process_state", "stacks", "flight_recorder", "ras", "heartbeat", "peer_error", ...
    says: str  # one sentence
    node: str | None = None
    rank: int | None = None
    against: bool = True  # evidence against this node/rank (False: evidence that clears it)


class TreeNode(msgspec.Struct, frozen=True, kw_only=True):
    """One node of the merged stack tree: a frame label and the ranks whose stacks pass through it."""

    label: str
    ranks: list[int]
    children: list[TreeNode] = msgspec.field(default_factory=list)


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    job: str
    kind: VerdictKind
    confident: bool  # act on it (exclude a node) only when True
    why: str  # one sentence an operator reads first
    culprit_ranks: list[int] = msgspec.field(default_factory=list)
    culprit_nodes: list[str] = msgspec.field(default_factory=list)
    evidence: list[EvidenceItem] = msgspec.field(default_factory=list)
    unanswered: list[str] = msgspec.field(default_factory=list)  # "node-3", "node-2 rank 5"
    tree: TreeNode | None = None
    errors: list[str] = msgspec.field(default_factory=list)  # bad input met on the way, said plainly
