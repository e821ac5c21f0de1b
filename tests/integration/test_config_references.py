"""What a config names (files, directories, rules) and the rules between its options.

The operator's report: a config naming missing files (``ca_file``, ``password_file``, ``rule_dirs``,
``rules_file``) passed ``ftd check-config``, then the daemon died with a traceback, one problem at a
time. These tests run the real commands as subprocesses: ``check-config`` lists every problem with
its dotted path in one run (exit 2), and each daemon refuses to start with the same lines, exit 2
and no traceback. The path checks (:mod:`ftd.config.paths`) and the relations
(:mod:`ftd.config.relations`) are tested in-process, one rule at a time.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftd.bench.slurm_cluster import free_port
from ftd.commands.config_check import check_config_file, check_references
from ftd.config import ConfigError, Problem, parse_config, validate_data
from ftd.config import paths as p

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534


def ftd(
    *args: str, env: dict[str, str] | None = None, as_nobody: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ftd.cli ARGS`` (as user nobody when asked and we are root) and wait for it."""
    command = [sys.executable, "-m", "ftd.cli", *args]
    if as_nobody and os.geteuid() == 0:
        command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *command]
    environment = {k: v for k, v in os.environ.items() if k != "CREDENTIALS_DIRECTORY"}
    environment.update(env or {})
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=REPO, env=environment)


def problem_lines(stderr: str, source: Path) -> list[str]:
    """The ``SOURCE: path: message`` lines of a report, without the count line."""
    return [line for line in stderr.splitlines() if line.startswith(f"{source}: ")]


def paths_of(stderr: str, source: Path) -> list[str]:
    return [line.removeprefix(f"{source}: ").split(": ", 1)[0] for line in problem_lines(stderr, source)]


def assert_clean_refusal(run: subprocess.CompletedProcess[str], source: Path) -> None:
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and "Traceback" not in run.stdout
    count = len(problem_lines(run.stderr, source))
    assert count and run.stderr.rstrip().endswith(f"{count} problem{'s' if count > 1 else ''} in {source}")


