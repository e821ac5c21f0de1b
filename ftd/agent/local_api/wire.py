"""This end of the trainer protocol: the messages a client sends, decoded and typed; replies encoded.

What: msgspec structs for ``register``, ``heartbeat``, ``ack``, ``checkpoint`` and the rank supervisor's
``supervise`` / ``supervisor_state`` (the node hooks' messages are
:mod:`ftd.agent.jobs`'), one decoder for all of them, and the encoders of the lines this end sends.
The protocol itself (version 1: one JSON object per line, names and limits) is
:mod:`ftd.client.protocol`, owned by the stdlib-only trainer client and imported here, never the
other way round. Why typed: a message with a wrong field type or an unknown ``op`` fails in the
decoder, so the server answers it with an ``error`` instead of tripping over it later.

How the server uses it
----------------------
The protocol (version 1: one JSON object per line, ``register``/``heartbeat``/``ack`` in,
``ok``/``error``/``directive`` out) is :mod:`ftd.client.protocol`, owned by the stdlib-only client
and imported here. This end decodes what a client sends into typed msgspec structs built from that
module's names and limits: a bad message (not JSON, not an object, unknown op, wrong field types,
an op before ``register``, a line over ``MAX_LINE``) is answered with an ``error``, counted
(``counters["bad_messages"]``) and logged (rate-limited); the connection stays open and nothing
else is affected. Replies are encoded with msgspec. An ``ack`` is relayed to ``on_ack`` as an
:class:`~ftd.events.Ack` with ``node`` and ``ts`` set; heartbeats feed
:meth:`LocalApi.silent_ranks` (a hung training loop goes silent here). Silence counts from a rank's
last heartbeat; before its first one, from its registration against the longer start-up timeout
(the agent's ``agent.heartbeat.startup_timeout_s``, or the rank's own ``startup_timeout_s`` from its
``register``): a rank still importing its framework is not a hung one.

A line that does not decode, however it is malformed (not UTF-8, not JSON, nested 60,000 deep, over
``MAX_LINE``), gets the ``error`` answer and the connection stays open: the decoding is
:func:`ftd.agent.local_api.wire.decode_line`, which never raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec

from ftd.agent.jobs import ConditionsMsg, HookMsg, JobEndMsg, JobStartMsg, PreflightMsg
from ftd.agent.local_api.inject import INJECT, InjectMsg
from ftd.client import protocol
from ftd.client.protocol import PROTOCOL_VERSION
from ftd.events import SupervisorInfo

__all__ = [
    "OK_REGISTER",
    "OPS",
    "AckMsg",
    "BadLine",
    "CheckpointMsg",
    "ClientMsg",
    "FlightMsg",
    "Heartbeat",
    "Register",
    "Supervise",
    "SupervisorStateMsg",
    "decode_line",
    "decoder",
    "error_line",
    "line",
    "peek_op",
]

JobName = Annotated[
    str, msgspec.Meta(min_length=1, max_length=protocol.JOB_MAX, pattern=protocol.JOB_PATTERN)
]
NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
#: An absolute path a rank saves to (issue #23): the agent relates filesystem trouble to it.
CheckpointDir = Annotated[
    str, msgspec.Meta(min_length=1, max_length=protocol.PATH_MAX, pattern=protocol.PATH_PATTERN)
]


class Register(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag=protocol.REGISTER):
    v: int = PROTOCOL_VERSION
    job: JobName
    rank: NonNegInt
    local_rank: NonNegInt | None = None
    pid: NonNegInt | None = None
    run: Annotated[str, msgspec.Meta(min_length=1, max_length=protocol.RUN_MAX)] | None = None
    startup_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=protocol.STARTUP_TIMEOUT_MAX_S)] | None = None
    checkpoint_dir: CheckpointDir | None = None
    fallback_checkpoint_dir: CheckpointDir | None = None


#: A cumulative step timing counter (issue #33): finite, never negative, at most ~30,000 years of steps.
TimingSeconds = Annotated[float, msgspec.Meta(ge=0, le=1e12)]


class HeartbeatTiming(msgspec.Struct, frozen=True, kw_only=True):
    """A heartbeat's step timing counters (:mod:`ftd.client.timing`)."""

    steps: Annotated[int, msgspec.Meta(ge=0, le=1 << 53)] = 0
    step_s: TimingSeconds = 0.0
    compute_s: TimingSeconds | None = None


class Heartbeat(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag=protocol.HEARTBEAT):
    v: int = PROTOCOL_VERSION
    step: int | None = None
    timing: HeartbeatTiming | None = None


