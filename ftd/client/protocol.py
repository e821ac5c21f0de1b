"""The local protocol between a trainer rank and its node's agent, written down once.

Why here: both ends speak it, and the client must stay standard-library only, so the protocol lives
in the client package and the agent (:mod:`ftd.agent.local_api`) imports it, never the other way
round. This module holds what both ends must agree on: the version, the default socket path, the
operation names, the message shapes with their field order, the limits, and line encoding.
Validation of what a client sends is the agent's job (it decodes into typed structs built from the
names and limits here). Imports ``json`` only, and no ``typing`` or ``dataclasses`` at run time:
it is loaded inside every training process (the message shapes are ``TypedDict`` for type checkers).

Protocol (version 1)
--------------------
One persistent connection per rank over a ``SOCK_STREAM`` unix socket (:data:`DEFAULT_SOCKET`
unless configured). Every message, in both directions, is one JSON object on one line (UTF-8,
terminated by ``\\n``, at most :data:`MAX_LINE` bytes from client to agent). Each carries ``"v"``
(protocol version; the agent answers an error for a version it does not speak; a client may omit
it, meaning 1) and ``"op"``.

Client -> agent:

- ``{"v":1,"op":"register","job":"1234","rank":3,"local_rank":3,"pid":4242,"run":"slurm-restart-0",
  "startup_timeout_s":null}``. Must come first.
  ``job`` is 1..256 characters without ``/ + #``, whitespace or NUL (it becomes part of MQTT
  topics); ``rank`` >= 0. ``run`` (optional, 1..:data:`RUN_MAX` characters; null or absent: not
  known) names the run of the job this process belongs to: a job restarted in place (Slurm requeue,
  a recreated pod) keeps its id but gets a new run, and a directive meant for one run never reaches
  another (see :func:`run_id`). ``startup_timeout_s`` (optional, > 0, at most
  :data:`STARTUP_TIMEOUT_MAX_S`) is how long this rank may take to its first heartbeat before the
  agent calls it lost (null: the agent's ``agent.heartbeat.startup_timeout_s``).
  ``checkpoint_dir`` and ``fallback_checkpoint_dir`` (optional absolute paths, at most
  :data:`PATH_MAX` characters; null or absent: not declared) say where the rank saves and where it
  can save when that filesystem is read-only, full or unresponsive: ftd never asks a save onto a
  filesystem that cannot take it (it asks for the fallback, ``params["save_path"]``, or stops the
  job without a save). Answer:
  ``{"v":1,"op":"ok","re":"register"}`` then every directive
  still pending for that job, or ``{"v":1,"op":"error","re":"register","error":...}``.
- ``{"v":1,"op":"heartbeat","step":1200}`` (``step`` may be null). No answer. The client sends
  one only when the training loop has called ``heartbeat()`` since the last one, so a hung loop
  goes silent at the agent. Once a step was timed it adds ``"timing":{"steps":1180,"step_s":354.2,
  "compute_s":301.7}`` (issue #33, :mod:`ftd.client.timing`): cumulative counters of the steps timed,
  their total duration and, of that, the time before each step's first collective (null where the
  training code marks no collective). The agent puts the latest in the rank's presence.
- ``{"v":1,"op":"ack","directive_id":"...","ok":true,"step":1200,"path":"/ckpt/1200","reason":""}``.
  No answer.
- ``{"v":1,"op":"checkpoint","step":1200,"manifest":"/local/ckpt/step-000001200/rank-00003.manifest.json",
  "level":"local","save_s":0.42,"bytes":104857600,"directive_id":null}`` (issue #34): the rank wrote a
  checkpoint, asked for or not, and this is its manifest (:mod:`ftd.client.manifest`; absolute path,
  at most :data:`PATH_MAX` characters). ``level`` is one of ``local``, ``partner``, ``shared``;
  ``save_s`` (how long the save took, or null) and ``bytes`` (or null) are what the rank measured;
  ``directive_id`` names the save directive it answers, when one asked for it. The agent verifies
  the manifest's files off its event loop and reports the result as a ``checkpoint`` event. No answer.

Node hooks -> agent (no ``register``; one request, one answer, then the hook closes the connection):

- ``{"v":1,"op":"job_start","job":"1234","user":"alice","uid":1000,"gpus":["0","1"],"tasks":2,
  "partition":"gpu"}`` from the scheduler's Prolog: the job runs on this node now, with or without
  the client. Only root or the agent's own uid may send it (slurmd runs the Prolog as root).
  Answer ``ok`` (``re`` = ``job_start``).
- ``{"v":1,"op":"job_end","job":"1234","leftover":[{"pid":77,"name":"python","gpu":"0"}]}`` from the
  Epilog: the job ended here; ``leftover`` lists its processes still alive (the "Kill task failed"
  case), reported as a ``job_leftover`` event. Same rights. Answer ``ok``.
- ``{"v":1,"op":"conditions"}`` from ``ftd health``: answer ``{"v":1,"op":"conditions","node":...,
  "conditions":[{"key":...,"kind":...,"reason":...,"since":...}]}``, the node's active critical
  conditions (:mod:`ftd.agent.conditions`).
- ``{"v":1,"op":"preflight"}`` (root or the agent's uid) asks the agent to run its preflight checks
  now; answer ``{"v":1,"op":"preflight","ok":...,"reason":...,"checks":[...]}``.

Agent -> registered rank, a request the rank answers (issue #33):

- ``{"v":1,"op":"dump_flight","id":"f-12"}``: answer ``{"v":1,"op":"flight","re":"f-12",
  "path":"/tmp/ftd-flight-x.json"|null,"error":""}``, the file this process's flight recorder was
  dumped to as JSON (:mod:`ftd.client.flight`; mode 0600, read and removed by the agent), or why not.

Rank supervisor (``ftd run``, :mod:`ftd.supervisor`, issue #24) -> agent, on a connection of its own:

- ``{"v":1,"op":"supervise","job":"1234","pid":4242,"info":{<SupervisorInfo fields: role, slot,
  generation, state, nodes, nproc, addr, preflight, reason, exit_code, warm, pid, ts>}}``. Must come
  first. Same rights as a ``register`` (the process must belong to job ``job``). Answer
  ``{"v":1,"op":"ok","re":"supervise","node":<the agent's node name>}`` then every directive still
  pending for the job that a supervisor takes (``restart``, ``stop``). One supervisor per job per
  node: a second ``supervise`` for the job replaces the first (its connection is no longer heard).
- ``{"v":1,"op":"supervisor_state","info":{...}}`` whenever its state changes: the agent puts it in
  the job's retained presence at once (not throttled like steps). ``state: "exited"`` followed by
  closing the connection is a clean goodbye (the supervisor leaves the presence). A connection that
  closes without one: the agent marks the supervisor ``lost`` and reports a ``supervisor`` event; a
  ``failed`` state is reported the same way (with its ``reason``).
- Agent -> supervisor: ``{"v":1,"op":"directive", ...}`` for the job's ``restart`` and ``stop``
  directives; ``restart`` never reaches a rank.

Agent -> client, pushed at any time:

- ``{"v":1,"op":"directive", <every Directive field: schema, id, ts, action, job, node, reason,
  deadline_s, action_id, params>}``.
  Params the client honours: a ``save`` with ``params["save_at_step"]`` (an int) asks for the
  checkpoint at the first step >= it, and with ``params["save_path"]`` (a string) in that directory
  instead of the usual one (``Client.save_path``); a ``stop`` with ``params["resume_step"]`` says
  which step the restarted job should resume from (``Client.resume_step``); ``params["run"]`` (a
  string) names the run of the job the directive is for: a client of another run ignores it (the
  agent does not send it to one either).
- ``{"v":1,"op":"error","re":<op or null>,"error":"..."}`` for a bad message: not JSON, not an
  object, unknown op, wrong field types, an op before ``register``, a line over :data:`MAX_LINE`.
  The connection stays open.

Unknown fields are ignored in both directions (a newer peer may add some).
"""