@pytest.fixture
def work() -> Iterator[Path]:
    """A short directory under /tmp (unix socket paths are limited), open to user nobody."""
    path = Path(tempfile.mkdtemp(prefix="ftdref", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# --- everything missing at once ----------------------------------------------------------------------


def broken_config(work: Path) -> Path:
    """A config whose every referenced file or directory is missing, unusable or broken."""
    (work / "afile").write_text("not a directory\n")
    (work / "notsock").write_text("a regular file where the socket goes\n")
    rules_raise = work / "rules-raise"
    rules_raise.mkdir()
    (rules_raise / "boom.py").write_text("import os\nraise RuntimeError('boom at import')\n")
    rules_syntax = work / "rules-syntax"
    rules_syntax.mkdir()
    (rules_syntax / "broken.py").write_text("def ftd_evaluate(event, view)\n    return []\n")
    (work / "rules.toml").write_text(
        '[[rule]]\nname = "bad-one"\nmatch = { kind = "xid" }\naction = "drian_node"\n'
        '[[rule]]\nname = "two"\nmatch = { kind = "xid" }\ncount = 3\naction = "drain_node"\n'
    )
    config = work / "ftd.toml"
    config.write_text(
        f"""
[bus]
tls = true
ca_file = "{work}/missing-ca.pem"
username = "node"
password_file = "{work}/missing-password"

[agent]
kmsg_path = "{work}/missing-kmsg"
state_dir = "{work}/afile/state"
socket_path = "{work}/notsock"

[agent.logs]
patterns_file = "{work}/missing-patterns.toml"

[agent.heartbeat]
timeout_s = 0.1

[[agent.fs.mounts]]
path = "{work}/missing-mount"
warn_pct = 97
critical_pct = 90

[coordinator]
ledger_path = "{work}/afile/ledger.sqlite"
rule_dirs = ["{work}/missing-rules", "{rules_raise}", "{rules_syntax}"]
rules_file = "{work}/rules.toml"
scheduler = "slurm"

[coordinator.slurm]
scontrol = "{work}/missing-scontrol"
slurm_conf = "{work}/missing-slurm.conf"

[coordinator.api]
token_file = "{work}/missing-token"

[coordinator.notify]
url_file = "{work}/missing-url"
"""
    )
    return config


RELATIONS = ["agent.heartbeat.timeout_s", "agent.fs.mounts[0].warn_pct"]  # the file's own: for both daemons
BUS = ["bus.ca_file", "bus.password_file"]
AGENT = [
    "agent.kmsg_path",
    "agent.state_dir",
    "agent.socket_path",
    "agent.logs.patterns_file",
    "agent.fs.mounts[0].path",
]
COORDINATOR = [
    "coordinator.ledger_path",
    "coordinator.slurm.scontrol",
    "coordinator.slurm.slurm_conf",
    "coordinator.rule_dirs[0]",
    "coordinator.rule_dirs[1]",
    "coordinator.rule_dirs[2]",
    "coordinator.rules_file",
    "coordinator.rules_file",
    "coordinator.api.token_file",
    "coordinator.notify.url_file",
]


def test_check_config_lists_every_missing_reference_in_one_run(work: Path) -> None:
    config = broken_config(work)
    run = ftd("check-config", str(config))
    assert_clean_refusal(run, config)
    assert run.stdout == ""
    found = paths_of(run.stderr, config)
    assert sorted(found) == sorted(RELATIONS + BUS + AGENT + COORDINATOR), run.stderr
    err = run.stderr
    assert f"bus.ca_file: cannot read {work}/missing-ca.pem: No such file or directory" in err
    assert f"bus.password_file: cannot read {work}/missing-password: No such file or directory" in err
    assert f"agent.state_dir: {work}/afile is not a directory" in err
    assert f"agent.socket_path: {work}/notsock exists and is not a socket" in err
    assert f"coordinator.rule_dirs[0]: cannot read {work}/missing-rules: No such file or directory" in err
    assert "coordinator.rule_dirs[1]: " in err and "boom.py:2: RuntimeError: boom at import" in err
    assert "coordinator.rule_dirs[2]: " in err and "broken.py:1: syntax error" in err
    assert "'drian_node'" in err and "window_s" in err  # both rules of the rules file, each named
    assert f"coordinator.slurm.scontrol: cannot run {work}/missing-scontrol: No such file" in err


@pytest.mark.parametrize(
    ("role", "expected"), [("agent", RELATIONS + BUS + AGENT), ("coordinator", RELATIONS + BUS + COORDINATOR)]
)
def test_daemon_refuses_to_start_with_the_same_problems_and_no_traceback(
    work: Path, role: str, expected: list[str]
) -> None:
    config = broken_config(work)
    daemon = ftd(role, "--config", str(config))
    assert_clean_refusal(daemon, config)
    assert sorted(paths_of(daemon.stderr, config)) == sorted(expected)
    check = ftd("check-config", "--for", role, str(config))
    assert problem_lines(daemon.stderr, config) == problem_lines(check.stderr, config)
    assert not (work / "afile" / "state").exists()  # nothing created by a refused start


def test_rules_file_syntax_error_and_rule_module_raising_on_import(work: Path) -> None:
    rules = work / "rules"
    rules.mkdir()
    (rules / "good.py").write_text("def ftd_evaluate(event, view):\n    return []\n")
    (rules / "raises.py").write_text("X = 1\n\nraise ValueError('bad site policy')\n")
    (work / "rules.toml").write_text('[[rule]\nname = "x"\n')
    config = work / "c.toml"
    config.write_text(
        f'[coordinator]\nledger_path = "{work}/ledger.sqlite"\nscheduler = "none"\n'
        f'rule_dirs = ["{rules}"]\nrules_file = "{work}/rules.toml"\n[coordinator.api]\nenabled = false\n'
    )
    for run in (ftd("check-config", str(config)), ftd("coordinator", "--config", str(config))):
        assert_clean_refusal(run, config)
        lines = problem_lines(run.stderr, config)
        assert len(lines) == 2, run.stderr
        assert f"coordinator.rule_dirs[0]: {rules}/raises.py:3: ValueError: bad site policy" in lines[0]
        assert f"coordinator.rules_file: {work}/rules.toml: invalid TOML" in lines[1]
    assert not (work / "ledger.sqlite").exists()


def test_unreadable_files_are_reported_with_the_user(work: Path) -> None:
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: cannot check permissions as another user")
    for name in ("ca.pem", "password", "rules.toml", "kmsg"):
        (work / name).write_text("x\n")
        (work / name).chmod(0o000)
    (work / "rules").mkdir(mode=0o000)
    (work / "state").mkdir(mode=0o555)
    config = work / "c.toml"
    config.write_text(
        f'[bus]\ntls = true\nca_file = "{work}/ca.pem"\nusername = "u"\npassword_file = "{work}/password"\n'
        f'[agent]\nkmsg_path = "{work}/kmsg"\nstate_dir = "{work}/state"\nsocket_path = "{work}/a.sock"\n'
        f'[coordinator]\nledger_path = "{work}/ledger.sqlite"\nscheduler = "none"\n'
        f'rule_dirs = ["{work}/rules"]\nrules_file = "{work}/rules.toml"\n'
    )
    config.chmod(0o644)
    run = ftd("check-config", str(config), as_nobody=True)
    assert_clean_refusal(run, config)
    assert sorted(paths_of(run.stderr, config)) == [
        "agent.kmsg_path",
        "agent.socket_path",  # its directory is the work directory: not writable for nobody
        "agent.state_dir",
        "bus.ca_file",
        "bus.password_file",
        "coordinator.ledger_path",
        "coordinator.rule_dirs[0]",
        "coordinator.rules_file",
    ], run.stderr
    assert all("Permission denied (as user " in line for line in problem_lines(run.stderr, config))


# --- what must still start ---------------------------------------------------------------------------


def test_agent_starts_and_creates_a_missing_state_dir_with_a_fifo_as_kmsg(work: Path) -> None:
    os.mkfifo(work / "kmsg")
    state = work / "new" / "deeper" / "state"
    config = work / "a.toml"
    config.write_text(
        f'[bus]\nport = {free_port()}\n[agent]\nnode = "n1"\nkmsg_path = "{work}/kmsg"\n'
        f'state_dir = "{state}"\nsocket_path = "{work}/run/a.sock"\n'
        "[agent.nvml]\nenabled = false\n[agent.memory]\nenabled = false\n[log]\njson = true\n"
    )
    assert ftd("check-config", str(config)).returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "ftd.cli", "agent", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 20
        while not (work / "run" / "a.sock").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        assert state.is_dir()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "agent_started" in err and "Traceback" not in err


def test_a_failure_the_checks_cannot_foresee_is_one_clean_error(work: Path) -> None:
    """Another agent already listening on the socket: found only when binding, still exit 2, no traceback."""
    path = work / "a.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    config = work / "a.toml"
    config.write_text(
        f'[bus]\nport = {free_port()}\n[agent]\nkmsg_path = "/dev/null"\nstate_dir = "{work}/state"\n'
        f'socket_path = "{path}"\n[agent.nvml]\nenabled = false\n[agent.memory]\nenabled = false\n'
    )
    try:
        assert ftd("check-config", str(config)).returncode == 0  # a live socket is not a config problem
        run = ftd("agent", "--config", str(config))
    finally:
        listener.close()
    assert_clean_refusal(run, config)
    assert (
        f"{config}: cannot start: RuntimeError: another process is already listening on {path}" in run.stderr
    )


# --- check-config: which daemon, secrets, every problem despite type errors ----------------------------


def test_relative_secret_names_are_left_to_the_service(work: Path) -> None:
    config = work / "c.toml"
    config.write_text(
        '[bus]\nusername = "u"\npassword_file = "mqtt-password"\n[agent]\nkmsg_path = "/dev/null"\n'
        f'state_dir = "{work}/state"\nsocket_path = "{work}/a.sock"\n'
    )
    run = ftd("check-config", str(config))
    assert run.returncode == 0, run.stderr
    assert "not checked: bus.password_file" in run.stdout and "files:     checked for the agent" in run.stdout
    creds = work / "creds"
    creds.mkdir()
    run = ftd("check-config", str(config), env={"CREDENTIALS_DIRECTORY": str(creds)})
    assert_clean_refusal(run, config)
    assert f"bus.password_file: cannot read {creds}/mqtt-password: No such file" in run.stderr
    (creds / "mqtt-password").write_text("s3cret\n")
    assert ftd("check-config", str(config), env={"CREDENTIALS_DIRECTORY": str(creds)}).returncode == 0
    daemon = ftd("agent", "--config", str(config))  # a daemon does read it: relative to its directory
    assert_clean_refusal(daemon, config)
    assert "bus.password_file: cannot read mqtt-password" in daemon.stderr
    assert "CREDENTIALS_DIRECTORY is not set" in daemon.stderr


def test_roles_follow_the_tables_of_the_file(work: Path) -> None:
    (work / "x").write_text("")
    config = work / "c.toml"
    config.write_text(
        f'[agent]\nkmsg_path = "{work}/none"\n[coordinator]\nledger_path = "{work}/x/l.sqlite"\n'
    )
    assert {"agent.kmsg_path", "coordinator.ledger_path"} <= check_failures(config)
    assert "coordinator.ledger_path" not in check_failures(config, roles=("agent",))
    assert "agent.kmsg_path" not in check_failures(config, roles=("coordinator",))
    config.write_text(f'[agent]\nkmsg_path = "{work}/none"\n')
    assert "coordinator.ledger_path" not in check_failures(config)


def check_failures(config: Path, roles: tuple[str, ...] | None = None) -> set[str]:
    try:
        check_config_file(config, roles=roles, in_service=False)
    except ConfigError as exc:
        return {problem.path for problem in exc.problems}
    return set()


def test_references_checked_despite_type_errors_elsewhere(work: Path) -> None:
    config = work / "c.toml"
    config.write_text(
        f'[bus]\nport = "x"\ntls = true\nca_file = "{work}/none.pem"\n'
        '[coordinator]\nscheduler = "pbs"\n'  # invalid: no scontrol check on the default scheduler
        f'ledger_path = "{work}/l.sqlite"\n[coordinator.api]\nenabled = false\n'
    )
    assert check_failures(config) == {"bus.port", "bus.ca_file", "coordinator.scheduler"}


def with_rule_dir(work: Path, files: dict[str, str], extra: str = "") -> Path:
    """A coordinator config whose one rule directory holds ``files`` (name -> text); ``extra`` follows
    in the ``[coordinator]`` table."""
    rules = work / "rules"
    rules.mkdir()
    for name, text in files.items():
        (rules / name).write_text(text)
    config = work / "c.toml"
    config.write_text(
        f'[coordinator]\nledger_path = "{work}/l.sqlite"\nscheduler = "none"\n'
        f'rule_dirs = ["{rules}"]\n{extra}'
    )
    return config


def test_rule_names_must_exist(work: Path) -> None:
    (work / "r.toml").write_text('[[rule]]\nname = "dbe"\nmatch = { kind = "xid" }\naction = "drain_node"\n')
    good = (
        f'rules_file = "{work}/r.toml"\ndisabled_rules = ["straggler", "site_rule", "toml:dbe"]\n'
        '[coordinator.policy]\ndry_run_rules = ["dbe", "site_rule", "xid_catalog"]\n'
    )
    config = with_rule_dir(work, {"site_rule.py": "def ftd_evaluate(event, view):\n    return []\n"}, good)
    assert check_failures(config) == set()
    text = config.read_text().replace('"straggler", "site_rule", "toml:dbe"', '"xid_catlog"')
    config.write_text(text.replace('"dbe", "site_rule", "xid_catalog"', '"dbee"'))
    with pytest.raises(ConfigError) as info:
        check_config_file(config)
    assert info.value.problems == [
        Problem("coordinator.disabled_rules[0]", "no rule named 'xid_catlog' (did you mean 'xid_catalog'?)"),
        Problem("coordinator.policy.dry_run_rules[0]", "no rule named 'dbee' (did you mean 'dbe'?)"),
    ]


def test_a_disabled_broken_rule_file_is_not_loaded(work: Path) -> None:
    config = with_rule_dir(work, {"old.py": "raise ImportError('gone')\n"}, 'disabled_rules = ["old"]\n')
    assert check_failures(config) == set()


def test_rule_file_shadowing_a_builtin_is_reported(work: Path) -> None:
    config = with_rule_dir(work, {"fs_fill.py": ""})
    with pytest.raises(ConfigError, match=r"coordinator\.rule_dirs: .*fs_fill\.py: a plugin named 'fs_fill'"):
        check_config_file(config)


def test_bad_ca_bundle_and_patterns_file_use_the_real_loaders(work: Path) -> None:
    (work / "ca.pem").write_text("not a certificate\n")
    (work / "patterns.toml").write_text("[[pattern]]\nname = 'x'\n")
    config = parse_config(
        f'[bus]\ntls = true\nca_file = "{work}/ca.pem"\n[agent]\nkmsg_path = "/dev/null"\n'
        f'state_dir = "{work}/s"\nsocket_path = "{work}/a.sock"\n'
        f'[agent.logs]\npatterns_file = "{work}/patterns.toml"\n'
    )
    found = {problem.path: problem.message for problem in check_references(config, roles=("agent",))}
    assert set(found) == {"bus.ca_file", "agent.logs.patterns_file"}
    assert found["bus.ca_file"].startswith(f"{work}/ca.pem is not a usable CA bundle")
    assert "regex" in found["agent.logs.patterns_file"]


def test_kubernetes_references(work: Path) -> None:
    text = (
        f'[coordinator]\nledger_path = "{work}/l.sqlite"\nscheduler = "kubernetes"\n'
        "[coordinator.api]\nenabled = false\n"
    )
    config = parse_config(text + f'[coordinator.kubernetes]\ntoken_file = "{work}/token"\n')
    # the in-cluster default CA may be absent (system CAs then); the token file may not
    assert [problem.path for problem in check_references(config, roles=("coordinator",))] == [
        "coordinator.kubernetes.token_file"
    ]
    (work / "token").write_text("t\n")
    config = parse_config(
        text + f'[coordinator.kubernetes]\ntoken_file = "{work}/token"\nca_file = "{work}/ca.crt"\n'
    )
    assert [problem.path for problem in check_references(config, roles=("coordinator",))] == [
        "coordinator.kubernetes.ca_file"
    ]


# --- the path checks ---------------------------------------------------------------------------------


def test_kernel_log_sources(work: Path) -> None:
    os.mkfifo(work / "fifo")
    (work / "file").write_text("")
    assert p.kernel_log_problem("/dev/null") is None  # a character device
    assert p.kernel_log_problem(str(work / "fifo")) is None
    assert p.kernel_log_problem(str(work / "file")) is None
    assert p.kernel_log_problem(str(work)) == f"{work} is a directory, not a kernel log"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(work / "sock"))
    try:
        assert "not a character device, FIFO or regular file" in str(p.kernel_log_problem(str(work / "sock")))
    finally:
        listener.close()
    assert p.kernel_log_problem(str(work / "none")) == f"cannot read {work}/none: No such file or directory"


def test_writable_and_creatable_directories(work: Path) -> None:
    assert p.writable_dir_problem(work) is None
    assert p.writable_dir_problem(work / "a" / "b" / "c") is None  # created with its parents
    assert not (work / "a").exists()
    (work / "f").write_text("")
    assert p.writable_dir_problem(work / "f") == f"{work}/f is not a directory"
    assert p.writable_dir_problem(work / "f" / "sub") == f"{work}/f is not a directory"
    assert p.database_problem(":memory:") is None
    assert p.database_problem(str(work / "new" / "l.sqlite")) is None
    assert p.database_problem(str(work)) == f"{work} is not a regular file"


def test_socket_and_command_and_mount_checks(work: Path) -> None:
    assert p.socket_problem(str(work / "run" / "a.sock")) is None
    assert p.command_problem("sh") is None
    assert p.command_problem("no-such-command-ftd") == "no-such-command-ftd not found on $PATH"
    (work / "script").write_text("#!/bin/sh\n")
    assert p.command_problem(str(work / "script")) is not None  # not executable (even for root: no x bit)
    assert p.statvfs_problem(str(work)) is None
    assert p.statvfs_problem(str(work / "none")) == f"cannot watch {work}/none: No such file or directory"
    assert p.file_problem(str(work)) == f"{work} is a directory, not a file"


# --- relations between options -----------------------------------------------------------------------


def problems_of(text: str) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="t.toml")
    return {problem.path: problem.message for problem in info.value.problems}


