"""ftd.config: loading, every-problem-at-once validation, secret files, `ftd check-config [--explain]`."""

from __future__ import annotations

import math
import re
import types
import typing
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftd.cli import main
from ftd.config import (
    BusConfig,
    Config,
    ConfigError,
    Problem,
    config_from_data,
    describe_options,
    explain_text,
    load_config,
    parse_config,
    resolve_password,
    validate_data,
)
from ftd.config.introspect import leaf_fields
from tests.properties import examples

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "config"


def problems_of(text: str) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="t.toml")
    return {p.path: p.message for p in info.value.problems}


# --- valid files -------------------------------------------------------------------------------------


def test_empty_file_is_all_defaults() -> None:
    assert parse_config("") == Config()


@pytest.mark.parametrize("name", ["agent.toml", "coordinator.toml"])
def test_examples_load(name: str) -> None:
    config = load_config(EXAMPLES / name)
    assert config.bus.tls and config.bus.port == 8883
    # mutual TLS: the certificate is the identity; the password lines are commented out
    assert config.bus.cert_file and config.bus.key_file
    assert config.bus.password_file is None and config.bus.password is None


def test_example_values() -> None:
    agent = load_config(EXAMPLES / "agent.toml")
    assert agent.agent.node == "gpu-a017" and agent.agent.resolved_node() == "gpu-a017"
    assert agent.agent.kmsg_path == "/dev/kmsg"
    coordinator = load_config(str(EXAMPLES / "coordinator.toml"))
    assert coordinator.bus.cert_file == "/etc/ftd/tls/coordinator.crt" and coordinator.bus.username is None
    assert coordinator.coordinator.scheduler == "slurm"
    assert coordinator.coordinator.slurm.slurm_conf == "/etc/slurm/slurm.conf"
    assert coordinator.coordinator.policy.cooldown_s == 600.0


def test_int_accepted_for_float_and_values_typed() -> None:
    config = parse_config("[coordinator.policy]\ncooldown_s = 30\n[log]\njson = true\n")
    assert config.coordinator.policy.cooldown_s == 30.0
    assert isinstance(config.coordinator.policy.cooldown_s, float)
    assert config.log.json is True


# --- every problem, with its path --------------------------------------------------------------------

MANY_MISTAKES = """\
[bus]
port = 70000
keepalive_s = "abc"

[agent]
outbox_max = 0
node = "gpu/1"

[coordinator]
scheduler = "pbs"
save_deadline_s = -5

[coordinator.policy]
cooldwon_s = 5

[log]
level = "loud"
"""


def test_all_mistakes_reported_with_paths() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(MANY_MISTAKES, source="bad.toml")
    found = {p.path: p.message for p in info.value.problems}
    assert set(found) == {
        "bus.port",
        "bus.keepalive_s",
        "agent.outbox_max",
        "agent.node",
        "coordinator.scheduler",
        "coordinator.save_deadline_s",
        "coordinator.policy.cooldwon_s",
        "log.level",
    }
    assert found["bus.port"] == "must be between 1 and 65535, got 70000"
    assert found["bus.keepalive_s"] == "expected int, got str 'abc'"
    assert found["agent.outbox_max"] == "must be >= 1, got 0"
    assert "MQTT topics" in found["agent.node"]
    assert "'slurm', 'none'" in found["coordinator.scheduler"] and "'pbs'" in found["coordinator.scheduler"]
    assert found["coordinator.save_deadline_s"] == "must be > 0, got -5"
    assert found["coordinator.policy.cooldwon_s"].startswith("unknown option")
    assert "'debug'" in found["log.level"]
    # str() lists every problem, one per line, as "source: path: message"
    lines = str(info.value).splitlines()
    assert len(lines) == len(found)
    assert "bad.toml: bus.port: must be between 1 and 65535, got 70000" in lines
    assert all(line.startswith("bad.toml: ") for line in lines)
    assert isinstance(info.value, ValueError)


def test_unknown_key_did_you_mean() -> None:
    found = problems_of("[coordinator.policy]\ncooldwon_s = 5\n")
    assert found == {
        "coordinator.policy.cooldwon_s": "unknown option (did you mean 'coordinator.policy.cooldown_s'?)"
    }


def test_unknown_key_that_belongs_in_another_section() -> None:
    found = problems_of("[agent]\nport = 1883\n")
    assert "did you mean 'bus.port'?" in found["agent.port"]