from __future__ import annotations

import json

TYPE_CHECKING = False  # not imported from typing: keeps `import ftd.client` light
if TYPE_CHECKING:
    from typing import Any, TypedDict

    class _RegisterDirs(TypedDict, total=False):
        checkpoint_dir: str  # sent only when declared
        fallback_checkpoint_dir: str

    class RegisterMsg(_RegisterDirs):
        v: int
        op: str
        job: str
        rank: int
        local_rank: int | None
        pid: int | None
        run: str | None
        startup_timeout_s: float | None

    class _HeartbeatTiming(TypedDict, total=False):
        timing: dict[str, Any]  # sent only once a step was timed

    class HeartbeatMsg(_HeartbeatTiming):
        v: int
        op: str
        step: int | None

    class AckMsg(TypedDict):
        v: int
        op: str
        directive_id: str
        ok: bool
        step: int | None
        path: str | None
        reason: str

    class CheckpointMsg(TypedDict):
        v: int
        op: str
        step: int
        manifest: str
        level: str
        save_s: float | None
        bytes: int | None
        directive_id: str | None

    class OkMsg(TypedDict):
        v: int
        op: str
        re: str

    class SuperviseMsg(TypedDict):
        v: int
        op: str
        job: str
        pid: int | None
        info: dict[str, Any]

    class SupervisorStateMsg(TypedDict):
        v: int
        op: str
        info: dict[str, Any]

    class ErrorMsg(TypedDict):
        v: int
        op: str
        re: str | None
        error: str


