"""Configuration: one TOML file -> typed, frozen structs, or every problem in it at once.

What: the ftd daemons (``ftd agent``, ``ftd coordinator``) read one TOML file. This module defines its
schema as msgspec Structs (the struct and field names are a contract other modules code against),
loads it (:func:`load_config`, :func:`parse_config`) and explains it (:func:`describe_options`, used by
``ftd check-config --explain``).

Why this shape: a daemon that refuses to start on a typo costs one restart; one that starts with a
misspelt key silently ignored (say ``cooldwon_s``) costs a drained cluster. So unknown keys are
errors, and an operator fixing a file should see *all* its mistakes in one run, each with its
dotted path, rather than one per restart. msgspec stops at the first error, so a generic validator
first walks the raw TOML data against the structs' own type information
(:func:`msgspec.inspect.type_info`: types, ``msgspec.Meta`` bounds, and ``Meta(extra=...)`` for
choices/hints) and collects every problem; only clean data is then built with
:func:`msgspec.convert`. New fields and sections are therefore validated and documented
automatically: give them an ``Annotated[..., msgspec.Meta(description=...)]`` and bounds.

Cross-field rules that types cannot express (password vs password_file, MQTT's "no password
without a user name", ...) live in :func:`_cross_check`.
"""

from __future__ import annotations

import difflib
import math
import operator
import os
import re
import socket
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import msgspec
import msgspec.inspect as mi

__all__ = [
    "AgentConfig",
    "ApiConfig",
    "BusConfig",
    "Config",
    "ConfigError",
    "CoordinatorConfig",
    "FsConfig",
    "FsMount",
    "HeartbeatConfig",
    "KubernetesConfig",
    "LogConfig",
    "LogsConfig",
    "MemoryConfig",
    "NotifyConfig",
    "NvmlConfig",
    "Option",
    "PolicyConfig",
    "Problem",
    "SlurmConfig",
    "SpoolConfig",
    "StormConfig",
    "config_from_data",
    "describe_options",
    "load_config",
    "parse_config",
    "resolve_password",
    "validate_data",
]

# --------------------------------------------------------------------------------------------------
# Reusable constrained types. ``extra`` keys understood by the validator:
#   "choices": allowed values;  "hint": appended to any constraint failure message.

NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]
PositiveSeconds = Annotated[float, msgspec.Meta(gt=0)]
NodeName = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z",
        extra={"hint": "letters, digits, '.', '_' and '-' only: the name is used in MQTT topics"},
    ),
]

SCHEDULERS = ("slurm", "none", "kubernetes")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
NODE_LABELS = ("rack", "nvlink_domain")


def _doc(text: str, **kwargs: Any) -> msgspec.Meta:
    return msgspec.Meta(description=text, **kwargs)


# --------------------------------------------------------------------------------------------------
# Schema


class BusConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How to reach the MQTT broker. ``embedded = true`` starts an in-process broker (single machine)."""

    host: Annotated[NonEmptyStr, _doc("Broker host name or address.")] = "127.0.0.1"
    port: Annotated[int, _doc("Broker TCP port (1883 plain, 8883 usual for TLS).", ge=1, le=65535)] = 1883
    username: Annotated[NonEmptyStr | None, _doc("MQTT user name; needs password or password_file.")] = None
    password: Annotated[
        NonEmptyStr | None, _doc("MQTT password inline; prefer password_file. Exclusive with password_file.")
    ] = None
    # read at start; systemd LoadCredential puts it in $CREDENTIALS_DIRECTORY
    password_file: Annotated[
        NonEmptyStr | None,
        _doc(
            "File holding the MQTT password (trailing newline ignored). A relative path is resolved "
            "against $CREDENTIALS_DIRECTORY when set (systemd LoadCredential)."
        ),
    ] = None
    tls: Annotated[bool, _doc("Connect with TLS.")] = False
    ca_file: Annotated[
        NonEmptyStr | None, _doc("CA bundle to verify the broker (needs tls = true); unset: system CAs.")
    ] = None
    # default: ftd-agent-{node} / ftd-coordinator
    client_id: Annotated[
        NonEmptyStr | None, _doc("MQTT client id; unset: ftd-agent-{node} or ftd-coordinator.")
    ] = None
    keepalive_s: Annotated[
        int, _doc("MQTT keepalive in seconds; the broker declares us dead after 1.5x this.", ge=1, le=65535)
    ] = 5
    reconnect_min_s: Annotated[PositiveSeconds, _doc("First reconnect delay (doubles, jittered).")] = 0.2
    reconnect_max_s: Annotated[PositiveSeconds, _doc("Longest reconnect delay.")] = 10.0
    embedded: Annotated[
        bool, _doc("Start an in-process broker instead of connecting to one (single machine, demos).")
    ] = False


class NvmlConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """GPU health through NVML (``ftd.agent.watchers.nvml``). Without NVML the watcher disables itself."""

    enabled: Annotated[bool, _doc("Watch the GPUs through NVML.")] = True
    interval_s: Annotated[
        PositiveSeconds, _doc("Seconds between two polls of every GPU (Xids arrive at once, not polled).")
    ] = 5.0
    call_timeout_s: Annotated[
        PositiveSeconds, _doc("Deadline for one GPU's probe; past it the probe is reported as stalled.")
    ] = 5.0
    expected_gpus: Annotated[
        Annotated[int, msgspec.Meta(ge=0)] | None,
        _doc("GPUs this node should have; fewer is a gpu_missing event. Unset: no check."),
    ] = None
    temperature_c: Annotated[
        float, _doc("GPU temperature (Celsius) at or above which a thermal event is sent.", gt=0)
    ] = 85.0
    temperature_hysteresis_c: Annotated[
        float, _doc("A hot GPU counts as cool again below temperature_c minus this.", ge=0)
    ] = 5.0
    pcie_replay_burst: Annotated[
        int, _doc("PCIe replays between two polls that count as a burst (gpu_health event).", ge=1)
    ] = 100
    nvlink_error_burst: Annotated[
        int, _doc("NVLink error-counter increase between two polls that is reported (gpu_health).", ge=1)
    ] = 1
    xid_events: Annotated[bool, _doc("Receive Xid errors through NVML's event API.")] = True


class LogsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Training logs followed for error patterns and hangs (``ftd.agent.watchers.logfile``)."""

    paths: Annotated[
        list[NonEmptyStr], _doc("Files or globs to follow; new files matching a glob are picked up.")
    ] = msgspec.field(default_factory=list)
    stale_after_s: Annotated[
        PositiveSeconds | None,
        _doc("A followed log that has not grown for this long is a hang suspect; unset: never."),
    ] = 300.0
    max_line_bytes: Annotated[
        int, _doc("Longest line examined; the rest of a longer line is skipped (and counted).", ge=256)
    ] = 65536
    patterns_file: Annotated[
        NonEmptyStr | None, _doc("Pattern table (TOML) replacing the built-in log_patterns.toml.")
    ] = None
    rate_limit_s: Annotated[
        float, _doc("Per pattern and file, at most one log_pattern event per this many seconds.", ge=0)
    ] = 10.0
    rescan_s: Annotated[
        PositiveSeconds, _doc("Fallback poll / glob rescan interval (inotify does the fast path).")
    ] = 2.0