def test_unknown_section_lists_known_ones() -> None:
    found = problems_of("[zzz]\nx = 1\n")
    assert found["zzz"].startswith("unknown section") and "bus, agent, coordinator, log" in found["zzz"]


def test_choice_suggestion() -> None:
    assert "did you mean 'warning'?" in problems_of('[log]\nlevel = "warn"\n')["log.level"]


def test_wrong_shapes() -> None:
    found = problems_of(
        'bus = 3\n[agent]\nkmsg_from_start = "yes"\n[coordinator]\nrule_dirs = ["a", 1, ""]\n'
    )
    assert found == {
        "bus": "expected table, got int 3",
        "agent.kmsg_from_start": "expected bool, got str 'yes'",
        "coordinator.rule_dirs[1]": "expected str, got int 1",
        "coordinator.rule_dirs[2]": "must not be empty",
    }


def test_bool_is_not_an_int_and_nan_is_not_a_timeout() -> None:
    found = problems_of("[bus]\nport = true\n[coordinator.slurm]\ntimeout_s = nan\n")
    assert found == {
        "bus.port": "expected int, got bool true",
        "coordinator.slurm.timeout_s": "must be a finite number, got nan",
    }


def test_socket_path_length_limit() -> None:
    found = problems_of(f'[agent]\nsocket_path = "/run/{"x" * 200}"\n')
    assert "at most 107" in found["agent.socket_path"]


# --- cross-field rules -------------------------------------------------------------------------------


def test_password_and_password_file_are_exclusive() -> None:
    found = problems_of('[bus]\nusername = "u"\npassword = "p"\npassword_file = "f"\n')
    assert list(found) == ["bus.password_file"] and "mutually exclusive" in found["bus.password_file"]


def test_username_without_password() -> None:
    found = problems_of('[bus]\nusername = "agent"\n')
    assert list(found) == ["bus.username"] and "password" in found["bus.username"]


def test_password_without_username() -> None:
    assert list(problems_of('[bus]\npassword_file = "f"\n')) == ["bus.password_file"]


def test_ca_file_without_tls_and_reconnect_order() -> None:
    found = problems_of('[bus]\nca_file = "/ca.pem"\nreconnect_min_s = 20\n')
    assert set(found) == {"bus.ca_file", "bus.reconnect_min_s"}


# --- syntax and file errors --------------------------------------------------------------------------


def test_toml_syntax_error_has_line_and_column() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("[bus]\nhost = 'x'\nport = \n", source="s.toml")
    (problem,) = info.value.problems
    assert problem.line == 3 and problem.column is not None
    assert problem.message.startswith("invalid TOML")
    assert str(info.value).startswith("s.toml:3:")


def test_unreadable_file(tmp_path: Path) -> None:
    for path in (tmp_path / "missing.toml", tmp_path):
        with pytest.raises(ConfigError) as info:
            load_config(path)
        assert str(info.value).startswith(f"{path}: cannot read config file")


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[bus]\nhost = "caf\xe9"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [Problem("", "not valid UTF-8", 2, 12)]


# --- resolve_password --------------------------------------------------------------------------------


def test_resolve_password_inline_and_none() -> None:
    assert resolve_password(BusConfig(username="u", password="s3cret")) == "s3cret"
    assert resolve_password(BusConfig()) is None


def test_resolve_password_from_credentials_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mqtt-password").write_text("s3cret\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert resolve_password(BusConfig(username="u", password_file="mqtt-password")) == "s3cret"


def test_resolve_password_absolute_path_ignores_credentials_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "pw"
    secret.write_text("abc")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", "/nonexistent")
    assert resolve_password(BusConfig(username="u", password_file=str(secret))) == "abc"


def test_resolve_password_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        resolve_password(BusConfig(username="u", password_file="nope"))
    (problem,) = info.value.problems
    assert problem.path == "bus.password_file"
    assert "No such file" in problem.message and "CREDENTIALS_DIRECTORY is not set" in problem.message
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        resolve_password(BusConfig(username="u", password_file="empty"))


# --- describe_options --------------------------------------------------------------------------------