__all__ = [
    "ACK",
    "CHECKPOINT",
    "CONDITIONS",
    "DEFAULT_SOCKET",
    "DIRECTIVE",
    "DIRECTIVE_ID_MAX",
    "DUMP_FLIGHT",
    "ERROR",
    "FLIGHT",
    "HEARTBEAT",
    "JOB_END",
    "JOB_MAX",
    "JOB_PATTERN",
    "JOB_START",
    "MAX_LINE",
    "OK",
    "PARTNERS",
    "PATH_MAX",
    "PATH_PATTERN",
    "PREFLIGHT",
    "PROTOCOL_VERSION",
    "REGISTER",
    "RUN_MAX",
    "RUN_PARAM",
    "SAVE_PATH_PARAM",
    "SOCKET_ENV",
    "STARTUP_TIMEOUT_MAX_S",
    "SUPERVISE",
    "SUPERVISOR_STATE",
    "TEXT_MAX",
    "ack",
    "checkpoint",
    "decode",
    "directive",
    "dump_flight",
    "encode",
    "error",
    "flight",
    "generation_run",
    "heartbeat",
    "job_end",
    "job_start",
    "ok",
    "partners",
    "query",
    "register",
    "run_id",
    "supervise",
    "supervisor_state",
]

PROTOCOL_VERSION = 1
DEFAULT_SOCKET = "/run/ftd/agent.sock"
SOCKET_ENV = "FTD_SOCKET"
"""Environment variable that overrides :data:`DEFAULT_SOCKET` on the client side."""

MAX_LINE = 64 * 1024
"""Longest message line the agent accepts, in bytes, newline excluded."""
JOB_MAX = 256
JOB_PATTERN = r"^[^/+#\s\x00]+$"
"""A job name becomes part of MQTT topics: no ``/ + #``, whitespace or NUL."""
DIRECTIVE_ID_MAX = 512
TEXT_MAX = 4096
"""Longest ``path`` and ``reason`` of an ack."""
RUN_MAX = 128
"""Longest ``run`` of a register."""
RUN_PARAM = "run"
"""The directive param naming the run of the job a directive is for."""
STARTUP_TIMEOUT_MAX_S = 86400.0
"""Longest start-up timeout a rank may ask for (a day)."""
PATH_MAX = 4096
"""Longest ``checkpoint_dir`` / ``fallback_checkpoint_dir`` of a register."""
PATH_PATTERN = "^/[^\\x00]*$"
"""A checkpoint directory is an absolute path without NUL."""
SAVE_PATH_PARAM = "save_path"
"""The save directive param naming the directory to save to instead of the declared one."""