class FsMount(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One filesystem watched for fill."""

    path: Annotated[NonEmptyStr, _doc("A path on the filesystem (its mount point, usually).")]
    warn_pct: Annotated[float, _doc("Fill (% of effective capacity) that warns.", gt=0, le=100)] = 85.0
    critical_pct: Annotated[float, _doc("Fill (% of effective capacity) that is critical.", gt=0, le=100)] = (
        95.0
    )
    capacity_factor: Annotated[
        float,
        _doc("Fraction of the raw size that is usable (0.8: the filesystem fails at 80%).", gt=0, le=1),
    ] = 1.0


class FsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Filesystem fill: bytes and inodes per mount (``ftd.agent.watchers.fs``)."""

    mounts: Annotated[list[FsMount], _doc("Filesystems to watch.")] = msgspec.field(default_factory=list)
    interval_s: Annotated[PositiveSeconds, _doc("Seconds between two samples.")] = 30.0
    hysteresis_pct: Annotated[
        float, _doc("A level clears only below its threshold minus this many percent.", ge=0, le=50)
    ] = 2.0
    forecast_horizon_s: Annotated[
        PositiveSeconds, _doc("Report when the fill-rate forecast says full within this many seconds.")
    ] = 3600.0
    forecast_window_s: Annotated[PositiveSeconds, _doc("Samples this recent feed the fill-rate fit.")] = 900.0


class MemoryConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Host memory pressure and trainer RSS growth (``ftd.agent.watchers.memory``)."""

    enabled: Annotated[bool, _doc("Watch host memory and trainer RSS.")] = True
    interval_s: Annotated[PositiveSeconds, _doc("Seconds between two samples.")] = 10.0
    available_warn_pct: Annotated[
        float, _doc("MemAvailable below this % of MemTotal is pressure (warning).", gt=0, le=100)
    ] = 10.0
    available_critical_pct: Annotated[
        float, _doc("MemAvailable below this % of MemTotal is critical.", gt=0, le=100)
    ] = 5.0
    psi_some_avg10_pct: Annotated[
        float, _doc("PSI memory 'some avg10' at or above this % is pressure (when the kernel has PSI).", gt=0)
    ] = 20.0
    leak_window_s: Annotated[PositiveSeconds, _doc("RSS samples this recent feed the growth fit.")] = 1800.0
    leak_min_samples: Annotated[int, _doc("Samples needed before a growth rate is trusted.", ge=3)] = 6
    leak_min_growth_mb_per_min: Annotated[
        float, _doc("RSS growth (MB/min) below this is never a leak.", ge=0)
    ] = 10.0
    leak_horizon_s: Annotated[
        PositiveSeconds, _doc("Report a leak when memory would run out within this many seconds.")
    ] = 3600.0


class HeartbeatConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Trainer ranks' heartbeats to the local API: silence and stragglers."""

    timeout_s: Annotated[
        PositiveSeconds, _doc("A rank silent this long is reported (rank_heartbeat_lost), once per silence.")
    ] = 60.0
    check_interval_s: Annotated[
        float, _doc("How often the ranks are checked (report latency past the deadline).", gt=0, le=10)
    ] = 0.25
    straggler_steps: Annotated[
        int,
        _doc("Steps behind the fastest rank of its job on this node that make a straggler; 0: off.", ge=0),
    ] = 100
    straggler_fraction: Annotated[
        float,
        _doc("... and this fraction of the fastest rank's step behind (both must hold).", ge=0, le=1),
    ] = 0.05


class StormConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Storm control: identical events collapse into one with a count; follow-on Xids are linked."""

    window_s: Annotated[
        float,
        _doc("Repeats of an event within this window go out as one summary with a count; 0: off.", ge=0),
    ] = 10.0
    follow_window_s: Annotated[
        float,
        _doc("An Xid that follows a causing Xid on the same GPU within this window is linked to it.", ge=0),
    ] = 30.0


class SpoolConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The on-disk outbox spool under agent.state_dir (events survive broker outages and agent restarts)."""

    max_mb: Annotated[
        float, _doc("Largest spool (live entries); the oldest lowest-severity go first.", gt=0)
    ] = 64.0
    fsync: Annotated[
        bool, _doc("fdatasync every record (survives power loss; costs a disk flush per event).")
    ] = False


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The per-node agent (``ftd agent``)."""

    node: Annotated[
        NodeName | None, _doc("This node's name, as the scheduler knows it; unset: the short host name.")
    ] = None
    kmsg_path: Annotated[NonEmptyStr, _doc("Kernel log to watch for Xid/SXid records.")] = "/dev/kmsg"
    state_dir: Annotated[
        NonEmptyStr, _doc("Directory for persistent state (kmsg position, outbox spool).")
    ] = "/var/lib/ftd"
    socket_path: Annotated[
        str,
        _doc(
            "Unix socket trainers connect to.",
            min_length=1,
            max_length=107,
            extra={"hint": "a unix socket path is limited to 107 bytes"},
        ),
    ] = "/run/ftd/agent.sock"
    outbox_max: Annotated[
        int, _doc("Events kept while the broker is unreachable (oldest dropped first).", ge=1)
    ] = 10000
    # True: report what is already in the log; False: only new records
    kmsg_from_start: Annotated[
        bool, _doc("Report records already in the kernel log at first start (else only new ones).")
    ] = False

    nvml: Annotated[NvmlConfig, _doc("GPU health through NVML.")] = msgspec.field(default_factory=NvmlConfig)
    logs: Annotated[LogsConfig, _doc("Training logs.")] = msgspec.field(default_factory=LogsConfig)
    fs: Annotated[FsConfig, _doc("Filesystem fill.")] = msgspec.field(default_factory=FsConfig)
    memory: Annotated[MemoryConfig, _doc("Host memory and trainer RSS.")] = msgspec.field(
        default_factory=MemoryConfig
    )

    heartbeat: Annotated[HeartbeatConfig, _doc("Trainer heartbeats and stragglers.")] = msgspec.field(
        default_factory=HeartbeatConfig
    )
    storm: Annotated[StormConfig, _doc("Storm control.")] = msgspec.field(default_factory=StormConfig)
    spool: Annotated[SpoolConfig, _doc("Durable outbox spool.")] = msgspec.field(default_factory=SpoolConfig)

    def resolved_node(self) -> str:
        """``node``, or the short host name when unset (the name Slurm usually knows the node by)."""
        return self.node or socket.gethostname().split(".", 1)[0]


class SlurmConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the coordinator drives Slurm (through ``scontrol``)."""

    enabled: Annotated[bool, _doc("Act on Slurm (drain/resume nodes, requeue jobs).")] = True
    scontrol: Annotated[NonEmptyStr, _doc("scontrol executable (name on $PATH or absolute path).")] = (
        "scontrol"
    )
    # exported as SLURM_CONF to scontrol
    slurm_conf: Annotated[
        NonEmptyStr | None, _doc("slurm.conf to use, exported as SLURM_CONF; unset: Slurm's default.")
    ] = None
    timeout_s: Annotated[PositiveSeconds, _doc("Deadline for one scontrol call.")] = 30.0


class KubernetesConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the coordinator drives Kubernetes (cordon + taint + evict; requeue by deleting pods)."""

    host: Annotated[
        NonEmptyStr | None,
        _doc(
            "API server URL, e.g. https://10.0.0.1:6443; unset: in-cluster "
            "(https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)."
        ),
    ] = None
    token_file: Annotated[
        NonEmptyStr | None,
        _doc("Bearer token file, re-read on every request (rotated tokens); unset: no token."),
    ] = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    ca_file: Annotated[NonEmptyStr | None, _doc("CA bundle to verify the API server; unset: system CAs.")] = (
        "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    )
    namespace: Annotated[NonEmptyStr, _doc("Namespace of the training jobs' pods (requeue, job_info).")] = (
        "default"
    )
    taint_key: Annotated[
        NonEmptyStr, _doc("Taint key ftd puts on drained nodes (NoSchedule; value: the reason slug).")
    ] = "ftd.dev/fault"
    job_label: Annotated[
        NonEmptyStr, _doc("Pod label whose value is the ftd job id (selects a job's pods).")
    ] = "ftd.dev/job"
    evict: Annotated[
        bool, _doc("On drain, also evict the node's pods (Eviction API; DaemonSet and mirror pods stay).")
    ] = True
    timeout_s: Annotated[PositiveSeconds, _doc("Deadline for one API request.")] = 30.0


class NotifyConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``notify`` action: a JSON webhook (Slack-, PagerDuty- or ChatOps-style receiver)."""

    webhook_url: Annotated[
        NonEmptyStr | None,
        _doc("Webhook URL (often holds a token: prefer url_file). Exclusive with url_file."),
    ] = None
    url_file: Annotated[
        NonEmptyStr | None,
        _doc(
            "File holding the webhook URL (trailing newline ignored), read per call; relative paths "
            "resolve against $CREDENTIALS_DIRECTORY (systemd LoadCredential)."
        ),
    ] = None
    timeout_s: Annotated[PositiveSeconds, _doc("Deadline for one webhook POST.")] = 10.0
    retries: Annotated[int, _doc("Retries after a failed POST (exponential backoff).", ge=0, le=20)] = 3


class RateLimitConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A rate limit on one action kind."""

    kind: Annotated[NonEmptyStr, _doc("Action kind limited (drain_node, checkpoint_restart, ...).")]
    max: Annotated[int, _doc("Most actions of this kind started within the window.", ge=1)]
    window_s: Annotated[PositiveSeconds, _doc("Sliding window, in seconds.")]


class NodeLabelsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Labels shared by a group of nodes (one entry per rack, say)."""

    nodes: Annotated[list[NodeName], _doc("Nodes these labels apply to.")]
    rack: Annotated[NonEmptyStr | None, _doc("Rack the nodes are in.")] = None
    nvlink_domain: Annotated[NonEmptyStr | None, _doc("NVLink domain (e.g. NVL72 rack) of the nodes.")] = None


class DomainBudgetConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A drain budget per failure domain: nodes sharing a label value (coordinator.node_labels)."""

    label: Annotated[str, _doc("Node label naming the domain.", extra={"choices": NODE_LABELS})]
    max_drained: Annotated[int, _doc("Most nodes of one domain drained by ftd at once.", ge=0)]


class PolicyConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The policy gate every action request passes through."""

    dry_run: Annotated[bool, _doc("Log the actions rules request, execute none.")] = False
    cooldown_s: Annotated[
        float, _doc("Minimum seconds between two disruptive actions on the same node.", ge=0)
    ] = 600.0
    dry_run_rules: Annotated[
        list[NonEmptyStr], _doc("Rules whose actions are only logged (trial a new rule).")
    ] = msgspec.field(default_factory=list)
    rate_limits: Annotated[
        list[RateLimitConfig], _doc("Per action kind: at most max started within window_s.")
    ] = msgspec.field(default_factory=list)
    max_drained_fraction: Annotated[
        float, _doc("Most of the cluster (fraction of known nodes) ftd may have drained at once.", ge=0, le=1)
    ] = 0.1
    min_drain_budget: Annotated[
        int, _doc("Nodes ftd may always have drained, whatever the fraction (small clusters).", ge=0)
    ] = 1
    max_drained_per_job: Annotated[
        Annotated[int, msgspec.Meta(ge=1)] | None,
        _doc("Most nodes of one running job drained at once; unset: no per-job limit."),
    ] = None
    domain_budgets: Annotated[
        list[DomainBudgetConfig],
        _doc("Most nodes drained at once per value of a node label (rack, NVLink domain)."),
    ] = msgspec.field(default_factory=list)
    approval_required_kinds: Annotated[
        list[NonEmptyStr], _doc("Action kinds held as awaiting_approval until a human approves them.")
    ] = msgspec.field(default_factory=list)


class ApiConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The coordinator's HTTP API and dashboard (``/healthz``, ``/metrics``, ``/v1/...``, ``/``)."""

    enabled: Annotated[bool, _doc("Serve the HTTP API and the dashboard.")] = True
    host: Annotated[
        NonEmptyStr, _doc("Address to listen on; keep it on loopback unless a proxy adds TLS.")
    ] = "127.0.0.1"
    port: Annotated[int, _doc("TCP port to listen on.", ge=1, le=65535)] = 8787
    token_file: Annotated[
        NonEmptyStr | None,
        _doc(
            "File holding the bearer token that mutating calls (drain, resume, restart, approvals) need; "
            "relative paths resolve against $CREDENTIALS_DIRECTORY. Unset: mutating calls are refused."
        ),
    ] = None


class CoordinatorConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The cluster coordinator (``ftd coordinator``)."""

    ledger_path: Annotated[NonEmptyStr, _doc("SQLite ledger of events and actions.")] = (
        "/var/lib/ftd/ledger.sqlite"
    )
    save_deadline_s: Annotated[
        PositiveSeconds, _doc("How long trainers get to checkpoint after a save request.")
    ] = 120.0
    stop_deadline_s: Annotated[
        PositiveSeconds, _doc("How long trainers get to exit after a stop request.")
    ] = 60.0
    disabled_rules: Annotated[list[NonEmptyStr], _doc("Rules not loaded at all.")] = msgspec.field(
        default_factory=list
    )
    rule_dirs: Annotated[
        list[NonEmptyStr], _doc("Extra directories of rule modules (besides entry-point plugins).")
    ] = msgspec.field(default_factory=list)
    rules_file: Annotated[
        NonEmptyStr | None, _doc("Declarative rules (TOML, [[rule]] tables); unset: none.")
    ] = None
    node_labels: Annotated[
        list[NodeLabelsConfig],
        _doc("Failure domains of nodes: rack and NVLink domain (for policy.domain_budgets)."),
    ] = msgspec.field(default_factory=list)
    scheduler: Annotated[str, _doc("Scheduler to act on.", extra={"choices": SCHEDULERS})] = "slurm"
    policy: Annotated[PolicyConfig, _doc("Policy gate.")] = msgspec.field(default_factory=PolicyConfig)
    slurm: Annotated[SlurmConfig, _doc("Slurm settings.")] = msgspec.field(default_factory=SlurmConfig)
    api: Annotated[ApiConfig, _doc("HTTP API and dashboard.")] = msgspec.field(default_factory=ApiConfig)
    kubernetes: Annotated[KubernetesConfig, _doc("Kubernetes settings (scheduler = kubernetes).")] = (
        msgspec.field(default_factory=KubernetesConfig)
    )
    notify: Annotated[NotifyConfig, _doc("Webhook for the notify action.")] = msgspec.field(
        default_factory=NotifyConfig
    )
    gpu_reset_deadline_s: Annotated[
        PositiveSeconds, _doc("How long a node's agent gets to answer a gpu_reset directive.")
    ] = 120.0
    diagnostics_deadline_s: Annotated[
        PositiveSeconds, _doc("How long agents get to answer a collect_diagnostics directive.")
    ] = 60.0


class LogConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Daemon logging (structlog)."""

    level: Annotated[str, _doc("Minimum level logged.", extra={"choices": LOG_LEVELS})] = "info"
    # None: JSON when stderr is not a TTY
    json: Annotated[
        bool | None, _doc("JSON lines (true) or console text (false); unset: JSON off a TTY.")
    ] = None


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The whole file. Every section is optional; an empty file is a valid (all defaults) config."""

    bus: BusConfig = msgspec.field(default_factory=BusConfig)
    agent: AgentConfig = msgspec.field(default_factory=AgentConfig)
    coordinator: CoordinatorConfig = msgspec.field(default_factory=CoordinatorConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)


# --------------------------------------------------------------------------------------------------
# Errors


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a config. ``path`` is dotted (``coordinator.policy.cooldown_s``), or ``""``
    for the file as a whole; ``line``/``column`` (1-based) are known for TOML syntax errors only."""

    path: str
    message: str
    line: int | None = None
    column: int | None = None

    def render(self, source: str) -> str:
        if self.line is not None:
            where = f"{source}:{self.line}" + (f":{self.column}" if self.column is not None else "")
            return f"{where}: {self.message}"
        if self.path:
            return f"{source}: {self.path}: {self.message}"
        return f"{source}: {self.message}"


class ConfigError(ValueError):
    """A config that cannot be used. ``problems`` holds every problem found; ``str()`` lists them all,
    one per line, as ``source: path: message``."""

    def __init__(self, problems: Sequence[Problem], source: str = "<string>") -> None:
        self.problems: list[Problem] = list(problems)
        self.source = source
        super().__init__(self.__str__())

    def __str__(self) -> str:
        return "\n".join(p.render(self.source) for p in self.problems)

    def __reduce__(self) -> tuple[Any, ...]:  # keep problems across pickling (multiprocessing)
        return (type(self), (self.problems, self.source))


# --------------------------------------------------------------------------------------------------
# Loading


def load_config(path: str | Path) -> Config:
    """Read and validate the TOML file at ``path``. Raises :class:`ConfigError` listing every problem."""
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError([Problem("", f"cannot read config file: {reason}")], source) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError([Problem("", "not valid UTF-8", line, column)], source) from exc
    return parse_config(text, source=source)


_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


def parse_config(text: str, *, source: str = "<string>") -> Config:
    """Parse and validate TOML text. ``source`` names it in error messages."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        line = column = None
        if match := _TOML_POSITION.search(message):
            line, column = int(match[1]), int(match[2])
            message = message[: match.start()]
        raise ConfigError([Problem("", f"invalid TOML: {message}", line, column)], source) from exc
    return config_from_data(data, source=source)


def config_from_data(data: object, *, source: str = "<data>") -> Config:
    """Validate already-parsed data (what :func:`tomllib.loads` returns) and build the :class:`Config`."""
    problems = validate_data(data)
    if problems:
        raise ConfigError(problems, source)
    try:
        return msgspec.convert(data, Config)
    except msgspec.ValidationError as exc:  # the validator should have caught it; never leak msgspec's type
        text = str(exc)
        path = ""
        if " - at `$" in text:
            text, _, where = text.partition(" - at `$")
            path = where.rstrip("`").lstrip(".")
        raise ConfigError([Problem(path, text)], source) from exc


def validate_data(data: object) -> list[Problem]:
    """Every problem in ``data`` (parsed TOML) against :class:`Config`, in file order; ``[]`` if none."""
    problems: list[Problem] = []
    _check(data, _config_info(), "", problems)
    if isinstance(data, dict):
        _cross_check(data, problems)
    return problems


def read_secret_file(name: str, key: str) -> str:
    """The contents of the secret file ``name`` given at config ``key``: a relative path is resolved
    against ``$CREDENTIALS_DIRECTORY`` when set (systemd ``LoadCredential=``), one trailing newline is
    removed. Raises :class:`ConfigError` (naming ``key``) when it is unreadable or empty."""
    path = Path(name).expanduser()
    creds = os.environ.get("CREDENTIALS_DIRECTORY")
    if not path.is_absolute() and creds:
        path = Path(creds) / path
    try:
        secret = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        hint = ""
        if not Path(name).is_absolute() and not creds:
            hint = " ($CREDENTIALS_DIRECTORY is not set, so the path is relative to the working directory)"
        raise ConfigError([Problem(key, f"cannot read {path}: {reason}{hint}")]) from exc
    if secret.endswith("\n"):
        secret = secret[:-1].removesuffix("\r")
    if not secret:
        raise ConfigError([Problem(key, f"{path} is empty")])
    return secret


def resolve_password(bus: BusConfig) -> str | None:
    """The broker password: ``bus.password``, or the contents of ``bus.password_file``
    (:func:`read_secret_file`); ``None`` when neither is set. Raises :class:`ConfigError`."""
    if bus.password is not None:
        return bus.password
    if bus.password_file is None:
        return None
    return read_secret_file(bus.password_file, "bus.password_file")


# --------------------------------------------------------------------------------------------------
# Generic validator over msgspec.inspect types


@cache
def _config_info() -> mi.StructType:
    info = mi.type_info(Config)
    assert isinstance(info, mi.StructType)
    return info


@cache
def _leaf_index() -> dict[str, list[str]]:
    """Option name -> every dotted path it exists at (to say "it belongs in [bus]")."""
    index: dict[str, list[str]] = {}
    for option in describe_options():
        index.setdefault(option.path.rsplit(".", 1)[-1], []).append(option.path)
    return index


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")


def _join(path: str, key: object) -> str:
    text = key if isinstance(key, str) else str(key)
    if not _BARE_KEY.match(text):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{path}.{text}" if path else text


def _unwrap(t: mi.Type) -> tuple[mi.Type, Mapping[str, Any]]:
    extra: dict[str, Any] = {}
    while isinstance(t, mi.Metadata):
        extra.update(t.extra or {})
        t = t.type
    return t, extra


def _type_name(t: mi.Type) -> str:
    t, _ = _unwrap(t)
    if isinstance(t, mi.BoolType):
        return "bool"
    if isinstance(t, mi.IntType):
        return "int"
    if isinstance(t, mi.FloatType):
        return "float"
    if isinstance(t, mi.StrType):
        return "str"
    if isinstance(t, mi.StructType):
        return "table"
    if isinstance(t, mi.ListType):
        return f"array of {_type_name(t.item_type)}"
    if isinstance(t, mi.UnionType):
        return " or ".join(_type_name(m) for m in t.types if not isinstance(m, mi.NoneType))
    if isinstance(t, mi.NoneType):
        return "none"
    return type(t).__name__.removesuffix("Type").lower()


def _show(value: object, limit: int = 40) -> str:
    """``str 'abc'``, ``int 5``, ``bool true``, ``table`` ... for "expected X, got Y"."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"bool {str(value).lower()}"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return f"array of {len(value)}" if value else "empty array"
    text = repr(value) if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(value).__name__} {text}"


