"""One truth for the install: the binary's path, the credentials and the distribution's name agree
between the systemd units, the Slurm hooks, the example configs and the install guide.

Each fact is set in one place and checked everywhere else here: the binary is ``/opt/ftd/bin/ftd``
(the venv docs/operators.md §1 makes), a credential a unit loads is a secret name the example config
reads (and the other way round, commented-out lines included), and the distribution is ftd-daemon
(PyPI's ``ftd`` is an unrelated project).
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = "/opt/ftd/bin/ftd"
UNITS = {role: REPO / "systemd" / f"ftd-{role}.service" for role in ("agent", "coordinator")}
EXAMPLES = REPO / "examples" / "config"
HOOKS = [REPO / "deploy" / "slurm" / name for name in ("prolog.sh", "epilog.sh", "healthcheck.sh")]
SECRET_KEYS = ("password_file", "token_file", "url_file")


def _credentials(unit: Path) -> tuple[set[str], set[str]]:
    """(names loaded, names in commented-out LoadCredential= lines)."""
    active, commented = set(), set()
    for line in unit.read_text().splitlines():
        match = re.match(r"^(#?)LoadCredential=([^:]+):", line.strip())
        if match:
            (commented if match.group(1) else active).add(match.group(2))
    return active, commented


def _secrets(example: Path) -> tuple[set[str], set[str]]:
    """(relative secret names the config reads, those on commented-out lines)."""
    active, commented = set(), set()
    keys = "|".join(SECRET_KEYS)
    for line in example.read_text().splitlines():
        match = re.match(rf'^(#\s*)?(?:{keys})\s*=\s*"([^"/]+)"', line.strip())
        if match:
            (commented if match.group(1) else active).add(match.group(2))
    return active, commented


def test_units_hooks_and_slurm_defaults_run_the_same_binary() -> None:
    for unit in UNITS.values():
        (exec_start,) = [line for line in unit.read_text().splitlines() if line.startswith("ExecStart=")]
        assert exec_start.split("=", 1)[1].split()[0] == BIN, unit
    default = (REPO / "deploy" / "slurm" / "ftd-slurm.default").read_text()
    assert re.findall(r"^FTD_BIN=(.*)$", default, re.M) == [BIN]
    for hook in HOOKS:
        assert re.findall(r"^FTD_BIN=\$\{FTD_BIN:-(.*)\}$", hook.read_text(), re.M) == [BIN], hook
    guide = (REPO / "docs" / "operators.md").read_text()
    venv = str(Path(BIN).parents[1])
    assert f"sudo python3 -m venv {venv}" in guide and f"sudo {venv}/bin/pip install" in guide


def test_each_unit_loads_exactly_the_credentials_its_example_config_reads() -> None:
    for role, unit in UNITS.items():
        loaded, loadable = _credentials(unit)
        read, readable = _secrets(EXAMPLES / f"{role}.toml")
        # a LoadCredential= whose file is missing stops the unit: only what the example reads
        assert loaded == read, (role, loaded, read)
        # what the example offers commented out (a password broker), the unit offers the same way
        assert loadable == readable, (role, loadable, readable)
    assert _credentials(UNITS["coordinator"])[0] == {"api-token"}
    assert _secrets(EXAMPLES / "agent.toml")[1] == {"broker-password"}


def test_the_examples_socket_group_is_created_by_the_documented_steps() -> None:
    group = tomllib.loads((EXAMPLES / "agent.toml").read_text())["agent"]["socket_group"]
    assert f"sudo groupadd --system {group}" in (REPO / "docs" / "operators.md").read_text()


def test_the_distribution_is_ftd_daemon_everywhere() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == "ftd-daemon" and project["scripts"] == {"ftd": "ftd.cli:main"}
    client = tomllib.loads((REPO / "packaging" / "client" / "pyproject.toml").read_text())["project"]
    assert client["name"] == "ftd-daemon-client" and client["requires-python"] == ">=3.9"
    assert client["dependencies"] == []
    plugin = tomllib.loads((REPO / "plugins" / "ftd-plugin-template" / "pyproject.toml").read_text())
    assert plugin["project"]["dependencies"] == ["ftd-daemon"]
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60
    ).stdout.decode()
    wrong = re.compile(r"""pip install ['"]?ftd(\[|['"\s]|$)""", re.M)
    offenders = [
        name
        for name in tracked.split("\0")
        if name.endswith((".md", ".toml", ".yaml", ".py", ".sh", "Makefile"))
        and (REPO / name).is_file()
        and wrong.search((REPO / name).read_text(errors="replace"))
    ]
    assert offenders == []
