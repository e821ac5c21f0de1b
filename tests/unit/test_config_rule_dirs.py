"""``coordinator.rule_dirs``: an entry that does not exist or is not a directory fails ``check-config``.

The report (issue #10): a missing ``rule_dirs`` directory passed ``ftd check-config``, and the
operator's site rules were silently not there. Each bad entry is named by its key path
(``coordinator.rule_dirs[N]``), alone in an otherwise valid file, and the good entries pass.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ftd.commands.config_check import check_config_file
from ftd.config import ConfigError

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, rule_dirs: list[str]) -> Path:
    listed = ", ".join(f'"{d}"' for d in rule_dirs)
    path.write_text(
        f'[coordinator]\nledger_path = "{path.parent}/ledger.sqlite"\nscheduler = "none"\n'
        f"rule_dirs = [{listed}]\n[coordinator.api]\nenabled = false\n"
    )
    return path


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ftd.cli", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def test_missing_and_not_a_directory_are_named_by_key_path(tmp_path: Path) -> None:
    good = tmp_path / "rules"
    good.mkdir()
    (tmp_path / "a-file").write_text("not a directory\n")
    config = write(tmp_path / "c.toml", [str(good), str(tmp_path / "missing"), str(tmp_path / "a-file")])
    run = check_config(config)
    assert run.returncode == 2, run.stdout + run.stderr
    lines = [line for line in run.stderr.splitlines() if line.startswith(f"{config}: ")]
    assert lines == [
        f"{config}: coordinator.rule_dirs[1]: cannot read {tmp_path}/missing: No such file or directory",
        f"{config}: coordinator.rule_dirs[2]: {tmp_path}/a-file is not a directory",
    ]
    assert run.stderr.rstrip().endswith(f"2 problems in {config}")


def test_existing_directories_pass(tmp_path: Path) -> None:
    (tmp_path / "rules").mkdir()
    config = write(tmp_path / "c.toml", [str(tmp_path / "rules")])
    run = check_config(config)
    assert run.returncode == 0, run.stderr
    assert check_config_file(config).config.coordinator.rule_dirs == [str(tmp_path / "rules")]


def test_the_daemons_check_refuses_the_same(tmp_path: Path) -> None:
    config = write(tmp_path / "c.toml", [str(tmp_path / "missing")])
    try:
        check_config_file(config, roles=("coordinator",))
    except ConfigError as exc:
        assert [(p.path, p.message) for p in exc.problems] == [
            ("coordinator.rule_dirs[0]", f"cannot read {tmp_path}/missing: No such file or directory")
        ]
    else:
        raise AssertionError("a missing rule directory passed the coordinator's start-up check")