def _check(value: object, t: mi.Type, path: str, problems: list[Problem]) -> None:
    t, extra = _unwrap(t)
    hint = f" ({extra['hint']})" if "hint" in extra else ""

    def fail(message: str) -> None:
        problems.append(Problem(path, message))

    def wrong_type() -> None:
        fail(f"expected {_type_name(t)}, got {_show(value)}")

    if isinstance(t, mi.UnionType):
        members = [m for m in t.types if not isinstance(m, mi.NoneType)]
        if value is None and len(members) < len(t.types):
            return
        if len(members) == 1:
            _check(value, members[0], path, problems)
            return
        for member in members:
            trial: list[Problem] = []
            _check(value, member, path, trial)
            if not trial:
                return
        wrong_type()
        return
    if isinstance(t, mi.StructType):
        _check_table(value, t, path, problems)
        return
    if isinstance(t, mi.BoolType):
        if not isinstance(value, bool):
            wrong_type()
            return
    elif isinstance(t, mi.IntType | mi.FloatType):
        allowed: tuple[type, ...] = (int,) if isinstance(t, mi.IntType) else (int, float)
        if isinstance(value, bool) or not isinstance(value, allowed):
            wrong_type()
            return
        assert isinstance(value, int | float)
        if isinstance(value, float) and not math.isfinite(value):
            fail(f"must be a finite number, got {value}")
            return
        if message := _range_problem(value, t):
            fail(message + hint)
            return
    elif isinstance(t, mi.StrType):
        if not isinstance(value, str):
            wrong_type()
            return
        if t.min_length is not None and len(value) < t.min_length:
            fail(
                ("must not be empty" if t.min_length == 1 else f"must be at least {t.min_length} characters")
                + hint
            )
            return
        if t.max_length is not None and len(value) > t.max_length:
            fail(f"must be at most {t.max_length} characters, got {len(value)}{hint}")
            return
        if t.pattern is not None and not re.search(t.pattern, value):
            fail(f"invalid value {value!r}" + (hint or f" (must match {t.pattern!r})"))
            return
    elif isinstance(t, mi.ListType):
        if not isinstance(value, list):
            wrong_type()
            return
        if t.min_length is not None and len(value) < t.min_length:
            fail(f"must have at least {t.min_length} items{hint}")
        if t.max_length is not None and len(value) > t.max_length:
            fail(f"must have at most {t.max_length} items{hint}")
        for i, item in enumerate(value):
            _check(item, t.item_type, f"{path}[{i}]", problems)
        return
    elif isinstance(t, mi.NoneType):
        if value is not None:
            wrong_type()
        return
    # Any other type: no structural check here; msgspec.convert reports it (see config_from_data).
    choices = extra.get("choices")
    if choices is not None and value not in choices:
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        suggestion = f" (did you mean {close[0]!r}?)" if close else ""
        listed = ", ".join(repr(c) for c in choices)
        fail(f"must be one of {listed}, got {value!r}{suggestion}")