# Operation names ("op"). Client -> agent:
REGISTER = "register"
HEARTBEAT = "heartbeat"
ACK = "ack"
CHECKPOINT = "checkpoint"
PARTNERS = "partners"  # agent -> client (issue #34): where each node's checkpoint replicas go
DUMP_FLIGHT = "dump_flight"  # agent -> client (issue #33): dump your flight recorder as JSON
FLIGHT = "flight"  # client -> agent: the answer to dump_flight (a file, or why not)
# Rank supervisor (ftd run) -> agent:
SUPERVISE = "supervise"
SUPERVISOR_STATE = "supervisor_state"
# Node hooks -> agent (Prolog, Epilog, ftd health):
JOB_START = "job_start"
JOB_END = "job_end"
CONDITIONS = "conditions"
PREFLIGHT = "preflight"
# Agent -> client:
OK = "ok"
ERROR = "error"
DIRECTIVE = "directive"


# --- messages (the field order is the wire order) ---------------------------------------------------


def register(
    job: str,
    rank: int,
    local_rank: int | None,
    pid: int | None,
    run: str | None = None,
    startup_timeout_s: float | None = None,
    checkpoint_dir: str | None = None,
    fallback_checkpoint_dir: str | None = None,
) -> RegisterMsg:
    msg: RegisterMsg = {
        "v": PROTOCOL_VERSION,
        "op": REGISTER,
        "job": job,
        "rank": rank,
        "local_rank": local_rank,
        "pid": pid,
        "run": run,
        "startup_timeout_s": startup_timeout_s,
    }
    # Sent only when declared: a client that declares none sends the bytes it always sent.
    if checkpoint_dir is not None:
        msg["checkpoint_dir"] = checkpoint_dir
    if fallback_checkpoint_dir is not None:
        msg["fallback_checkpoint_dir"] = fallback_checkpoint_dir
    return msg


def supervise(job: str, pid: int | None, info: dict[str, Any]) -> SuperviseMsg:
    """A rank supervisor's first message: it supervises ``job`` here, as ``info`` says."""
    return {"v": PROTOCOL_VERSION, "op": SUPERVISE, "job": job, "pid": pid, "info": dict(info)}


def supervisor_state(info: dict[str, Any]) -> SupervisorStateMsg:
    """A rank supervisor's new state (every SupervisorInfo field)."""
    return {"v": PROTOCOL_VERSION, "op": SUPERVISOR_STATE, "info": dict(info)}


def run_id(env: Any) -> str | None:
    """The run of its job a process belongs to, from its environment ``env`` (a mapping).

    ``FTD_RUN`` when set (any launcher can name its runs); in a Slurm job ``slurm-restart-N`` with
    N = ``SLURM_RESTART_COUNT`` (0 when unset: the first run; a requeued job keeps its id and counts
    up); in a Kubernetes pod ``pod-<uid>`` from ``FTD_POD_UID`` (the downward API's
    ``metadata.uid``: a recreated pod is a new run); else None (not known: the agent falls back to
    the runs of the ranks connected when a directive arrived)."""
    explicit = env.get("FTD_RUN")
    if explicit:
        return str(explicit)[:RUN_MAX]
    if env.get("SLURM_JOB_ID"):
        count = str(env.get("SLURM_RESTART_COUNT") or "0").strip()
        return f"slurm-restart-{count if count.isdecimal() else '0'}"
    pod = env.get("FTD_POD_UID")
    if pod:
        return f"pod-{pod}"[:RUN_MAX]
    return None


def generation_run(base: str | None, generation: int) -> str:
    """The run id of generation ``generation``'s ranks under a rank supervisor (``ftd run``) whose own
    run is ``base`` (:func:`run_id` of the supervisor's environment: ``slurm-restart-N``,
    ``pod-<uid>``; None or empty: unknown): ``<base>.gen-<g>``, else ``gen-<g>``. The supervisor sets
    it as its ranks' ``FTD_RUN`` and the coordinator looks for it, so a requeued job's generation 0
    (``slurm-restart-1.gen-0``) is never taken for the one before the requeue."""
    suffix = f"gen-{generation}"
    if not base:
        return suffix
    return f"{base[: RUN_MAX - len(suffix) - 1]}.{suffix}"


def heartbeat(step: int | None, timing: dict[str, Any] | None = None) -> HeartbeatMsg:
    msg: HeartbeatMsg = {"v": PROTOCOL_VERSION, "op": HEARTBEAT, "step": step}
    if timing is not None:  # a client that timed nothing sends the bytes it always sent
        msg["timing"] = timing
    return msg


