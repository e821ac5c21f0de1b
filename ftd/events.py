"""Wire types: everything that crosses the bus or the agent's local socket.

One envelope (:class:`Event`) carries every observation a node makes; directives, acknowledgements,
job presence and node status have their own small structs. All are frozen msgspec Structs encoded as
JSON: decoding is *strict about types* (a string where an int belongs is an error) and *tolerant of
unknown fields* (a newer agent may add fields an older coordinator ignores). ``schema`` is the
envelope version; a receiver rejects versions it does not know.

Kinds and severities are closed sets (:class:`Kind`, :class:`Severity`): a payload naming an unknown
kind is a decode error, counted and logged by the receiver, never fatal.
"""

from __future__ import annotations

import enum
import itertools
import os
import time
from typing import Any, Literal, TypeVar

import msgspec

SCHEMA_VERSION = 1


class Kind(enum.StrEnum):
    """Every event kind in the ledger. Adding one is a (compatible) schema change.

    Agents publish all but the last group; the coordinator writes some itself (``source =
    "coordinator"``): ``node_offline`` (a node's Last Will), ``agent_health`` about the coordinator's
    own trouble (node ``ftd-coordinator``, e.g. a corrupt ledger it moved aside) and ``bad_input``:
    one per node and window, what that node sent that the coordinator did not store as sent --
    messages it refused (oversized, undecodable, nested too deep, wrong types, speaking for another
    node; counted by reason, never stored) and events over the node's rate limit (folded: counted by
    kind, receipted, not evaluated one by one). See :mod:`ftd.coordinator.intake.fairness`. ``security``: one
    per node and window, severity error, what that node's valid credentials tried that its authority
    does not cover (``placement_violation``: presence, heartbeats or acks for a job the scheduler does
    not run on that node; counted, never stored verbatim). See :mod:`ftd.coordinator.intake.placement`.
    """

    XID = "xid"
    SXID = "sxid"
    GPU_FALLEN_OFF_BUS = "gpu_fallen_off_bus"
    GPU_HEALTH = "gpu_health"
    ECC = "ecc"
    ROW_REMAP = "row_remap"
    THERMAL = "thermal"
    GPU_MISSING = "gpu_missing"
    PCIE_AER = "pcie_aer"
    OOM_KILL = "oom_kill"
    HUNG_TASK = "hung_task"
    IB_LINK = "ib_link"
    LOG_PATTERN = "log_pattern"
    # Host signals the kernel log and sysfs show (#23): data fields documented in docs/signals.md.
    STORAGE = "storage"  # NVMe timeout/reset/no path, md disk failure, block/buffer I/O, superblock
    FS_READONLY = "fs_readonly"  # a filesystem remounted read-only (ext4, XFS, btrfs)
    NETFS = "netfs"  # NFS / Lustre client: server not responding, recovered, evicted, lock reclaim
    NIC = "nic"  # mlx5 / EFA device errors (command timeout, ACCESS_REG, health poll, slot power)
    GPUDIRECT = "gpudirect"  # nvidia-peermem errors
    NVLINK = "nvlink"  # NVLink link-mask / post-RX-detect failures
    MACHINE_CHECK = "machine_check"  # MCE hardware errors
    SOFT_LOCKUP = "soft_lockup"  # watchdog soft lockup (hung tasks stay hung_task)
    KERNEL_OOPS = "kernel_oops"  # kernel BUG / oops / NULL dereference / panic
    SEGFAULT = "segfault"  # a process segfault (library: libnccl.so, libcuda.so, ...)
    RESOURCE_LIMIT = "resource_limit"  # nf_conntrack table full, VFS file-max reached
    LOG_STALE = "log_stale"
    FS_FILL = "fs_fill"
    MEM_PRESSURE = "mem_pressure"
    RANK_HEARTBEAT_LOST = "rank_heartbeat_lost"
    RANK_STRAGGLER = "rank_straggler"
    RANK_SLOW = "rank_slow"  # a rank's step time changed for good against its job's history (#33)
    HANG_VERDICT = "hang_verdict"  # the coordinator's verdict on a hang: culprit, job-wide, unknown (#33)
    CHECKPOINT = "checkpoint"  # a rank's checkpoint, verified or rejected against its manifest (#34)
    AGENT_HEALTH = "agent_health"
    JOB_LEFTOVER = "job_leftover"  # a job's processes still alive after its end (Slurm Epilog)
    NODE_OFFLINE = "node_offline"
    # A job's rank supervisor (``ftd run``, issue #24) on this node: its connection to the agent was
    # lost without a goodbye (killed, crashed), or it could not start its ranks (preflight failed, the
    # command would not start). data: job, state (lost | failed), role, slot, generation, reason.
    SUPERVISOR = "supervisor"
    # An announced interruption with a deadline (issue #37): a preemption, a time limit, maintenance, a
    # cloud's spot/preemption notice, a pod's deletion, an operator's announcement. data: the fields of
    # :class:`Interruption` (``msgspec.structs.asdict``); the coordinator's own sources publish it too.
    INTERRUPTION = "interruption"
    # Fabric health (issue #35). ``fabric``: a port's, a NIC's or an NVLink's counter rate over its
    # threshold, or a port running below its profile's rate or width; ``pcie_link``: a GPU or NIC whose
    # PCIe link trained below its capability; ``pair_test``: an active test's result between two nodes.
    FABRIC = "fabric"
    PCIE_LINK = "pcie_link"
    PAIR_TEST = "pair_test"
    # Platform truth (issue #36). ``inventory``: what a node runs (versions), at start and on change;
    # ``platform``: a job or node whose communication path is the slow one (NCCL over sockets, no
    # peermem, small memlock or /dev/shm, ACS on, rendezvous port unreachable); ``burn_in``: a burn-in's
    # report; ``rma_bundle``: a diagnostic bundle collected for a node drained for repair.
    INVENTORY = "inventory"
    PLATFORM = "platform"
    BURN_IN = "burn_in"
    RMA_BUNDLE = "rma_bundle"
    BAD_INPUT = "bad_input"
    SECURITY = "security"