def test_defaults_satisfy_every_relation() -> None:
    assert validate_data({}) == []
    assert validate_data({"agent": {"fs": {"mounts": [{"path": "/"}]}}}) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "[[agent.fs.mounts]]\npath = '/'\nwarn_pct = 95\ncritical_pct = 90\n",
            {"agent.fs.mounts[0].warn_pct": "must be below agent.fs.mounts[0].critical_pct (90), got 95"},
        ),
        (
            "[[agent.fs.mounts]]\npath = '/'\ncritical_pct = 80\n",
            {
                "agent.fs.mounts[0].critical_pct": "must be above agent.fs.mounts[0].warn_pct "
                "(85.0, the default), got 80"
            },
        ),
        (
            "[agent.fs]\nhysteresis_pct = 40\n"
            "[[agent.fs.mounts]]\npath = '/'\nwarn_pct = 30\ncritical_pct = 50\n",
            {
                "agent.fs.hysteresis_pct": "must be below agent.fs.mounts[0].warn_pct (30), got 40 "
                "(a warning would never clear)"
            },
        ),
        (
            "[agent.memory]\navailable_critical_pct = 20\n",
            {
                "agent.memory.available_critical_pct": "must be below agent.memory.available_warn_pct "
                "(10.0, the default), got 20 (critical is the lower level of available memory)"
            },
        ),
        (
            "[agent.nvml]\ntemperature_c = 80\ntemperature_hysteresis_c = 80\n",
            {
                "agent.nvml.temperature_hysteresis_c": "must be below agent.nvml.temperature_c (80), got 80 "
                "(a hot GPU would never count as cool again)"
            },
        ),
        (
            "[agent.heartbeat]\ntimeout_s = 0.2\n",
            {
                "agent.heartbeat.timeout_s": "must be above agent.heartbeat.check_interval_s "
                "(0.25, the default), got 0.2 (a silent rank would be reported late)"
            },
        ),
        (
            "[agent.fs]\nforecast_window_s = 50\n",
            {
                "agent.fs.forecast_window_s": "must span agent.fs.forecast_min_samples (5, the default) "
                "samples taken every agent.fs.interval_s (30.0, the default): at least 120 s, got 50; "
                "no time-to-full forecast could be made"
            },
        ),
        (
            "[agent.fs]\nforecast_window_s = 130\nforecast_min_span_s = 200\n",
            {
                "agent.fs.forecast_min_span_s": "must not exceed agent.fs.forecast_window_s (130), got 200 "
                "(no time-to-full forecast could be made)"
            },
        ),
        (
            "[agent.fs]\nforecast_min_samples = 40\n",
            {
                "agent.fs.forecast_min_samples": "40 samples taken every agent.fs.interval_s (30.0, the "
                "default) span 1170 s, more than agent.fs.forecast_window_s (900.0, the default); "
                "no time-to-full forecast could be made"
            },
        ),
        (
            "[agent.memory]\nleak_min_samples = 200\n",
            {
                "agent.memory.leak_min_samples": "200 samples taken every agent.memory.interval_s (10.0, the "
                "default) span 1990 s, more than agent.memory.leak_window_s (1800.0, the default); "
                "no leak could ever be detected"
            },
        ),
        (
            "[agent.memory]\ninterval_s = 600\n",
            {
                "agent.memory.interval_s": "agent.memory.leak_min_samples (6, the default) samples "
                "taken every 600 s span 3000 s, more than agent.memory.leak_window_s (1800.0, the default); "
                "no leak could ever be detected"
            },
        ),
        (
            "[[coordinator.policy.rate_limits]]\nkind = 'drain_node'\nmax = 1\nwindow_s = 60\n"
            "[[coordinator.policy.rate_limits]]\nkind = 'drain_node'\nmax = 5\nwindow_s = 600\n",
            {
                "coordinator.policy.rate_limits[1].kind": "'drain_node' already has a limit "
                "(rate_limits[0]); one limit per kind applies"
            },
        ),
        (
            "[[coordinator.policy.domain_budgets]]\nlabel = 'rack'\nmax_drained = 1\n"
            "[[coordinator.node_labels]]\nnodes = ['n1']\nnvlink_domain = 'nvl1'\n",
            {
                "coordinator.policy.domain_budgets[0].label": "no coordinator.node_labels entry sets 'rack', "
                "so this budget never applies"
            },
        ),
    ],
)
def test_relation(text: str, expected: dict[str, str]) -> None:
    assert problems_of(text) == expected