def ack(directive_id: str, *, ok: bool, step: int | None, path: str | None, reason: str) -> AckMsg:
    return {
        "v": PROTOCOL_VERSION,
        "op": ACK,
        "directive_id": directive_id,
        "ok": ok,
        "step": step,
        "path": path,
        "reason": reason,
    }


def checkpoint(
    step: int,
    manifest: str,
    *,
    level: str,
    save_s: float | None = None,
    nbytes: int | None = None,
    directive_id: str | None = None,
) -> CheckpointMsg:
    return {
        "v": PROTOCOL_VERSION,
        "op": CHECKPOINT,
        "step": step,
        "manifest": manifest,
        "level": level,
        "save_s": save_s,
        "bytes": nbytes,
        "directive_id": directive_id,
    }


def partners(
    job: str, partners: dict[str, str], generation: int | None = None, version: int | None = None
) -> dict[str, Any]:
    """Agent -> client: ``{"v":1,"op":"partners","job":"1234","partners":{"node-1":"node-3",...},
    "generation":0,"version":1733300000000000000}``, the coordinator's choice of partner node for
    each node of the job (a node of another failure domain, never one with an active condition): a
    rank on node N replicates its checkpoint shard to the rank with the same local rank on
    ``partners[N]``. Sent at registration and whenever the choice changes; ``version`` orders the
    choices (a newer choice has a greater one; None from an older coordinator counts as 0). A client
    that never got one picks the next node in rank order."""
    return {
        "v": PROTOCOL_VERSION,
        "op": PARTNERS,
        "job": job,
        "partners": dict(partners),
        "generation": generation,
        "version": version,
    }


def job_start(
    job: str,
    *,
    user: str = "",
    uid: int | None = None,
    gpus: list[str] | None = None,
    tasks: int | None = None,
    partition: str = "",
) -> dict[str, Any]:
    return {
        "v": PROTOCOL_VERSION,
        "op": JOB_START,
        "job": job,
        "user": user,
        "uid": uid,
        "gpus": list(gpus or []),
        "tasks": tasks,
        "partition": partition,
    }


def job_end(job: str, leftover: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "op": JOB_END, "job": job, "leftover": list(leftover or [])}


def query(op: str) -> dict[str, Any]:
    """A hook's question without arguments (:data:`CONDITIONS`, :data:`PREFLIGHT`)."""
    return {"v": PROTOCOL_VERSION, "op": op}


def ok(re: str) -> OkMsg:
    return {"v": PROTOCOL_VERSION, "op": OK, "re": re}


def error(re: str | None, error: str) -> ErrorMsg:
    return {"v": PROTOCOL_VERSION, "op": ERROR, "re": re, "error": error}


def directive(fields: dict[str, Any]) -> dict[str, Any]:
    """A directive push: ``v`` and ``op`` first, then every field of the directive as given."""
    return {"v": PROTOCOL_VERSION, "op": DIRECTIVE, **fields}


# --- lines -----------------------------------------------------------------------------------------


def encode(msg: Any) -> bytes:
    """One message as one compact JSON line (what the client sends)."""
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any] | None:
    """One received line as a JSON object; ``None`` when it is not JSON or not an object."""
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    return msg if isinstance(msg, dict) else None


def dump_flight(request_id: str) -> dict[str, Any]:
    """Agent -> client: ``{"v":1,"op":"dump_flight","id":"f-12"}``, sent while a hang's evidence is
    collected (issue #33): the rank dumps PyTorch's flight recorder as JSON from a thread of its own
    (it works while the main thread waits in a collective) and answers with :func:`flight`."""
    return {"v": PROTOCOL_VERSION, "op": DUMP_FLIGHT, "id": request_id}


def flight(request_id: str, path: str | None, error: str = "") -> dict[str, Any]:
    """Client -> agent: ``{"v":1,"op":"flight","re":"f-12","path":"/tmp/ftd-flight-x.json","error":""}``,
    the file the rank wrote its flight-recorder dump to (mode 0600, owned by the rank's user; the
    agent reads it and removes it), or ``path`` null and why not (torch not loaded, a torch without
    the JSON dump, no process group, the dump failed)."""
    return {"v": PROTOCOL_VERSION, "op": FLIGHT, "re": request_id, "path": path, "error": error}