def _range_problem(value: float, t: mi.IntType | mi.FloatType) -> str | None:
    bounds = [(op, b) for op, b in ((">=", t.ge), (">", t.gt), ("<=", t.le), ("<", t.lt)) if b is not None]
    if all(_COMPARE[op](value, bound) for op, bound in bounds):
        return None
    if t.ge is not None and t.le is not None and len(bounds) == 2:
        return f"must be between {t.ge} and {t.le}, got {value}"
    return f"must be {' and '.join(f'{op} {bound}' for op, bound in bounds)}, got {value}"


_COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
}


def _check_table(value: object, st: mi.StructType, path: str, problems: list[Problem]) -> None:
    if not isinstance(value, dict):
        problems.append(Problem(path, f"expected table, got {_show(value)}"))
        return
    fields = {f.encode_name: f for f in st.fields}
    for key, item in value.items():
        field = fields.get(key) if isinstance(key, str) else None
        if field is None:
            problems.append(Problem(_join(path, key), _unknown_key_message(str(key), item, path, fields)))
            continue
        _check(item, field.type, _join(path, key), problems)
    for name, field in fields.items():
        if field.required and name not in value:
            problems.append(Problem(_join(path, name), "required option is missing"))


def _unknown_key_message(key: str, value: object, path: str, fields: Mapping[str, mi.Field]) -> str:
    kind = "section" if isinstance(value, dict) else "option"
    message = f"unknown {kind}"
    close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
    if not close:  # case typos ("Port") are common and scored low by difflib on short names
        close = [name for name in fields if name.lower() == key.lower()][:1]
    if close:
        return f"{message} (did you mean {_join(path, close[0])!r}?)"
    elsewhere = [p for p in _leaf_index().get(key, []) if p.rsplit(".", 1)[0] != path]
    if elsewhere:
        return f"{message} (did you mean {elsewhere[0]!r}? it belongs in [{elsewhere[0].rsplit('.', 1)[0]}])"
    return f"{message}; known here: {', '.join(fields)}"