def test_relations_hold_when_both_sides_are_set_and_skip_type_errors() -> None:
    parse_config("[[agent.fs.mounts]]\npath = '/'\nwarn_pct = 50\ncritical_pct = 60\n")
    parse_config(
        "[[coordinator.policy.domain_budgets]]\nlabel = 'rack'\nmax_drained = 1\n"
        "[[coordinator.node_labels]]\nnodes = ['n1']\nrack = 'r1'\n"
    )
    # a value of the wrong type is reported once, by the validator, not again by a relation
    assert problems_of("[agent.heartbeat]\ntimeout_s = 'soon'\n") == {
        "agent.heartbeat.timeout_s": "expected float, got str 'soon'"
    }
    assert list(problems_of("[[coordinator.policy.domain_budgets]]\nlabel = 'row'\nmax_drained = 1\n")) == [
        "coordinator.policy.domain_budgets[0].label"
    ]


def test_the_operators_hardware_catalog_is_checked_like_the_daemons_load_it(tmp_path: Path) -> None:
    """hardware.catalog: unreadable or malformed is a problem at that path, naming the file and key
    (the daemons would skip every profile check on it); a good one passes."""
    from ftd.commands.config_check.references import check_references
    from ftd.config import Config
    from ftd.config.schema import HardwareConfig

    def problems(path: Path) -> list[str]:
        config = Config(hardware=HardwareConfig(catalog=str(path)))
        return [p.message for p in check_references(config, roles=["agent"]) if p.path == "hardware.catalog"]

    assert problems(tmp_path / "absent.toml") == [
        f"{tmp_path / 'absent.toml'}: cannot read: No such file or directory"
    ]
    bad = tmp_path / "bad.toml"
    bad.write_text("[profiles.x]\ngpu_names = [1]\n")
    assert problems(bad) == [f"{bad}: profiles.x.gpu_names: expected a list of names"]
    good = tmp_path / "good.toml"
    good.write_text("[burn_in.h100-sxm]\nmatmul_tflops = 720.0\n")
    assert problems(good) == []