class Severity(enum.StrEnum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]


_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.ERROR: 2, Severity.CRITICAL: 3}


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """The envelope of every observation. ``id`` is unique so receivers can drop QoS-1 duplicates."""

    schema: int = SCHEMA_VERSION
    id: str
    ts: float
    node: str
    kind: Kind
    severity: Severity
    source: str
    data: dict[str, Any] = msgspec.field(default_factory=dict)
    count: int = 1  # >1 when storm control collapsed identical events into this one


InterruptionSource = Literal[
    "slurm_preempt",  # the job is being preempted (PreemptTime set; GraceTime left)
    "slurm_time_limit",  # the job's EndTime (time limit) approaches
    "slurm_maintenance",  # a maintenance reservation overlaps the running job's nodes
    "slurm_signal",  # the job step got a user signal (sbatch --signal=SIG@t)
    "k8s_pod_deletion",  # the pod has a deletionTimestamp (+ deletionGracePeriodSeconds)
    "k8s_disruption",  # the pod has the DisruptionTarget condition (eviction, preemption, taint)
    "k8s_node_shutdown",  # the kubelet's graceful node shutdown
    "aws_spot",  # IMDS spot/instance-action (two-minute notice)
    "aws_rebalance",  # IMDS events/recommendations/rebalance (no deadline of its own)
    "gcp_preempt",  # metadata instance/preempted (30 s window)
    "gcp_maintenance",  # metadata instance/maintenance-event
    "azure_scheduled",  # Scheduled Events (Preempt, Reboot, Redeploy, Freeze, Terminate)
    "operator",  # an operator's announcement (ftd CLI / API)
]


class Interruption(msgspec.Struct, frozen=True, kw_only=True):
    """An announced interruption (issue #37): what ends, by when, and who said so. Carried as the
    ``data`` of a :attr:`Kind.INTERRUPTION` event; one struct for every source so the decision
    against the deadline has one input.

    ``deadline`` is the wall-clock time (epoch seconds) after which the work is killed (SIGKILL, the
    instance gone), not when the first signal comes; ``notice_at`` is when the source announced it.
    ``job`` is set where the interruption concerns one job (a preemption, a time limit, a pod), empty
    where it concerns the node and whatever runs there (maintenance, a cloud notice, an operator's
    announcement). ``ref`` is the source's own id for it (event id, reservation name, pod uid), so the
    same notice seen again is one interruption, not two."""

    source: InterruptionSource
    deadline: float
    notice_at: float
    job: str = ""
    ref: str = ""
    detail: str = ""


