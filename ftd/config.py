"""Configuration: one TOML file -> typed, frozen structs.

SCHEMA SKELETON (the loader/validator is being written; field names here are the contract).
"""

from __future__ import annotations

import msgspec


class BusConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How to reach the MQTT broker. ``embedded = true`` starts an in-process broker (single machine)."""

    host: str = "127.0.0.1"
    port: int = 1883
    username: str | None = None
    password: str | None = None
    password_file: str | None = None  # read at start; systemd LoadCredential puts it in $CREDENTIALS_DIRECTORY
    tls: bool = False
    ca_file: str | None = None
    client_id: str | None = None  # default: ftd-agent-{node} / ftd-coordinator
    keepalive_s: int = 5
    reconnect_min_s: float = 0.2
    reconnect_max_s: float = 10.0
    embedded: bool = False


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    node: str | None = None  # default: the host name
    kmsg_path: str = "/dev/kmsg"
    state_dir: str = "/var/lib/ftd"
    socket_path: str = "/run/ftd/agent.sock"
    outbox_max: int = 10000
    kmsg_from_start: bool = False  # True: report what is already in the log; False: only new records


class SlurmConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    enabled: bool = True
    scontrol: str = "scontrol"
    slurm_conf: str | None = None  # exported as SLURM_CONF to scontrol
    timeout_s: float = 30.0


class PolicyConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    dry_run: bool = False
    cooldown_s: float = 600.0
    dry_run_rules: list[str] = msgspec.field(default_factory=list)


class CoordinatorConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    ledger_path: str = "/var/lib/ftd/ledger.sqlite"
    save_deadline_s: float = 120.0
    stop_deadline_s: float = 60.0
    disabled_rules: list[str] = msgspec.field(default_factory=list)
    rule_dirs: list[str] = msgspec.field(default_factory=list)
    scheduler: str = "slurm"  # "slurm" | "none"
    policy: PolicyConfig = msgspec.field(default_factory=PolicyConfig)
    slurm: SlurmConfig = msgspec.field(default_factory=SlurmConfig)


class LogConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    level: str = "info"
    json: bool | None = None  # None: JSON when stderr is not a TTY


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    bus: BusConfig = msgspec.field(default_factory=BusConfig)
    agent: AgentConfig = msgspec.field(default_factory=AgentConfig)
    coordinator: CoordinatorConfig = msgspec.field(default_factory=CoordinatorConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
