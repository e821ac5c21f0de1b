"""The config file's schema: typed, frozen msgspec Structs with their defaults and documentation.

What: one Struct per TOML table, from :class:`Config` (the whole file) down. The struct and field
names are a contract other modules code against. Every field carries its own documentation and
bounds as ``Annotated[..., msgspec.Meta(description=..., ge=..., ...)]``; ``Meta(extra=...)`` adds
what msgspec has no slot for (see the constrained types below).

Why here and nowhere else: the validator (:mod:`ftd.config.validate`) and ``ftd check-config
--explain`` (:mod:`ftd.config.explain`) read these structs through :func:`msgspec.inspect.type_info`,
so a new field or section is validated and documented the moment it is declared: give it a
description and bounds, nothing else to update. Every table forbids unknown fields.
"""

from __future__ import annotations

import socket
from typing import Annotated, Any

import msgspec

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
PINNED_JOB_POLICIES = ("hold", "stop")  # ftd.coordinator.actions.pinned
HANG_UNCLEAR_POLICIES = ("restart", "stop")  # ftd.rules.hang: a hang whose culprit is not known
DRIFT_ACTIONS = ("warn", "preflight_fail", "no_spare")  # ftd.coordinator.model.inventory
DRIFT_FIELDS = ("driver", "cuda", "vbios", "nic_firmware", "ofed", "nccl", "kernel", "os")  # ftd.platform
DEFAULT_DRIFT_FIELDS = (
    "driver",
    "cuda",
    "vbios",
    "nic_firmware",
    "ofed",
    "kernel",
    "os",
)
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
INFINIBAND_CHOICES = ("auto", "yes", "no")  # agent.job_checks.infiniband
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
    cert_file: Annotated[
        NonEmptyStr | None,
        _doc(
            "Client certificate (PEM) for mutual TLS (needs tls = true and key_file); its CN is the "
            "identity the broker's ACL uses (the node name, or 'coordinator')."
        ),
    ] = None
    key_file: Annotated[
        NonEmptyStr | None, _doc("Private key (PEM) of cert_file; keep it readable by the daemon only.")
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
    rack_broker: Annotated[
        NodeName | None,
        _doc(
            "Agents in a bridged broker tier: the name of the rack broker `host` is (the rack of its "
            "bridge's notification topic ftd/v1/bridges/<rack>/state). The agent says it in its "
            "status, and the coordinator treats the node as gone when that bridge goes down. "
            "Unset: connected to the core broker (or the only one)."
        ),
    ] = None


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
        _doc(
            "GPUs this node should have; fewer is a gpu_missing event. Unset: no count check, but "
            "preflight fails a node whose NVML sees 0 GPUs (0 here: a node without GPUs)."
        ),
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
    gpu_root: Annotated[
        NonEmptyStr,
        _doc(
            "Root under which the agent looks for NVIDIA GPUs when NVML does not work "
            "(proc/driver/nvidia/gpus, dev/nvidia*, sys/bus/pci/devices): with GPUs there it is a node "
            "condition, without it is not a problem. A container with the host's /proc, /dev and /sys "
            "mounted elsewhere names that mount."
        ),
    ] = "/"
    ecc_correctable_rate_per_hour: Annotated[
        float,
        _doc(
            "Correctable (SBE) ECC errors per hour above which an ecc event (correctable_rate) is sent.", gt=0
        ),
    ] = 1000.0
    ecc_correctable_window_s: Annotated[
        PositiveSeconds, _doc("The correctable-ECC rate is measured over the samples of this window.")
    ] = 3600.0
    ecc_correctable_min_span_s: Annotated[
        PositiveSeconds, _doc("... once its samples span at least this many seconds (no rate from one poll).")
    ] = 60.0
    thermal_sustained_s: Annotated[
        PositiveSeconds,
        _doc("A thermal/power-brake/HW-slowdown throttle reason set this long is sustained (thermal error)."),
    ] = 300.0


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
    forecast_min_span_s: Annotated[
        PositiveSeconds,
        _doc("A fill rate needs samples spanning at least this many seconds (no forecast from a burst)."),
    ] = 120.0
    forecast_min_samples: Annotated[
        int, _doc("A fill rate needs at least this many samples in forecast_window_s.", ge=4)
    ] = 5
    shared_mounts: Annotated[
        list[NonEmptyStr],
        _doc(
            "Mount points many nodes share whose fstype ftd does not know as shared (NFS, Lustre, GPFS, "
            "BeeGFS... are): their trouble is one cluster incident, never a node drain."
        ),
    ] = msgspec.field(default_factory=list)
    save_path_interval_s: Annotated[
        PositiveSeconds,
        _doc("Seconds between two checks of the checkpoint directories the ranks registered."),
    ] = 30.0
    save_path_timeout_s: Annotated[
        PositiveSeconds, _doc("A checkpoint directory whose statvfs takes longer is reported unresponsive.")
    ] = 5.0


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
        PositiveSeconds,
        _doc(
            "A rank silent this long after a heartbeat is reported (rank_heartbeat_lost), once per silence."
        ),
    ] = 60.0
    startup_timeout_s: Annotated[
        PositiveSeconds,
        _doc(
            "A rank that registered but never sent a heartbeat yet (importing its framework, loading "
            "data, compiling) is reported only after this long; a job can ask for its own "
            "(Client(startup_timeout_s=...) or $FTD_STARTUP_TIMEOUT_S)."
        ),
    ] = 600.0
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


class AgentMetricsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The agent's own Prometheus metrics (``ftd.agent.metrics``): spool, kernel log, watchers, events."""

    host: Annotated[
        NonEmptyStr, _doc("Address to serve /metrics on (keep it on loopback or a management network).")
    ] = "127.0.0.1"
    port: Annotated[int, _doc("TCP port for /metrics; 0: not served.", ge=0, le=65535)] = 0


class SpoolConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The on-disk outbox spool under agent.state_dir (events survive broker outages and agent restarts)."""

    max_mb: Annotated[
        float, _doc("Largest spool (live entries); the oldest lowest-severity go first.", gt=0)
    ] = 64.0
    fsync: Annotated[
        bool, _doc("fdatasync every record (survives power loss; costs a disk flush per event).")
    ] = False


class PreflightConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Node checks before (re)entering service (``ftd preflight``; ``ftd.agent.preflight``)."""

    gpu_compute: Annotated[
        bool, _doc("Allocate memory and run a small matmul on each GPU (needs torch and a GPU).")
    ] = True
    dcgm: Annotated[bool, _doc("Run dcgmi diag -r 1 when DCGM is installed.")] = True
    dcgm_timeout_s: Annotated[PositiveSeconds, _doc("Deadline for dcgmi diag -r 1.")] = 300.0
    nccl: Annotated[
        bool, _doc("Single-node NCCL all-reduce across the node's GPUs (more than one GPU, torch).")
    ] = True
    nccl_timeout_s: Annotated[PositiveSeconds, _doc("Deadline for the NCCL all-reduce.")] = 120.0
    commands: Annotated[
        list[NonEmptyStr], _doc("The site's own checks: shell command lines that must each exit 0.")
    ] = msgspec.field(default_factory=list)
    command_timeout_s: Annotated[PositiveSeconds, _doc("Deadline for each of the commands.")] = 60.0
    allow_unchecked: Annotated[
        bool,
        _doc(
            "Pass a preflight that could run no check at all (every one skipped); off: it fails "
            "(ftd preflight exits 3) so a broken driver never returns a node to service."
        ),
    ] = False
    # Burn-in (ftd preflight --burn-in; ftd.agent.preflight.burn_in; thresholds: catalog burn_in.toml).
    burn_in_dcgm_level: Annotated[
        int, _doc("The burn-in's dcgmi diag run level (-r): 3 is the long one, 4 the longest.", ge=1, le=4)
    ] = 3
    burn_in_dcgm_timeout_s: Annotated[PositiveSeconds, _doc("Deadline of the burn-in's dcgmi diag.")] = 3600.0
    burn_in_memtest_timeout_s: Annotated[
        PositiveSeconds, _doc("Deadline of the burn-in's GPU memory test (all GPUs).")
    ] = 1800.0
    burn_in_matmul_timeout_s: Annotated[
        PositiveSeconds, _doc("Deadline of the burn-in's matrix-multiply probe (all GPUs).")
    ] = 600.0
    burn_in_fleet_tflops: Annotated[
        float,
        _doc(
            "The fleet's matmul TFLOPS per GPU to compare with (the peers' median); 0: none, only the "
            "profile's figure and the node's own GPUs.",
            ge=0,
        ),
    ] = 0.0


class AgentKubernetesConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The node's ftd condition on its Kubernetes Node, like node-problem-detector's
    (``ftd.agent.node_conditions``)."""

    node_conditions: Annotated[
        bool, _doc("Write ftd's view (active critical conditions) as a condition of this node's Node.")
    ] = False
    condition_type: Annotated[NonEmptyStr, _doc("The node condition's type.")] = "FtdProblem"
    host: Annotated[
        NonEmptyStr | None, _doc("API server URL; unset: in-cluster (KUBERNETES_SERVICE_HOST).")
    ] = None
    token_file: Annotated[NonEmptyStr, _doc("Bearer token, re-read on every write.")] = (
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )
    ca_file: Annotated[NonEmptyStr | None, _doc("CA bundle of the API server; unset: system CAs.")] = (
        "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    )
    resync_s: Annotated[
        PositiveSeconds, _doc("Write the condition at least this often (a heartbeat; at once on change).")
    ] = 60.0
    timeout_s: Annotated[PositiveSeconds, _doc("Deadline for one write.")] = 5.0


MetadataUrl = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^https?://[^/?#\s]+\Z",
        extra={"hint": "scheme and host (and port) only, e.g. http://169.254.169.254"},
    ),
]


class CloudConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Cloud interruption notices from the instance metadata servers (``ftd.agent.watchers.cloud``).
    Nothing is polled unless a provider is enabled."""

    aws: Annotated[bool, _doc("Poll AWS IMDSv2 for spot instance-action and rebalance notices.")] = False
    gcp: Annotated[bool, _doc("Poll the GCP metadata server for preemption and maintenance events.")] = False
    azure: Annotated[bool, _doc("Poll Azure Scheduled Events.")] = False
    aws_url: Annotated[MetadataUrl, _doc("AWS IMDS base URL.")] = "http://169.254.169.254"
    gcp_url: Annotated[MetadataUrl, _doc("GCP metadata server base URL.")] = "http://metadata.google.internal"
    azure_url: Annotated[MetadataUrl, _doc("Azure Instance Metadata Service base URL.")] = (
        "http://169.254.169.254"
    )
    azure_resource: Annotated[
        NonEmptyStr | None,
        _doc("This VM's name in Scheduled Events' Resources; unset: the agent's node name."),
    ] = None
    interval_s: Annotated[
        float, _doc("Seconds between two polls of each endpoint (AWS advises 5).", gt=0, le=60)
    ] = 5.0
    timeout_s: Annotated[
        float, _doc("Deadline for one request; a slower endpoint counts an error.", gt=0, le=30)
    ] = 2.0
    backoff_max_s: Annotated[
        float,
        _doc("An endpoint that fails is retried after a doubling wait, at most this long.", gt=0, le=3600),
    ] = 120.0
    max_body_bytes: Annotated[int, _doc("A larger response is refused (too_large).", ge=1024, le=1 << 22)] = (
        65536
    )
    max_ahead_s: Annotated[
        float, _doc("A notice whose deadline is further ahead is refused as bogus (deadline_far).", gt=0)
    ] = 86400.0
    past_slack_s: Annotated[
        float, _doc("A notice whose deadline passed longer ago is refused (deadline_past).", ge=0, le=600)
    ] = 10.0
    aws_rebalance_horizon_s: Annotated[
        float,
        _doc("A rebalance recommendation has no deadline: it is reported as due this long after it.", gt=0),
    ] = 600.0


# Issues #35 (fabric health) and #36 (platform truth): one table per part, each part's own fields.


class FabricConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Passive fabric health: IB/RoCE/NVLink counters as rates, PCIe and port link state (issue #35)."""

    enabled: Annotated[bool, _doc("Read the fabric's counters and link states.")] = True
    interval_s: Annotated[
        float,
        _doc("Seconds between two reads; a counter crossing its threshold is reported at the next.", ge=1),
    ] = 30.0
    window_s: Annotated[
        float,
        _doc("The trailing window of the per-hour rates and of any_increase rules, in seconds.", ge=60),
    ] = 3600.0
    nvml: Annotated[bool, _doc("Read NVLink error counters and GPU PCIe links through NVML too.")] = True
    ethtool: Annotated[
        NonEmptyStr, _doc("The ethtool binary whose `-S` gives a RoCE port's *_phy counters.")
    ] = "ethtool"
    ethtool_timeout_s: Annotated[float, _doc("Longest wait for one `ethtool -S`.", gt=0, le=60)] = 5.0
    read_timeout_s: Annotated[
        float,
        _doc("Longest wait for one whole read (sysfs, ethtool, NVML); past it the read is skipped.", gt=0),
    ] = 20.0
    root: Annotated[
        NonEmptyStr,
        _doc(
            "Root under which sys/class/infiniband and sys/bus/pci/devices are read; a container with "
            "the host's /sys mounted elsewhere names that mount's parent."
        ),
    ] = "/"


class PairTestsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Active pair tests this agent serves and runs: bandwidth and latency to another agent (issue #35)."""

    enabled: Annotated[bool, _doc("Serve and run pair tests (never while a job trains here).")] = True
    port: Annotated[
        int, _doc("TCP port the pair-test server listens on (all the node's addresses).", ge=1, le=65535)
    ] = 7411
    host: Annotated[
        str,
        _doc(
            "The address the pair-test server listens on: all of the node's (0.0.0.0) or one, e.g. the "
            "fabric interface's, so tests move over the network jobs use and nowhere else."
        ),
    ] = "0.0.0.0"
    key_file: Annotated[
        str,
        _doc(
            "File holding the fleet's pair-test key (the same on every agent; root-readable only). Both "
            "ends of a test prove they hold it (HMAC over fresh nonces); empty or unreadable: no server "
            "runs and tests are skipped with that reason."
        ),
    ] = ""
    max_bytes: Annotated[
        int,
        _doc(
            "Bytes one direction of a bulk test may move at most (the server caps a peer's ask too).",
            ge=1 << 20,
            le=1 << 30,
        ),
    ] = 16 << 20
    timeout_s: Annotated[
        float, _doc("Longest a pair test may take, all phases; a third per direction.", gt=0, le=120)
    ] = 10.0
    pings: Annotated[
        int, _doc("Small-message round trips per test (the median is reported).", ge=1, le=64)
    ] = 5
    allreduce_bytes: Annotated[
        int,
        _doc(
            "The all-reduce step of a bulk test: a 2-rank gloo all-reduce of this many bytes between the "
            "pair, each rank a process of its own (torch needed on both nodes, else skipped with the "
            "reason); the smaller of the two sides' values is used; 0: no step.",
            ge=0,
            le=1 << 30,
        ),
    ] = 8 << 20
    allreduce_timeout_s: Annotated[
        float,
        _doc(
            "Longest the all-reduce step may take, torch's import and the rendezvous included (on top of "
            "timeout_s); past it both ranks are killed and the test has failed.",
            gt=0,
            le=600,
        ),
    ] = 60.0
    allreduce_python: Annotated[
        str,
        _doc(
            "The Python that runs the all-reduce ranks (a training environment's, with torch); empty: "
            "the agent's own. The rank program imports nothing of ftd."
        ),
    ] = ""


class InventoryConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What this node runs: driver, firmware, library and kernel versions, on change (issue #36)."""

    enabled: Annotated[bool, _doc("Report this node's inventory at start and on change.")] = True
    interval_s: Annotated[
        float,
        _doc("How often the facts are read again; a change is reported at the next read.", ge=1, le=86400),
    ] = 300.0
    timeout_s: Annotated[
        float,
        _doc("Bound on one command (ofed_info -s); a read not done in twice this is reported unknown.",
             gt=0, le=120),
    ] = 5.0  # fmt: skip
    ofed_command: Annotated[
        str,
        _doc("The command whose '-s' prints the OFED release (MLNX_OFED's ofed_info); empty: not run."),
    ] = "ofed_info"
    resend_s: Annotated[
        float,
        _doc(
            "An unchanged inventory is sent again this often (it is also sent when the coordinator "
            "comes online: a restart, a new leader); each is an event in the ledger; 0: never.",
            ge=0,
        ),
    ] = 86400.0


class JobChecksConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A job's RDMA path checked at its start: NCCL's transport, peermem, memlock, /dev/shm (issue #36)."""

    enabled: Annotated[bool, _doc("Check each job's communication path when it starts.")] = True
    min_memlock_mib: Annotated[
        float,
        _doc(
            "A rank's Max locked memory below this (MiB) on an InfiniBand node is a slow-path cause "
            "(memlock_low); 'unlimited' always passes.",
            ge=0,
        ),
    ] = 1024.0
    min_shm_mib: Annotated[
        float, _doc("The /dev/shm a rank sees smaller than this (MiB) is a cause (shm_small).", ge=0)
    ] = 1024.0
    infiniband: Annotated[
        str,
        _doc(
            "Whether this node is on an InfiniBand fabric (the IB-only checks: NCCL over sockets, "
            "peermem, memlock); auto: a device in /sys/class/infiniband.",
            extra={"choices": INFINIBAND_CHOICES},
        ),
    ] = "auto"
    acs: Annotated[
        bool, _doc("Read the ACS Control of the bridges above the GPUs and IB devices (needs root).")
    ] = True
    rendezvous: Annotated[
        bool, _doc("Connect to the rank's MASTER_ADDR:MASTER_PORT (a refused or silent port is a cause).")
    ] = True
    connect_timeout_s: Annotated[float, _doc("Deadline of one rendezvous connect attempt.", gt=0, le=10)] = (
        2.0
    )
    connect_attempts: Annotated[
        int,
        _doc(
            "Rendezvous connect attempts before the port is judged unreachable (probed beside the "
            "other checks: the first event does not wait for it).",
            ge=1,
            le=60,
        ),
    ] = 10
    connect_retry_s: Annotated[
        float,
        _doc(
            "Pause between rendezvous attempts (rank 0 may not listen yet when its ranks register).",
            ge=0,
            le=10,
        ),
    ] = 2.0


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
    socket_group: Annotated[
        NonEmptyStr | Annotated[int, msgspec.Meta(ge=0)] | None,
        _doc(
            "Group (name or gid) the trainer socket belongs to: the users who run training jobs. "
            "Unset: the agent's own group (root), so ordinary users' trainers cannot connect."
        ),
    ] = None
    socket_mode: Annotated[
        int,
        _doc(
            "Permission bits of the trainer socket, octal in TOML: 0o660 (= 432, the default) lets the "
            "owner and socket_group connect.",
            ge=0,
            le=0o777,
        ),
    ] = 0o660
    outbox_max: Annotated[
        int, _doc("Events kept while the broker is unreachable (oldest dropped first).", ge=1)
    ] = 10000
    # True: report what is already in the log; False: only new records
    kmsg_from_start: Annotated[
        bool, _doc("Report records already in the kernel log at first start (else only new ones).")
    ] = False
    addresses: Annotated[
        Annotated[list[NonEmptyStr], msgspec.Meta(max_length=64)] | None,
        _doc(
            "This node's IP addresses and host names, announced in its status so the coordinator can "
            "resolve a peer another node's communication error names by address to this node; unset: "
            "discovered (host name, interface addresses; loopback and link-local left out)."
        ),
    ] = None

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
    metrics: Annotated[AgentMetricsConfig, _doc("The agent's Prometheus metrics.")] = msgspec.field(
        default_factory=AgentMetricsConfig
    )
    preflight: Annotated[PreflightConfig, _doc("Preflight checks (ftd preflight, return to service).")] = (
        msgspec.field(default_factory=PreflightConfig)
    )
    kubernetes: Annotated[
        AgentKubernetesConfig, _doc("Kubernetes node condition written by the agent (off by default).")
    ] = msgspec.field(default_factory=AgentKubernetesConfig)
    cloud: Annotated[CloudConfig, _doc("Cloud interruption notices (off by default).")] = msgspec.field(
        default_factory=CloudConfig
    )
    fabric: Annotated[FabricConfig, _doc("Fabric counters and link states (issue #35).")] = msgspec.field(
        default_factory=FabricConfig
    )
    pair_tests: Annotated[PairTestsConfig, _doc("Active pair tests between agents (issue #35).")] = (
        msgspec.field(default_factory=PairTestsConfig)
    )
    inventory: Annotated[InventoryConfig, _doc("This node's versions (issue #36).")] = msgspec.field(
        default_factory=InventoryConfig
    )
    job_checks: Annotated[JobChecksConfig, _doc("Each job's RDMA path at its start (issue #36).")] = (
        msgspec.field(default_factory=JobChecksConfig)
    )

    def resolved_node(self) -> str:
        """``node``, or the short host name when unset (the name Slurm usually knows the node by)."""
        return self.node or socket.gethostname().split(".", 1)[0]


CLIENTLESS_MODES = ("batch", "full")


class ClientlessPartition(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The signal flag for one partition's jobs without the client."""

    name: Annotated[NonEmptyStr, _doc("Slurm partition name.")]
    mode: Annotated[
        str,
        _doc(
            "batch: signal the batch script's shell only; full: every process of the job.",
            extra={"choices": CLIENTLESS_MODES},
        ),
    ]


class ClientlessConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """checkpoint_restart of a job with no rank registered (no ftd.client): Slurm's signal convention
    (``ftd.coordinator.actions.slurm_signal``)."""

    enabled: Annotated[
        bool,
        _doc("Signal a job without the client (scancel --signal) before requeueing it; off: requeue only."),
    ] = True
    signal: Annotated[NonEmptyStr, _doc("Signal sent (scancel --signal=...).")] = "USR1"
    mode: Annotated[
        str,
        _doc(
            "batch: scancel --batch (the batch script traps it); full: scancel --full (every process).",
            extra={"choices": CLIENTLESS_MODES},
        ),
    ] = "batch"
    partitions: Annotated[
        list[ClientlessPartition], _doc("Per-partition mode, overriding mode for that partition's jobs.")
    ] = msgspec.field(default_factory=list)
    grace_s: Annotated[
        PositiveSeconds,
        _doc("How long the job may take to checkpoint and requeue itself or exit before it is requeued."),
    ] = 120.0
    poll_s: Annotated[PositiveSeconds, _doc("How often the job's state is read while waiting.")] = 1.0
    scancel: Annotated[NonEmptyStr, _doc("scancel executable (name on $PATH or absolute path).")] = "scancel"


class SlurmInterruptionsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Slurm's announced interruptions of running jobs (issue #37,
    ``ftd.coordinator.intake.scheduler_interruptions``): preemption and an approaching time limit."""

    enabled: Annotated[bool, _doc("Poll running jobs for PreemptTime and an approaching EndTime.")] = True
    interval_s: Annotated[
        PositiveSeconds, _doc("How often the running jobs are looked up (one scontrol call at a time).")
    ] = 15.0
    time_limit_window_s: Annotated[
        float,
        _doc(
            "EndTime within this many seconds: a slurm_time_limit interruption, on which the job is "
            "saved and stopped at once; more than its slowest save (p95) plus the stop margin plus "
            "interval_s, not much more (training stops that early).",
            ge=0,
            le=86400,
        ),
    ] = 180.0
    preempt_grace_s: Annotated[
        float,
        _doc("The preempting partition's/QOS's GraceTime (scontrol show job does not show it).", ge=0),
    ] = 0.0
    kill_wait_s: Annotated[
        float, _doc("slurm.conf KillWait: SIGKILL this long after the time limit's SIGTERM.", ge=0)
    ] = 30.0
    every_job: Annotated[
        bool,
        _doc(
            "Also watch the running jobs no agent reported ranks of (jobs without the client: saved by "
            "coordinator.slurm.clientless's signal convention); one scontrol show job -o per poll."
        ),
    ] = False


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
    clientless: Annotated[ClientlessConfig, _doc("Jobs without the client: Slurm's signal convention.")] = (
        msgspec.field(default_factory=ClientlessConfig)
    )
    interruptions: Annotated[
        SlurmInterruptionsConfig, _doc("Preemption and time limits announced for running jobs (issue #37).")
    ] = msgspec.field(default_factory=SlurmInterruptionsConfig)


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


NOTIFY_FORMATS = ("generic", "slack", "alertmanager")
SEVERITIES = ("info", "warning", "error", "critical")


class WebhookConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where a webhook notification goes and in what form: the fields a notify destination and the
    top-level ``[coordinator.notify]`` (its first destination) share."""

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
    format: Annotated[
        str,
        _doc(
            "Payload: generic (ftd's JSON), slack (text + blocks: Slack, Mattermost) or alertmanager "
            "(the JSON Alertmanager posts to webhook receivers).",
            extra={"choices": NOTIFY_FORMATS},
        ),
    ] = "generic"
    min_severity: Annotated[
        str,
        _doc(
            "Least severity sent here (a notify's params.severity, else warning).",
            extra={"choices": SEVERITIES},
        ),
    ] = "info"


class NotifyDestinationConfig(WebhookConfig, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One place notifications go: a webhook, its payload format and the least severity it wants."""

    name: Annotated[NonEmptyStr | None, _doc("Name shown in the action's detail and logs.")] = None


class NotifyConfig(WebhookConfig, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``notify`` action: webhooks (generic JSON, Slack-compatible, Alertmanager payloads).

    ``webhook_url``/``url_file`` (with ``format``, ``min_severity``) is one destination; each
    ``[[coordinator.notify.destinations]]`` table is another. None at all: notifications are only
    logged, and the action ends ``logged``."""

    destinations: Annotated[
        list[NotifyDestinationConfig],
        _doc("More webhooks, each with its own url or url_file, format and min_severity."),
    ] = msgspec.field(default_factory=list)
    timeout_s: Annotated[PositiveSeconds, _doc("Deadline for one webhook POST.")] = 10.0
    retries: Annotated[int, _doc("Retries after a failed POST (exponential backoff).", ge=0, le=20)] = 3

    def all_destinations(self) -> list[NotifyDestinationConfig]:
        """The top-level webhook (when set) first, then ``destinations``."""
        out = list(self.destinations)
        if self.webhook_url or self.url_file:
            top = NotifyDestinationConfig(
                name="default",
                webhook_url=self.webhook_url,
                url_file=self.url_file,
                format=self.format,
                min_severity=self.min_severity,
            )
            out.insert(0, top)
        return out


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
    failed_retry_s: Annotated[
        float,
        _doc(
            "After a failed action, seconds before the same action may be tried again (its retry, "
            "an operator's own); a failed action never starts the full cooldown_s.",
            ge=0,
        ),
    ] = 30.0
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
    app_fault_restart_limit: Annotated[
        int,
        _doc(
            "Application faults (RESTART_APP Xids, CUDA/NCCL log errors): restarts of a job for the same "
            "fault within app_fault_window_s before ftd stops restarting it and notifies instead.",
            ge=0,
        ),
    ] = 3
    app_fault_window_s: Annotated[
        PositiveSeconds, _doc("Window over which app_fault_restart_limit counts a job's restarts.")
    ] = 3600.0
    app_fault_backoff_s: Annotated[
        float,
        _doc("Crash-loop backoff before a job's second restart for one fault (doubles each time).", ge=0),
    ] = 30.0
    app_fault_backoff_max_s: Annotated[
        float, _doc("Longest crash-loop backoff before an application-fault restart.", ge=0)
    ] = 600.0


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
    allowed_hosts: Annotated[
        list[NonEmptyStr],
        _doc(
            "Host names (the HTTP Host header, port ignored) the API answers to besides host, "
            "localhost, 127.0.0.1 and ::1; any other is refused with 421 (DNS rebinding). Add the "
            'names a proxy or operators use; "*" turns the check off.'
        ),
    ] = msgspec.field(default_factory=list)
    auth_failures_allowed: Annotated[
        int,
        _doc(
            "Failed token checks from one client address before it must wait (429, Retry-After); "
            "a correct token resets the count. Other addresses are never affected.",
            ge=1,
        ),
    ] = 5
    auth_backoff_s: Annotated[
        PositiveSeconds,
        _doc("First wait after too many failed token checks; doubles with each further failure."),
    ] = 1.0
    auth_backoff_max_s: Annotated[PositiveSeconds, _doc("Longest wait after failed token checks.")] = 300.0


class PlacementConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Authority follows placement (``ftd.coordinator.intake.placement``): presence, heartbeats and acks for a
    job are accepted only from nodes the scheduler runs it on."""

    enforce: Annotated[
        bool, _doc("Check every job claim against the scheduler (no effect with scheduler = none).")
    ] = True
    ttl_s: Annotated[PositiveSeconds, _doc("How long a job's node list from the scheduler is trusted.")] = (
        30.0
    )
    refresh_s: Annotated[
        PositiveSeconds,
        _doc("A node not in a job's cached list is looked up again at most this often per job."),
    ] = 2.0
    lookup_timeout_s: Annotated[
        PositiveSeconds, _doc("Longest wait for one scheduler lookup (the bus pump waits on it).")
    ] = 3.0
    retry_s: Annotated[
        PositiveSeconds,
        _doc(
            "While the scheduler cannot answer, messages are held (never accepted unverified) and "
            "retried this long, then refused."
        ),
    ] = 60.0


HA_LEDGERS = ("sqlite", "postgresql")


class HaConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Active/standby coordinators (``ftd.coordinator.ha.runner``): a leader lease with a fencing epoch in a
    PostgreSQL ledger they share. With ``ledger = "sqlite"`` (the default) there is one coordinator
    and ``ledger_path`` is its ledger."""

    ledger: Annotated[
        str,
        _doc(
            "Ledger backend: sqlite (one coordinator, coordinator.ledger_path) or postgresql (any "
            "number of coordinators on coordinator.ha.dsn, one active at a time).",
            extra={"choices": HA_LEDGERS},
        ),
    ] = "sqlite"
    dsn: Annotated[
        NonEmptyStr | None,
        _doc(
            "libpq connection string of the shared PostgreSQL ledger (ledger = postgresql), e.g. "
            "'host=db.example port=5432 dbname=ftd user=ftd'; the password is best left to "
            "~/.pgpass or PGPASSWORD."
        ),
    ] = None
    lease_ttl_s: Annotated[
        PositiveSeconds,
        _doc("A leader that has not renewed its lease for this long is replaced by a standby."),
    ] = 5.0
    renew_interval_s: Annotated[
        PositiveSeconds, _doc("How often the leader renews its lease (less than lease_ttl_s).")
    ] = 1.0
    poll_interval_s: Annotated[
        PositiveSeconds, _doc("How often a standby tries to take an expired lease.")
    ] = 0.2
    identity: Annotated[
        NonEmptyStr | None,
        _doc("This coordinator's name in the lease (shown as the leader); unset: {hostname}-{pid}."),
    ] = None
    statement_timeout_s: Annotated[
        PositiveSeconds,
        _doc("Longest wait for one ledger statement; a slower database counts as unavailable."),
    ] = 2.0
    # The standby's warm view (ftd.coordinator.ha.runner.RetainedView): a read-only broker login of its own.
    standby_username: Annotated[
        NonEmptyStr | None,
        _doc(
            "MQTT user of a standby's read-only view of the retained node status (needs "
            "standby_password_file); deploy/mosquitto/acl names it coordinator-standby. Unset on an "
            "authenticated bus (and without standby_cert_file): no view, a takeover then waits for "
            "the retained messages; the coordinator's own login would take over the leader's session."
        ),
    ] = None
    standby_password_file: Annotated[
        NonEmptyStr | None,
        _doc(
            "File holding standby_username's MQTT password (trailing newline ignored); relative: "
            "against $CREDENTIALS_DIRECTORY when set, like bus.password_file."
        ),
    ] = None
    standby_cert_file: Annotated[
        NonEmptyStr | None,
        _doc(
            "Client certificate (PEM) of the standby's view on a mutual-TLS bus (needs bus.tls and "
            "standby_key_file); its CN is the view's identity, e.g. 'coordinator-standby'."
        ),
    ] = None
    standby_key_file: Annotated[
        NonEmptyStr | None, _doc("Private key (PEM) of standby_cert_file; readable by the daemon only.")
    ] = None


class ReturnToServiceConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A node reset by an opted-in rule is drained, then resumed only after its preflight passes (a
    failure drains it for RMA); ``ftd.coordinator.upkeep.return_service``. Off while ``rules`` is empty."""

    rules: Annotated[
        list[NonEmptyStr],
        _doc("Rules whose GPU resets take the node out of service until preflight passes; empty: off."),
    ] = msgspec.field(default_factory=list)
    preflight_deadline_s: Annotated[
        PositiveSeconds, _doc("How long a node's agent gets to run its preflight checks and answer.")
    ] = 900.0
    require_burn_in: Annotated[
        bool,
        _doc(
            "The site requires burn-in: after the preflight passes the node runs its burn-in "
            "(ftd preflight --burn-in) and comes back only when it passed; otherwise it is drained for RMA."
        ),
    ] = False
    burn_in_deadline_s: Annotated[
        PositiveSeconds, _doc("How long a node's agent gets to run its burn-in and answer.")
    ] = 7200.0


class OfflineGraceConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How long a node that left may take to come back before its jobs are moved (node_death)
    (``ftd.coordinator.intake.offline_grace``); any message from the node ends the wait."""

    last_will_s: Annotated[
        float,
        _doc(
            "Grace after the broker's Last Will (the agent, the node or its network died), or after "
            "the bridge of the node's rack broker went down; 0: act at once.",
            ge=0,
            le=3600,
        ),
    ] = 10.0
    clean_stop_s: Annotated[
        float,
        _doc("Grace after an agent's clean stop (a restart, an upgrade); 0: act at once.", ge=0, le=86400),
    ] = 120.0


class SlowRanksConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Slow ranks (issue #33, ``ftd.coordinator.intake.slow_ranks``): a sustained change of a rank's
    step time against its job's own history, attributed to a node or to the job, acted on with a cost
    model (the ``slow_rank`` rule)."""

    enabled: Annotated[bool, _doc("Watch the ranks' step timing for slow ranks.")] = True
    warmup_samples: Annotated[
        int,
        _doc(
            "Timing samples (about one a second per rank) that set a rank's and a job's baseline "
            "before anything can be found.",
            ge=3,
            le=10000,
        ),
    ] = 30
    min_change: Annotated[
        float,
        _doc(
            "The smallest sustained slowdown worth finding, as a fraction (0.25: 25 % slower).", gt=0, le=10
        ),
    ] = 0.25
    swap_cost_s: Annotated[
        PositiveSeconds,
        _doc(
            "What swapping a node for a hot spare costs the job, in seconds of its time (the save, "
            "the restart, the first step again). The default is ftd bench recovery's path without a "
            "spare (the scheduler requeue, 9.8-10.0 s on the development machine); measure yours."
        ),
    ] = 10.0
    remaining_s: Annotated[
        PositiveSeconds,
        _doc(
            "The time a job is assumed to have left when the scheduler does not say (no time limit, "
            "no scheduler, a lookup that failed); Slurm jobs use their TimeLimit minus RunTime."
        ),
    ] = 3600.0
    exclude_after: Annotated[
        int,
        _doc(
            "Slow episodes of one node within repeat_window_s after which the node is drained "
            "(excluded from every job); 0: never.",
            ge=0,
        ),
    ] = 3
    repeat_window_s: Annotated[
        PositiveSeconds, _doc("Window over which exclude_after counts a node's slow episodes.")
    ] = 86400.0
    max_jobs: Annotated[
        int, _doc("Jobs whose step history is kept (the least recently updated is forgotten).", ge=1)
    ] = 4096


class FabricTestsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Pair tests the coordinator schedules: mesh, bisection, spares, return to service (issue #35)."""

    enabled: Annotated[bool, _doc("Schedule pair tests between idle or drained nodes.")] = True
    return_gate: Annotated[
        bool,
        _doc(
            "A node coming back through the return to service also passes a pair test against an idle "
            "peer after its preflight (slow, failed, no idle peer or no answer: drained for RMA). Off by "
            "default: it needs agent.pair_tests.key_file on every agent."
        ),
    ] = False
    auto_bisect: Annotated[
        bool,
        _doc("A pair test judged slow starts a bisection over idle or drained nodes, its slow side first."),
    ] = True
    bisect_cooldown_s: Annotated[
        float, _doc("At most one bisection started by a slow pair test per this many seconds.", ge=0)
    ] = 600.0
    mesh_interval_s: Annotated[
        float,
        _doc(
            "Pingmesh: one probe (handshake and pings, no bulk data) to the next pair of idle nodes, "
            "round-robin, every this often (10 is a low rate); 0: none. Off by default: it needs "
            "agent.pair_tests.key_file on every agent.",
            ge=0,
        ),
    ] = 0.0
    test_spares: Annotated[
        bool,
        _doc(
            "Before a hot spare takes a slot, its agent pair-tests it against the job's slot nodes next "
            "to that slot (while the stopped job runs no rank); slow on its side, or not tested: another "
            "spare, else the scheduler requeue. Off by default: it needs agent.pair_tests.key_file on "
            "every agent, and adds a test to each swap."
        ),
    ] = False
    spare_test_peers: Annotated[
        int, _doc("How many of the job's slot nodes each spare is tested against (test_spares).", ge=1, le=16)
    ] = 2
    spare_busy_wait_s: Annotated[
        float,
        _doc(
            "How long a spare's test is retried while a job node still reports training (its ranks "
            "not yet seen stopped) before the spare counts as untested (test_spares).",
            ge=0,
        ),
    ] = 10.0
    port: Annotated[int, _doc("The agents' pair-test port (agent.pair_tests.port).", ge=1, le=65535)] = 7411
    deadline_s: Annotated[
        float, _doc("How long a pair_test directive may take before the test counts as failed.", gt=0)
    ] = 60.0


class DriftConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Version drift between nodes of one hardware profile, and minimums (issue #36)."""

    enabled: Annotated[bool, _doc("Compare each node's versions with its peers' and the minimums.")] = True
    action: Annotated[
        str,
        _doc(
            "What drift does: warn (shown and logged only), preflight_fail (the node fails preflight, so "
            "it does not return to service), no_spare (never chosen as a hot spare).",
            extra={"choices": DRIFT_ACTIONS},
        ),
    ] = "warn"
    fields: Annotated[
        list[Annotated[str, msgspec.Meta(extra={"choices": DRIFT_FIELDS})]],
        _doc(
            "The facts compared with the peers of the node's hardware profile (nccl is per job: off by "
            "default). Minimums in versions.toml apply whatever this says.",
        ),
    ] = msgspec.field(default_factory=lambda: list(DEFAULT_DRIFT_FIELDS))
    min_peers: Annotated[
        int, _doc("Nodes of a profile reporting a fact before a node's value is compared with theirs.", ge=2)
    ] = 3
    settle_s: Annotated[
        float,
        _doc("Reports gathered this long before drift is judged again (one pass per burst).", gt=0, le=60),
    ] = 1.0


class RmaConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Diagnostic bundles for nodes drained for repair (issue #36)."""

    enabled: Annotated[bool, _doc("Collect a diagnostic bundle when a node is drained for repair.")] = True
    reasons: Annotated[
        list[NonEmptyStr],
        _doc(
            "A drain whose reason holds one of these (case-insensitive) is for repair; ftd's own RMA "
            "drains (params rma = true) always are."
        ),
    ] = msgspec.field(default_factory=lambda: ["RMA", "repair"])
    deadline_s: Annotated[
        PositiveSeconds, _doc("How long a node's agent gets to collect the bundle and answer.")
    ] = 1200.0
    kmsg_window_s: Annotated[
        PositiveSeconds, _doc("The kernel log window the bundle keeps (the last this many seconds).")
    ] = 3600.0
    bug_report_timeout_s: Annotated[
        PositiveSeconds, _doc("Deadline of nvidia-bug-report.sh on the node (killed then, its output kept).")
    ] = 600.0


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
    interruption_stop_margin_s: Annotated[
        PositiveSeconds,
        _doc(
            "Issue #37: before an announced interruption's deadline, the time kept after the save for "
            "the stop to reach every rank; a save is chosen only if its p95 plus this fits in the time left."
        ),
    ] = 5.0
    save_rank_lost_grace_s: Annotated[
        PositiveSeconds,
        _doc(
            "Once a rank that has not acked a save has left its agent (its process died), how much "
            "longer the other ranks get to ack, instead of the rest of save_deadline_s: a dead rank "
            "never acks, and its peers wait for it in a collective."
        ),
    ] = 5.0
    checkpoint_age_limit_s: Annotated[
        PositiveSeconds,
        _doc(
            "How old a job's newest verified checkpoint (at any level) may grow before the "
            "FtdCheckpointStale alert fires (exported as ftd_checkpoint_age_limit_seconds); only jobs "
            "that report their checkpoints (issue #34) are judged."
        ),
    ] = 7200.0
    disabled_rules: Annotated[list[NonEmptyStr], _doc("Rules not loaded at all.")] = msgspec.field(
        default_factory=list
    )
    rule_dirs: Annotated[
        list[NonEmptyStr], _doc("Extra directories of rule modules (besides entry-point plugins).")
    ] = msgspec.field(default_factory=list)
    rules_file: Annotated[
        NonEmptyStr | list[NonEmptyStr] | None,
        _doc(
            "Declarative rule packs (TOML, [[rule]] tables): one file, a list of files, or directories "
            "whose *.toml packs are all loaded (sorted by name); rule names unique across packs; unset: none."
        ),
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
    slow_ranks: Annotated[
        SlowRanksConfig, _doc("Slow ranks: found from step timing, attributed, acted on with a cost model.")
    ] = msgspec.field(default_factory=SlowRanksConfig)
    fabric: Annotated[FabricTestsConfig, _doc("Pair tests: mesh, bisection, spares (issue #35).")] = (
        msgspec.field(default_factory=FabricTestsConfig)
    )
    drift: Annotated[DriftConfig, _doc("Version drift and minimums (issue #36).")] = msgspec.field(
        default_factory=DriftConfig
    )
    rma: Annotated[RmaConfig, _doc("Diagnostic bundles on drains for repair (issue #36).")] = msgspec.field(
        default_factory=RmaConfig
    )
    hang_evidence_deadline_s: Annotated[
        PositiveSeconds,
        _doc(
            "How long agents get to answer a collect_hang_evidence directive (diagnose_hang: py-spy, "
            "process state, flight recorder and NCCL RAS of every rank of a hung job); the verdict follows."
        ),
    ] = 15.0
    hang_unclear: Annotated[
        str,
        _doc(
            "A hang whose verdict names no culprit with confidence (job-wide, unknown): 'restart' the job "
            "in place (no node excluded), or 'stop' it without a restart; either way it is notified.",
            extra={"choices": HANG_UNCLEAR_POLICIES},
        ),
    ] = "restart"
    offline_grace: Annotated[
        OfflineGraceConfig,
        _doc("How long a node that left (agent stopped or Last Will) may take to come back before acting."),
    ] = msgspec.field(default_factory=OfflineGraceConfig)
    reconcile_interval_s: Annotated[
        PositiveSeconds,
        _doc(
            "How often ftd's drains are compared with the scheduler's nodes (also at start-up): an "
            "operator's resume frees ftd's drain budget, others' drains and downs become events."
        ),
    ] = 60.0
    pending_alert_s: Annotated[
        PositiveSeconds,
        _doc("A job ftd requeued that is still pending this long after raises an alert (notify)."),
    ] = 600.0
    stuck_after_s: Annotated[
        PositiveSeconds | None,
        _doc(
            "An action running longer than this counts as stuck (metric ftd_actions_stuck, alert "
            "FtdActionStuck); unset: per kind, the sum of its phase deadlines plus 120 s."
        ),
    ] = None
    resume_deadline_s: Annotated[
        float,
        _doc(
            "After ftd requeues a job in place (same nodes: an application fault, a hang), how long it "
            "watches for the job to run again with its ranks registered; past it (or the job ended) the "
            "restart is escalated and notified with what was seen; 0: not followed.",
            ge=0,
            le=86400,
        ),
    ] = 600.0
    pinned_jobs: Annotated[
        str,
        _doc(
            "A job pinned to the node it must leave (sbatch -w / --nodelist) while that node stays in "
            "service (a condition that moves jobs without draining it, e.g. a full local filesystem): "
            "'hold' saves, stops and requeues it held, and ftd releases it when the node's condition "
            "clears (Slurm; a scheduler that cannot hold jobs stops it instead); 'stop' saves and "
            "stops it without a requeue. Either way it is notified, never requeued onto that node "
            "again in a loop.",
            extra={"choices": PINNED_JOB_POLICIES},
        ),
    ] = "hold"
    restart_deadline_s: Annotated[
        PositiveSeconds,
        _doc(
            "After ftd sends a job's rank supervisors (ftd run) a restart inside the allocation, how long "
            "every training slot gets to report the new generation running; a slot that does not (or "
            "whose supervisor fails or is lost) gets a spare in the next generation, or the job is "
            "requeued through the scheduler when no spare is left."
        ),
    ] = 120.0
    restart_unchecked_spares: Annotated[
        bool,
        _doc(
            "An in-allocation restart may give a slot to a hot spare whose supervisor never ran a "
            "preflight (ftd run --preflight none); it still runs none when it takes the slot. Off: "
            "only spares whose preflight passed are used, and a job whose spares never ran one is "
            "requeued through the scheduler."
        ),
    ] = False
    unacted_retry_s: Annotated[
        float,
        _doc(
            "A node still in service with an active critical condition whose drain failed, was held "
            "back by the gate or was never asked for gets the drain proposed again (through the gate) "
            "no sooner than this after the last attempt; doubles with each retry up to "
            "unacted_retry_max_s; 0: never retried.",
            ge=0,
            le=86400,
        ),
    ] = 300.0
    unacted_retry_max_s: Annotated[
        PositiveSeconds,
        _doc("The longest wait between two retries of an unacted condition's drain (unacted_retry_s)."),
    ] = 3600.0
    gpu_reset_retry_s: Annotated[
        float,
        _doc(
            "How long a refused GPU reset (a process still holds the GPU) is asked again, with backoff, "
            "before it is escalated to a reboot through the scheduler (then a drain for RMA).",
            ge=0,
        ),
    ] = 120.0
    gpu_reset_backoff_s: Annotated[
        PositiveSeconds, _doc("First wait before asking a refused GPU reset again (doubles, at most 30 s).")
    ] = 1.0
    gpu_reboot_deadline_s: Annotated[
        PositiveSeconds,
        _doc(
            "After an escalated reboot, how long to wait for the node's agent to come back and check "
            "the GPU (still bad: drained for RMA)."
        ),
    ] = 1800.0
    save_step_margin: Annotated[
        int,
        _doc(
            "Steps ahead of the furthest step the ranks reported that a save directive asks every rank "
            "to save at, at least (save at the first step >= it, so ranks agree without collectives); "
            "-1: save at once. save_step_lead_s sets it further ahead for fast steps.",
            ge=-1,
        ),
    ] = 5
    save_step_lead_s: Annotated[
        float,
        _doc(
            "Seconds of training the step a save directive asks for is ahead, at least: the job's "
            "measured pace (its ranks' step timing) turns it into steps when that is more than "
            "save_step_margin. It covers what a rank runs before the directive arrives (progress is "
            "reported once a second, plus the trip); with fast steps a save waits up to about this long "
            "for its step. 0: save_step_margin alone. Keep it well under save_deadline_s.",
            ge=0,
        ),
    ] = 1.5
    placement: Annotated[
        PlacementConfig, _doc("Which node may speak for which job (checked with the scheduler).")
    ] = msgspec.field(default_factory=PlacementConfig)
    return_to_service: Annotated[
        ReturnToServiceConfig, _doc("Return to service after a GPU reset, gated on preflight (opt-in).")
    ] = msgspec.field(default_factory=ReturnToServiceConfig)
    ha: Annotated[
        HaConfig, _doc("Active/standby coordinators on a shared PostgreSQL ledger (leader lease).")
    ] = msgspec.field(default_factory=HaConfig)


class LogConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Daemon logging (structlog)."""

    level: Annotated[str, _doc("Minimum level logged.", extra={"choices": LOG_LEVELS})] = "info"
    # None: JSON when stderr is not a TTY
    json: Annotated[
        bool | None, _doc("JSON lines (true) or console text (false); unset: JSON off a TTY.")
    ] = None


class HardwareConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Hardware profiles (ftd/catalog/hardware/): which kind of node this is, and the operator's overrides."""

    profile: Annotated[
        str,
        _doc(
            "This node's hardware profile; empty: matched from the GPU name NVML reports "
            "(profiles.toml's gpu_names). A node with no profile skips the checks that need one."
        ),
    ] = ""
    catalog: Annotated[
        str,
        _doc(
            "An operator's TOML file laid over the packaged catalog: [profiles.NAME] adds a profile, "
            "[SECTION.PROFILE] or [SECTION.default] replaces values; empty: the packaged catalog only."
        ),
    ] = ""


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The whole file. Every section is optional; an empty file is a valid (all defaults) config."""

    bus: BusConfig = msgspec.field(default_factory=BusConfig)
    agent: AgentConfig = msgspec.field(default_factory=AgentConfig)
    coordinator: CoordinatorConfig = msgspec.field(default_factory=CoordinatorConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    hardware: HardwareConfig = msgspec.field(default_factory=HardwareConfig)