def _cross_check(data: Mapping[Any, Any], problems: list[Problem]) -> None:
    """Rules spanning several fields. Presence-based, so they hold even when a value had a type error."""
    coordinator = data.get("coordinator")
    notify = coordinator.get("notify") if isinstance(coordinator, dict) else None
    if isinstance(notify, dict) and None not in (notify.get("webhook_url"), notify.get("url_file")):
        problems.append(
            Problem("coordinator.notify.url_file", "mutually exclusive with webhook_url; keep one of them")
        )
    bus = data.get("bus")
    if not isinstance(bus, dict):
        return

    def given(key: str) -> bool:
        return bus.get(key) is not None

    if given("password") and given("password_file"):
        problems.append(
            Problem("bus.password_file", "mutually exclusive with bus.password; keep one of them")
        )
    if given("username") and not (given("password") or given("password_file")):
        problems.append(Problem("bus.username", "a user name needs a password: set bus.password_file"))
    if not given("username") and (given("password") or given("password_file")):
        key = "password" if given("password") else "password_file"
        problems.append(
            Problem(f"bus.{key}", "a password needs bus.username (MQTT sends none without a user name)")
        )
    if given("ca_file") and bus.get("tls") is not True:
        problems.append(Problem("bus.ca_file", "is set but bus.tls is not true; set tls = true or remove it"))
    defaults = BusConfig()
    low = bus.get("reconnect_min_s", defaults.reconnect_min_s)
    high = bus.get("reconnect_max_s", defaults.reconnect_max_s)
    numbers = all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in (low, high)
    )
    if numbers and low > high:
        if "reconnect_min_s" in bus:
            default = "" if "reconnect_max_s" in bus else ", the default"
            message = f"must not exceed bus.reconnect_max_s ({high}{default}), got {low}"
            problems.append(Problem("bus.reconnect_min_s", message))
        else:
            message = f"must not be below bus.reconnect_min_s ({low}, the default), got {high}"
            problems.append(Problem("bus.reconnect_max_s", message))