DirectiveAction = Literal[
    "save",
    "stop",
    "resume",
    "gpu_reset",
    "collect_diagnostics",
    "collect_hang_evidence",
    "preflight",
    "restart",
    "release",
    "partners",
    "burn_in",
    "rma_bundle",
    "pair_test",
]
"""``restart`` (issue #24) goes to a job's rank supervisors (``ftd run``), never to its ranks: start
generation ``params["generation"]`` with node slots ``params["slots"]`` (see :class:`SupervisorInfo`).
``release`` goes to the supervisors of a job whose training ended: one holding no slot (a spare, a
node swapped out) exits 0, so the job step or the Kubernetes Job can complete. ``partners`` (issue
#34) carries the coordinator's checkpoint partner node for each node of a job
(``params["partners"]``); the agent hands it to the job's ranks as the trainer protocol's
``partners`` op. ``burn_in`` and ``rma_bundle`` (issue #36) go to a node's agent: run the burn-in,
collect the repair bundle (:mod:`ftd.agent.node_actions`). ``pair_test`` (issue #35) asks a node's
agent to run one pair test against another agent (``params``: ``peer``, ``host``, ``port``, optional
``max_bytes`` and ``timeout_s``); the agent records the result as a ``pair_test`` event and answers
with it
(docs/pair-tests.md)."""


class Directive(msgspec.Struct, frozen=True, kw_only=True):
    """Coordinator -> agent(s) -> trainers. Sent on a job's or a node's directive topic."""

    schema: int = SCHEMA_VERSION
    id: str
    ts: float
    action: DirectiveAction
    job: str | None = None
    node: str | None = None
    reason: str = ""
    deadline_s: float | None = None
    action_id: str | None = None  # the coordinator action this directive belongs to
    params: dict[str, Any] = msgspec.field(default_factory=dict)


NODE_RANK = -1  # the ``rank`` of a node-level answer (an agent's, to gpu_reset or collect_diagnostics)


class Ack(msgspec.Struct, frozen=True, kw_only=True):
    """A trainer rank's answer to a directive (saved, or could not), relayed by its node's agent; or,
    with ``rank = NODE_RANK``, the agent's own answer to a node directive."""

    schema: int = SCHEMA_VERSION
    directive_id: str
    job: str
    rank: int
    node: str
    ok: bool = True
    step: int | None = None
    path: str | None = None
    reason: str = ""
    ts: float = 0.0
    files: list[str] = msgspec.field(default_factory=list)  # names of files stored under ``path``
    # A node-level answer's structured result (collect_hang_evidence: {"evidence": NodeEvidence}).
    data: dict[str, Any] = msgspec.field(default_factory=dict)


class StepTiming(msgspec.Struct, frozen=True, kw_only=True):
    """A rank's step timing counters as its client measured them (issue #33), cumulative since the
    client started, so a lost or throttled report loses nothing: the coordinator takes differences.
    ``steps``: steps timed; ``step_s``: their total duration; ``compute_s``: of that, the total time
    before the step's first collective (the rank's own work), only where the training code marks its
    collectives (the torch helper's DDP hook); None: not measured."""

    steps: int = 0
    step_s: float = 0.0
    compute_s: float | None = None


class RankInfo(msgspec.Struct, frozen=True, kw_only=True):
    rank: int
    local_rank: int | None = None
    pid: int | None = None
    step: int | None = None
    last_beat: float | None = None
    # The run of the job the rank's process belongs to, as its client said at registration (a Slurm
    # restart count, a pod's uid: ftd.client.protocol.run_id); None: not known (an older client).
    run: str | None = None
    # Where the rank saves its checkpoints, and where it can save when that filesystem cannot take a
    # save, as its client registered them (issue #23); None: not declared (an older client).
    checkpoint_dir: str | None = None
    fallback_checkpoint_dir: str | None = None
    timing: StepTiming | None = None  # step timing counters (issue #33); None: an older client


SupervisorRole = Literal["active", "spare", "out"]
SupervisorState = Literal["idle", "starting", "running", "stopped", "exited", "failed", "lost"]


class SupervisorInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A job's rank supervisor on one node (``ftd run``, issue #24), as its agent reports it in the
    job's presence: which slot of the job's ``nodes`` training slots this node holds in which
    generation, or that it is a hot spare.

    ``role``: ``active`` (holds ``slot``, 0 <= slot < ``nodes``), ``spare`` (idle, ready to take a
    slot), ``out`` (the job no longer uses this node: it failed or was swapped out). ``generation``:
    the generation its ranks run, or ran last (0: the first; a restart inside the allocation starts
    ``generation + 1`` on every slot with a fresh rendezvous, so a rank of an older generation can
    never join). ``state``: ``idle`` (a spare, or waiting for a generation), ``starting``, ``running``
    (its ranks are up), ``stopped`` (its ranks were stopped, waiting for the next generation),
    ``exited`` (its ranks ended on their own; ``exit_code``), ``failed`` (it could not start them:
    ``reason``), ``lost`` (set by the agent: the supervisor's connection closed without a goodbye).
    ``preflight``: the last preflight on this node (``ok``, ``failed``; None: not run) -- a spare is
    used only after a passing one. ``addr``: the address the other nodes reach this node's ranks at
    (``MASTER_ADDR`` when it holds slot 0). ``warm``: a pre-started interpreter with the training
    imports loaded is waiting for the next generation. ``run``: the launcher's run the supervisor
    belongs to (:func:`ftd.client.protocol.run_id` of its environment: ``slurm-restart-N`` counts a
    scheduler requeue up); its ranks' run is ``<run>.gen-<g>``
    (:func:`ftd.client.protocol.generation_run`)."""

    role: SupervisorRole = "active"
    slot: int | None = None
    generation: int = 0
    state: SupervisorState = "idle"
    nodes: int = 1  # training slots (nodes) of the job; the allocation holds nodes + spares
    nproc: int = 1  # ranks per node
    addr: str = ""
    preflight: str | None = None
    reason: str = ""
    exit_code: int | None = None
    warm: bool = False
    pid: int | None = None
    ts: float = 0.0
    run: str = ""  # the supervisor's own run (slurm-restart-N, pod-<uid>; "": unknown): see generation_run


class JobAllocation(msgspec.Struct, frozen=True, kw_only=True):
    """What the scheduler's own hook (Slurm Prolog) told the node's agent about a job starting there:
    known whether or not the job's processes use ``ftd.client`` (see :mod:`ftd.agent.jobs`)."""

    source: str = "prolog"
    user: str = ""
    uid: int | None = None
    gpus: list[str] = msgspec.field(default_factory=list)  # indexes (SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES)
    tasks: int | None = None  # tasks (ranks) of the job on this node, when the scheduler says
    partition: str = ""
    started: float = 0.0


class JobPresence(msgspec.Struct, frozen=True, kw_only=True):
    """Retained per (node, job): which ranks of a job run on a node. An empty payload clears it.

    ``allocation`` (None when no scheduler hook reported the job) says the job runs on the node even
    with no rank registered (a job without the client)."""

    schema: int = SCHEMA_VERSION
    job: str
    node: str
    ranks: list[RankInfo] = msgspec.field(default_factory=list)
    ts: float = 0.0
    allocation: JobAllocation | None = None
    supervisor: SupervisorInfo | None = None  # the job's rank supervisor here (``ftd run``), if any


class NodeConditions(msgspec.Struct, frozen=True, kw_only=True):
    """Retained per node on ``ftd/v1/nodes/{node}/conditions/ftd``: the reasons of the node's active
    critical conditions as its agent keeps them (:mod:`ftd.agent.conditions`; what ``ftd health``
    reports). Empty list: none. Published on change."""

    schema: int = SCHEMA_VERSION
    node: str
    ts: float = 0.0
    conditions: list[str] = msgspec.field(default_factory=list)
    #: The event kind of each condition, in the order of ``conditions`` (older agents send none).
    kinds: list[str] = msgspec.field(default_factory=list)


NodeState = Literal["online", "offline", "stopped"]
"""``online``: the agent's birth message; ``offline``: its Last Will (the agent, the node or its network
died); ``stopped``: the agent stopped cleanly and said so (a restart, an upgrade)."""


class NodeStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Retained node status; the MQTT Last Will publishes ``offline`` when the agent dies, a clean stop
    publishes ``stopped`` (the coordinator gives each its own grace to come back).

    ``rack_broker``: the rack broker the agent is connected to in a bridged broker tier (its
    ``[bus] rack_broker``; empty: the core broker itself). When that rack's bridge goes down the
    coordinator treats the node as gone (``ftd.coordinator.intake.rack_bridges``); a node naming the
    wrong rack only mislabels itself.

    ``addresses``: the node's IP addresses and host names (issue #33), so that the coordinator can
    resolve a peer another rank's communication error names by address ("Connection closed by peer
    [10.0.0.2]") to this node; empty in the Last Will and from older agents."""

    schema: int = SCHEMA_VERSION
    node: str
    state: NodeState
    ts: float = 0.0
    agent_version: str = ""
    rack_broker: str = ""
    addresses: list[str] = msgspec.field(default_factory=list)


class CoordinatorStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Retained coordinator status; its Last Will publishes ``offline``. ``online`` is published only
    once the coordinator is subscribed and ready, so a publisher that sees it knows it is heard."""

    schema: int = SCHEMA_VERSION
    state: NodeState
    ts: float = 0.0
    version: str = ""


class Receipt(msgspec.Struct, frozen=True, kw_only=True):
    """The coordinator's end-to-end receipt to one node (``ftd/v1/nodes/{node}/receipts``).

    ``ids``: events the coordinator has committed to its ledger (or had already: duplicates are
    receipted again, since the first receipt may have been lost). ``rejected``: events it will never
    accept (wrong node in the payload, over the limits), with the reason; the agent stops resending
    them and logs why. An agent deletes a spooled event only on a receipt, never on a broker PUBACK."""

    schema: int = SCHEMA_VERSION
    node: str
    ts: float = 0.0
    ids: list[str] = msgspec.field(default_factory=list)
    rejected: dict[str, str] = msgspec.field(default_factory=dict)


class DecodeError(ValueError):
    """A payload that is not valid for its type. Receivers count and log it, then move on."""


#: Limits on what a receiver decodes: larger or deeper input is rejected before it can cost memory,
#: time or the interpreter's stack (one node's credentials must not be able to crash a daemon).
MAX_PAYLOAD_BYTES = 256 << 10
MAX_DATA_DEPTH = 16


def nesting_depth(value: Any, limit: int) -> int:
    """How deeply ``value`` nests dicts/lists, counted up to ``limit + 1`` (iterative: no recursion)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((child, depth) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


_FLAT = frozenset({str, int, float, bool, type(None)})  # JSON values that nest nothing
_T = TypeVar("_T")
_encoder = msgspec.json.Encoder()
_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def encode(obj: msgspec.Struct) -> bytes:
    return _encoder.encode(obj)


def decode(payload: bytes | str, type_: type[_T], *, max_bytes: int = MAX_PAYLOAD_BYTES) -> _T:
    """Decode ``payload`` as ``type_``; raise :class:`DecodeError` with a readable reason.

    Whatever the input, the only exception is :class:`DecodeError`: over ``max_bytes``, nested
    deeper than the decoder's stack allows, or an event whose ``data`` nests deeper than
    :data:`MAX_DATA_DEPTH`, included."""
    if len(payload) > max_bytes:
        raise DecodeError(f"payload of {len(payload)} bytes is over the limit of {max_bytes}")
    decoder = _decoders.get(type_)
    if decoder is None:
        decoder = _decoders[type_] = msgspec.json.Decoder(type_)
    try:
        obj: _T = decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise DecodeError(str(exc)) from None
    except (RecursionError, MemoryError, UnicodeError, OverflowError) as exc:
        raise DecodeError(f"undecodable payload: {type(exc).__name__}") from None
    for item in obj if isinstance(obj, list) else (obj,):
        data = getattr(item, "data", None)
        if (
            isinstance(data, dict)
            and not all(type(v) in _FLAT for v in data.values())  # the usual flat data: nothing to walk
            and nesting_depth(data, MAX_DATA_DEPTH) > MAX_DATA_DEPTH
        ):
            raise DecodeError(f"event data nests deeper than {MAX_DATA_DEPTH} levels")
    schema = getattr(obj, "schema", SCHEMA_VERSION)
    if schema != SCHEMA_VERSION:
        raise DecodeError(f"unsupported schema version {schema} (this ftd speaks {SCHEMA_VERSION})")
    return obj


def to_builtins(obj: msgspec.Struct) -> dict[str, Any]:
    result: dict[str, Any] = msgspec.to_builtins(obj)
    return result


# --- identifiers -------------------------------------------------------------------------------

_seq = itertools.count()
_boot = f"{os.getpid():x}{time.time_ns() & 0xFFFFFF:06x}"


def new_id(prefix: str) -> str:
    """A unique, roughly time-ordered id: ``{prefix}-{ms since epoch}-{process tag}-{seq}``.

    ``prefix`` is normally the node name, so ids from different nodes can never collide, and the
    process tag keeps ids unique across restarts of the same agent.
    """
    return f"{prefix}-{time.time_ns() // 1_000_000:x}-{_boot}-{next(_seq):x}"


def make_event(
    node: str,
    kind: Kind | str,
    *,
    severity: Severity | str = Severity.WARNING,
    source: str = "test",
    data: dict[str, Any] | None = None,
    ts: float | None = None,
    count: int = 1,
    id: str | None = None,
) -> Event:
    """Build a well-formed event (used by watchers, the simulator and rule authors' tests)."""
    return Event(
        id=id or new_id(node),
        ts=time.time() if ts is None else ts,
        node=node,
        kind=Kind(kind),
        severity=Severity(severity),
        source=source,
        data=dict(data or {}),
        count=count,
    )