def tables_in(hint: Any) -> list[tuple[str, type]]:
    """The structs a value of annotation ``hint`` may hold, each with the path suffix reaching its keys:
    ``""`` (the table itself), ``"[]"`` (an entry of an array of tables), ``".<name>"`` (of a map)."""
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        return [("", hint)]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        return [("[]" + suffix, table) for suffix, table in tables_in(args[0])]
    if origin is dict:
        return [(".<name>" + suffix, table) for suffix, table in tables_in(args[1])]
    if origin in (typing.Union, types.UnionType):
        return [found for arg in args for found in tables_in(arg)]
    return []


def leaf_paths(cls: type, prefix: str = "", *, nested: bool = False) -> list[str]:
    """Independent walk over the structs' resolved annotations: every option's dotted path. With
    ``nested``, also every field of every struct reachable through arrays of tables, maps and optional
    tables, named as --explain names them (``agent.fs.mounts[].path``)."""
    hints = typing.get_type_hints(cls)
    paths: list[str] = []
    for name in cls.__struct_fields__:  # type: ignore[attr-defined]
        hint = hints[name]
        if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
            paths += leaf_paths(hint, f"{prefix}{name}.", nested=nested)
            continue
        paths.append(prefix + name)
        for suffix, table in tables_in(hint) if nested else []:
            paths += leaf_paths(table, f"{prefix}{name}{suffix}.", nested=True)
    return paths


def test_describe_options_covers_and_documents_every_field() -> None:
    options = describe_options()
    assert [o.path for o in options] == leaf_paths(Config)
    assert all(o.doc for o in options), [o.path for o in options if not o.doc]
    by_path = {o.path: o for o in options}
    assert tuple(by_path["bus.port"])[1:3] == ("int (1..65535)", "1883")
    assert by_path["bus.host"].default == '"127.0.0.1"'
    assert by_path["agent.node"].default == "unset"
    assert "slurm" in by_path["coordinator.scheduler"].type


EXPLAIN_ENTRY = re.compile(
    r"^(?P<path>\S+): (?P<type>.+), (?:default (?P<default>.+)|required)\n {4}\S", re.M
)


def test_explain_lists_every_field_of_every_reachable_struct() -> None:
    expected = leaf_paths(Config, nested=True)
    assert {"agent.fs.mounts[].path", "coordinator.policy.rate_limits[].window_s"} <= set(expected)
    text = explain_text()
    explained = [m["path"] for m in EXPLAIN_ENTRY.finditer(text)]
    assert sorted(explained) == sorted(expected)  # each once, with a type, a default and a description
    entry_lines = [line for line in text.splitlines() if line and not line.startswith(("    ", "["))]
    assert len(entry_lines) == len(expected)


def test_nested_options_follow_the_table_that_holds_them() -> None:
    plain = describe_options()
    nested = describe_options(nested=True)
    assert [o for o in nested if "[]" not in o.path] == plain  # the top-level list is unchanged
    by_path = {o.path: o for o in nested}
    assert tuple(by_path["agent.fs.mounts[].path"])[1:] == (
        "str",
        "required",
        "A path on the filesystem (its mount point, usually).",
    )
    assert tuple(by_path["coordinator.policy.rate_limits[].max"])[1:3] == ("int (>= 1)", "required")
    assert by_path["coordinator.node_labels[].rack"].default == "unset"
    assert "nvlink_domain" in by_path["coordinator.policy.domain_budgets[].label"].type
    paths = [o.path for o in nested]
    assert paths.index("agent.fs.forecast_window_s") < paths.index("agent.fs.mounts[].path")


class _Leaf(msgspec.Struct, frozen=True):
    a: int = 1


class _Tree(msgspec.Struct, frozen=True):
    by_name: dict[str, _Leaf] = msgspec.field(default_factory=dict)
    maybe: _Leaf | None = None
    grid: list[list[_Leaf]] = msgspec.field(default_factory=list)


def test_leaf_fields_reach_maps_optional_tables_and_arrays_of_arrays() -> None:
    info = mi.type_info(_Tree)
    assert isinstance(info, mi.StructType)
    found = [path for path, _ in leaf_fields(info, nested=True)]
    assert found == ["by_name", "maybe", "grid", "by_name.<name>.a", "maybe.a", "grid[][].a"]
    assert sorted(found) == sorted(leaf_paths(_Tree, nested=True))
    assert [path for path, _ in leaf_fields(info)] == ["by_name", "maybe", "grid"]


# --- properties --------------------------------------------------------------------------------------

