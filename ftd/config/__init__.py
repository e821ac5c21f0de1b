"""Configuration: one TOML file -> typed, frozen structs, or every problem in it at once.

What: the ftd daemons (``ftd agent``, ``ftd coordinator``) read one TOML file. This package
re-exports its public API, so importers say ``from ftd.config import ...`` whatever module a name
lives in:

- :mod:`ftd.config.schema`: the structs (:class:`Config` and its sections), defaults, documentation;
- :mod:`ftd.config.validate`: loading (:func:`load_config`, :func:`parse_config`), unknown keys
  rejected, every problem reported with its dotted path;
- :mod:`ftd.config.relations`: rules between options (``warn_pct < critical_pct``, ...);
- :mod:`ftd.config.paths`: whether one path a config names is usable as a daemon would use it;
- :mod:`ftd.config.errors`: :class:`ConfigError` and its :class:`Problem` rows;
- :mod:`ftd.config.credentials`: secret files a config points at (:func:`resolve_password`);
- :mod:`ftd.config.explain`: ``ftd check-config --explain`` (:func:`describe_options`);
- :mod:`ftd.config.introspect`: the schema read through :mod:`msgspec.inspect`, shared by the
  validator and the explanation.

Why split: the schema is what most changes (a new option is one annotated field) and what readers
look for; the generic machinery that validates and explains it never names a field.
"""

from __future__ import annotations

from ftd.config.credentials import read_secret_file, resolve_password
from ftd.config.errors import ConfigError, Problem
from ftd.config.explain import Option, describe_options, explain_text
from ftd.config.relations import check_relations
from ftd.config.schema import (
    AgentConfig,
    ApiConfig,
    BusConfig,
    CloudConfig,
    Config,
    CoordinatorConfig,
    DomainBudgetConfig,
    FsConfig,
    FsMount,
    HeartbeatConfig,
    KubernetesConfig,
    LogConfig,
    LogsConfig,
    MemoryConfig,
    NodeLabelsConfig,
    NotifyConfig,
    NotifyDestinationConfig,
    NvmlConfig,
    PairTestsConfig,
    PolicyConfig,
    RateLimitConfig,
    SlowRanksConfig,
    SlurmConfig,
    SpoolConfig,
    StormConfig,
)
from ftd.config.validate import (
    config_from_data,
    load_config,
    load_config_data,
    parse_config,
    valid_part,
    validate_data,
)

__all__ = [
    "AgentConfig",
    "ApiConfig",
    "BusConfig",
    "CloudConfig",
    "Config",
    "ConfigError",
    "CoordinatorConfig",
    "DomainBudgetConfig",
    "FsConfig",
    "FsMount",
    "HeartbeatConfig",
    "KubernetesConfig",
    "LogConfig",
    "LogsConfig",
    "MemoryConfig",
    "NodeLabelsConfig",
    "NotifyConfig",
    "NotifyDestinationConfig",
    "NvmlConfig",
    "Option",
    "PairTestsConfig",
    "PolicyConfig",
    "Problem",
    "RateLimitConfig",
    "SlowRanksConfig",
    "SlurmConfig",
    "SpoolConfig",
    "StormConfig",
    "check_relations",
    "config_from_data",
    "describe_options",
    "explain_text",
    "load_config",
    "load_config_data",
    "parse_config",
    "read_secret_file",
    "resolve_password",
    "valid_part",
    "validate_data",
]