# --------------------------------------------------------------------------------------------------
# Documentation


class Option(NamedTuple):
    """One leaf option, for ``ftd check-config --explain``."""

    path: str
    type: str
    default: str
    doc: str


def describe_options() -> list[Option]:
    """Every leaf option of :class:`Config`: dotted path, type (with bounds), default (TOML syntax, or
    ``unset``) and description, in declaration order. Derived from the structs themselves."""
    options: list[Option] = []
    _describe(_config_info(), "", options)
    return options


def _describe(st: mi.StructType, prefix: str, out: list[Option]) -> None:
    for field in st.fields:
        path = _join(prefix, field.encode_name)
        inner, _ = _unwrap(field.type)
        if isinstance(inner, mi.StructType):
            _describe(inner, path, out)
            continue
        if field.default is not msgspec.NODEFAULT:
            default: object = field.default
        elif field.default_factory is not msgspec.NODEFAULT:
            default = field.default_factory()
        else:
            default = msgspec.NODEFAULT
        out.append(Option(path, _type_label(field.type), _toml_value(default), _description(field.type)))


def _description(t: mi.Type) -> str:
    while isinstance(t, mi.Metadata):
        text = (t.extra_json_schema or {}).get("description")
        if text:
            return str(text)
        t = t.type
    return ""