NAMES = sorted({part for o in describe_options() for part in o.path.split(".")})
keys = st.sampled_from(NAMES) | st.text(max_size=6)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.datetimes()
    | st.dates()
)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5)
)
documents = st.dictionaries(keys, values, max_size=6)


@settings(max_examples=examples(300), deadline=None)
@given(documents)
def test_random_data_raises_only_config_error(data: dict[Any, Any]) -> None:
    problems = validate_data(data)
    if not problems:  # the validator's verdict is msgspec's: clean data always builds
        assert isinstance(msgspec.convert(data, Config), Config)
    try:
        config_from_data(data)
    except ConfigError as exc:
        assert exc.problems and str(exc)


@settings(max_examples=examples(200), deadline=None)
@given(st.text(alphabet=st.sampled_from("[]=\"'.,#\n\\ abcport1e9bus=agent-_"), max_size=60))
def test_random_text_raises_only_config_error(text: str) -> None:
    try:
        parse_config(text)
    except ConfigError as exc:
        assert exc.problems


def strategy_for(t: mi.Type) -> st.SearchStrategy[Any]:
    """Values that satisfy a msgspec type's own constraints (built from the schema, not from the
    validator under test)."""
    extra: dict[str, Any] = {}
    while isinstance(t, mi.Metadata):
        extra.update(t.extra or {})
        t = t.type
    if "choices" in extra:
        return st.sampled_from(extra["choices"])
    if isinstance(t, mi.UnionType):
        return st.one_of([strategy_for(m) for m in t.types if not isinstance(m, mi.NoneType)])
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.IntType):
        low = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else -(2**40))
        high = t.le if t.le is not None else (t.lt - 1 if t.lt is not None else 2**40)
        return st.integers(min_value=low, max_value=high)
    if isinstance(t, mi.FloatType):
        low = t.ge if t.ge is not None else t.gt
        high = t.le if t.le is not None else (t.lt if t.lt is not None else 1e9)
        return st.floats(
            min_value=low,
            exclude_min=t.gt is not None,
            max_value=high,
            exclude_max=t.lt is not None,
            allow_nan=False,
        )
    if isinstance(t, mi.StrType):
        if t.pattern is not None:
            return st.from_regex(t.pattern)
        return st.text(min_size=t.min_length or 0, max_size=t.max_length or 20)
    if isinstance(t, mi.ListType):
        return st.lists(strategy_for(t.item_type), max_size=3)
    if isinstance(t, mi.StructType):
        return st.fixed_dictionaries(
            {f.encode_name: strategy_for(f.type) for f in t.fields if f.required},
            optional={f.encode_name: strategy_for(f.type) for f in t.fields if not f.required},
        )
    raise AssertionError(f"no strategy for {t}")


# Keys governed by rules between options (ftd.config.relations, each tested on its own in
# test_config_references.py), by the table holding them ("[]": every table of an array).
CROSS_FIELD_KEYS = {
    "bus": {
        "username",
        "password",
        "password_file",
        "ca_file",
        "reconnect_min_s",
        "reconnect_max_s",
        "rack_broker",
    },
    "coordinator": {"save_step_lead_s", "save_deadline_s"},
    "coordinator.notify": {"url_file", "destinations"},
    "coordinator.ha": {
        "ledger",
        "dsn",
        "lease_ttl_s",
        "renew_interval_s",
        "standby_username",
        "standby_password_file",
        "standby_cert_file",
        "standby_key_file",
    },
    "coordinator.policy": {"domain_budgets"},
    "agent.nvml": {"temperature_c", "temperature_hysteresis_c"},
    "agent.heartbeat": {"timeout_s", "check_interval_s"},
    "agent.memory": {
        "available_warn_pct",
        "available_critical_pct",
        "leak_window_s",
        "leak_min_samples",
        "interval_s",
    },
    "agent.fs": {
        "hysteresis_pct",
        "forecast_window_s",
        "forecast_min_samples",
        "forecast_min_span_s",
        "interval_s",
    },
    "agent.fs.mounts[]": {"warn_pct", "critical_pct"},
}