class AckMsg(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag=protocol.ACK):
    v: int = PROTOCOL_VERSION
    directive_id: Annotated[str, msgspec.Meta(min_length=1, max_length=protocol.DIRECTIVE_ID_MAX)]
    ok: bool = True
    step: int | None = None
    path: Annotated[str, msgspec.Meta(max_length=protocol.TEXT_MAX)] | None = None
    reason: Annotated[str, msgspec.Meta(max_length=protocol.TEXT_MAX)] = ""


class CheckpointMsg(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag=protocol.CHECKPOINT):
    """A rank wrote a checkpoint (issue #34): its manifest, checked by :mod:`ftd.agent.checkpoints`."""

    v: int = PROTOCOL_VERSION
    step: NonNegInt
    manifest: CheckpointDir
    level: Literal["local", "partner", "shared"]
    save_s: Annotated[float, msgspec.Meta(ge=0)] | None = None
    bytes: NonNegInt | None = None
    directive_id: Annotated[str, msgspec.Meta(min_length=1, max_length=protocol.DIRECTIVE_ID_MAX)] | None = (
        None
    )


class Supervise(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag=protocol.SUPERVISE):
    """A rank supervisor's first message (``ftd run``, issue #24): it supervises ``job`` here."""

    v: int = PROTOCOL_VERSION
    job: JobName
    pid: NonNegInt | None = None
    info: SupervisorInfo = msgspec.field(default_factory=SupervisorInfo)


class SupervisorStateMsg(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag=protocol.SUPERVISOR_STATE
):
    """A rank supervisor's new state."""

    v: int = PROTOCOL_VERSION
    info: SupervisorInfo


class FlightMsg(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag=protocol.FLIGHT):
    """A rank's answer to ``dump_flight`` (issue #33): the file of its flight-recorder dump, or why not."""

    v: int = PROTOCOL_VERSION
    re: Annotated[str, msgspec.Meta(min_length=1, max_length=protocol.DIRECTIVE_ID_MAX)]
    path: CheckpointDir | None = None
    error: Annotated[str, msgspec.Meta(max_length=protocol.TEXT_MAX)] = ""


ClientMsg = (
    Register
    | Heartbeat
    | AckMsg
    | CheckpointMsg
    | FlightMsg
    | Supervise
    | SupervisorStateMsg
    | HookMsg
    | InjectMsg
)
OPS: dict[type[Any], str] = {
    Register: protocol.REGISTER,
    Heartbeat: protocol.HEARTBEAT,
    AckMsg: protocol.ACK,
    CheckpointMsg: protocol.CHECKPOINT,
    FlightMsg: protocol.FLIGHT,
    Supervise: protocol.SUPERVISE,
    SupervisorStateMsg: protocol.SUPERVISOR_STATE,
    JobStartMsg: protocol.JOB_START,
    JobEndMsg: protocol.JOB_END,
    ConditionsMsg: protocol.CONDITIONS,
    PreflightMsg: protocol.PREFLIGHT,
    InjectMsg: INJECT,
}
decoder = msgspec.json.Decoder(ClientMsg)
_encoder = msgspec.json.Encoder()


def line(msg: Mapping[str, Any]) -> bytes:
    """One message as one line, in msgspec's JSON (the bytes this end has always sent)."""
    return _encoder.encode(msg) + b"\n"


def error_line(re: str | None, error: str) -> bytes:
    """The ``error`` reply to a message whose ``op`` was ``re`` (None: unknown), as one line."""
    return line(protocol.error(re, error))


OK_REGISTER = line(protocol.ok(protocol.REGISTER))


class BadLine(msgspec.Struct, frozen=True):
    """A line that is not a message this end understands: the ``op`` it seemed to be (None: none
    could be read) and why, for the ``error`` reply."""

    op: str | None
    error: str


class _OpOnly(msgspec.Struct):
    """Only the ``op`` of a line (every other field skipped without being built)."""

    op: str | None = None


_op_decoder = msgspec.json.Decoder(_OpOnly)


def decode_line(raw: bytes) -> ClientMsg | BadLine:
    """One line from a client: its message, or a :class:`BadLine` saying why not. Never raises,
    whatever the bytes (not UTF-8, not JSON, not an object, an unknown op, wrong field types,
    nesting deep enough to exhaust the recursion limit of a generic decoder)."""
    try:
        msg: ClientMsg = decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return BadLine(peek_op(raw), str(exc)[:500])
    except UnicodeDecodeError:  # a string that is not UTF-8, met while building a field
        return BadLine(peek_op(raw), "the line is not UTF-8")
    except RecursionError:
        return BadLine(peek_op(raw), "message nested too deeply")
    return msg


def peek_op(raw: bytes) -> str | None:
    """Best-effort ``op`` of a message that failed to decode, for the error reply (None when the
    line is not a JSON object with a string ``op``). Never raises."""
    try:
        op = _op_decoder.decode(raw).op
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError):
        return None
    return op[:64] if op is not None else None