def _type_label(t: mi.Type) -> str:
    t, extra = _unwrap(t)
    if isinstance(t, mi.UnionType):
        members = [m for m in t.types if not isinstance(m, mi.NoneType)]
        return " or ".join(_type_label(m) for m in members)
    if isinstance(t, mi.ListType):
        return f"array of {_type_label(t.item_type)}"
    notes: list[str] = []
    if isinstance(t, mi.IntType | mi.FloatType):
        if t.ge is not None and t.le is not None:
            notes.append(f"{t.ge}..{t.le}")
        else:
            for op, bound in ((">=", t.ge), (">", t.gt), ("<=", t.le), ("<", t.lt)):
                if bound is not None:
                    notes.append(f"{op} {bound}")
    if isinstance(t, mi.StrType):
        if t.max_length is not None:
            notes.append(f"at most {t.max_length} chars")
        if t.pattern is not None:
            notes.append(str(extra.get("hint", f"matching {t.pattern}")))
    if "choices" in extra:
        notes.append("one of " + ", ".join(_toml_value(c) for c in extra["choices"]))
    base = _type_name(t)
    return f"{base} ({'; '.join(notes)})" if notes else base


def _toml_value(value: object) -> str:
    if value is msgspec.NODEFAULT:
        return "required"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return msgspec.json.encode(value).decode()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return str(value)