def without_related_keys(data: dict[str, Any]) -> None:
    """Drop the keys of CROSS_FIELD_KEYS from ``data``, and all but the first rate limit per kind."""
    for path, keys in CROSS_FIELD_KEYS.items():
        tables = [data]
        for part in path.split("."):
            name = part.removesuffix("[]")
            tables = [t.get(name, [] if part.endswith("[]") else {}) for t in tables]
            if part.endswith("[]"):
                tables = [item for items in tables for item in items]
        for table in tables:
            for key in keys:
                table.pop(key, None)
    policy = data.get("coordinator", {}).get("policy", {})
    if "rate_limits" in policy:
        first = {limit["kind"]: limit for limit in reversed(policy["rate_limits"])}
        policy["rate_limits"] = [limit for limit in policy["rate_limits"] if first[limit["kind"]] is limit]


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strategy_for(mi.type_info(Config)))
def test_valid_data_is_accepted_and_kept(data: dict[str, Any]) -> None:
    without_related_keys(data)
    config = config_from_data(data)
    for section, table in data.items():
        assert_kept(table, getattr(config, section))


def assert_kept(given: Any, built: Any) -> None:
    """Every value given survives into the built config (structs compared field by given field)."""
    if isinstance(given, dict):
        for key, value in given.items():
            assert_kept(value, getattr(built, key))
    elif isinstance(given, list):
        assert len(given) == len(built)
        for g, b in zip(given, built, strict=True):
            assert_kept(g, b)
    elif isinstance(given, float):
        assert math.isclose(built, given)
    else:
        assert built == given


# --- ftd check-config --------------------------------------------------------------------------------


def test_check_config_ok(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(EXAMPLES / "agent.toml")  # names /etc/ftd/ca.pem, absent here: --no-files
    assert main(["check-config", "--no-files", path]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"OK: {path}\n")
    assert "gpu-a017" in out and "mqtts://mqtt.cluster.internal:8883" in out
    assert "scheduler:" not in out  # the agent's config: the coordinator's settings are not its own
    assert "files:     not checked (--no-files)" in out
    coordinator = str(EXAMPLES / "coordinator.toml")
    assert main(["check-config", "--no-files", coordinator]) == 0
    out = capsys.readouterr().out
    assert "node:" not in out and "gpu-a017" not in out  # a coordinator has no node name
    assert "scheduler: slurm via /usr/bin/scontrol" in out


def test_check_config_reports_every_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(MANY_MISTAKES)
    assert main(["check-config", "--no-files", str(path)]) == 2  # the file's own problems only
    captured = capsys.readouterr()
    assert captured.out == ""
    for key in (
        "bus.port",
        "bus.keepalive_s",
        "agent.outbox_max",
        "coordinator.policy.cooldwon_s",
        "log.level",
    ):
        assert f"{path}: {key}: " in captured.err
    assert "8 problems" in captured.err


def test_check_config_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(tmp_path / "none.toml")]) == 2
    assert "cannot read config file" in capsys.readouterr().err


def test_check_config_explain(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "bus.port: int (1..65535), default 1883" in out
    assert "coordinator.policy.cooldown_s" in out and "[coordinator.slurm]" in out


def test_check_config_explain_lists_the_keys_of_arrays_of_tables(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", "--explain"]) == 0
    out = capsys.readouterr().out
    assert (
        "[[agent.fs.mounts]]\n"
        "agent.fs.mounts[].path: str, required\n"
        "    A path on the filesystem (its mount point, usually).\n"
        "agent.fs.mounts[].warn_pct: float (> 0; <= 100), default 85.0\n"
        "    Fill (% of effective capacity) that warns.\n"
    ) in out
    assert (
        "\n[[coordinator.policy.rate_limits]]\ncoordinator.policy.rate_limits[].kind: str, required\n" in out
    )
    assert "coordinator.policy.domain_budgets[].max_drained: int (>= 0), required\n" in out
    assert "coordinator.node_labels[].nvlink_domain: str, default unset\n    NVLink domain" in out


def test_check_config_needs_path_without_explain(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config"]) == 2
    assert "PATH is required" in capsys.readouterr().err


def test_reconnect_max_below_default_min_names_the_key_that_was_set() -> None:
    found = problems_of("[bus]\nreconnect_max_s = 0.1\n")
    assert found == {
        "bus.reconnect_max_s": "must not be below bus.reconnect_min_s (0.2, the default), got 0.1"
    }


def test_config_error_pickles_with_its_problems() -> None:
    import pickle

    error = ConfigError([Problem("bus.port", "bad")], "x.toml")
    again = pickle.loads(pickle.dumps(error))
    assert again.problems == error.problems and str(again) == "x.toml: bus.port: bad"
