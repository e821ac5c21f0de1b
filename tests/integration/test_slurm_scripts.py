"""The shipped Slurm hook scripts (deploy/slurm) never fail a job because ftd is down, unless told to.

Run as slurmd would run them (their settings from an ``/etc/default/ftd-slurm``-style file), with no
agent listening: the Prolog and Epilog warn and exit 0; with ``FTD_PROLOG_GATE=1`` the Prolog exits 1
(Slurm then drains the node and requeues the job); a missing ``ftd`` executable is a warning too; with
``FTD_PROLOG_PREFLIGHT=1`` a failing ``ftd preflight`` fails the Prolog with its one-line reason. The
hooks against a real agent and Slurm: tests/e2e/test_slurm_hooks.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FTD_BIN = Path(sys.executable).parent / "ftd"


def run_hook(tmp_path: Path, hook: str, settings: str, job: str = "41") -> subprocess.CompletedProcess[str]:
    defaults = tmp_path / "ftd-slurm"
    defaults.write_text(settings)
    env = {"PATH": "/usr/bin:/bin", "FTD_SLURM_DEFAULTS": str(defaults), "SLURM_JOB_ID": job}
    return subprocess.run(
        [str(REPO / "deploy" / "slurm" / f"{hook}.sh")], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_with_the_agent_down_the_hooks_warn_and_let_the_job_be(tmp_path: Path, hook: str) -> None:
    settings = (
        f"FTD_BIN={FTD_BIN}\nFTD_SOCKET={tmp_path}/absent.sock\nexport FTD_SOCKET\nFTD_HOOK_TIMEOUT=1\n"
        f"FTD_STATE_DIR={tmp_path}\nexport FTD_STATE_DIR\n"
    )
    done = run_hook(tmp_path, hook, settings)
    assert done.returncode == 0, done.stderr
    assert "WARNING: job 41: agent not reachable at" in done.stderr
    # the Epilog notes the end for the agent to find when it is back; the Prolog notes nothing
    assert (tmp_path / "ended-jobs" / "41").exists() is (hook == "epilog")


def test_a_gating_prolog_fails_when_the_agent_cannot_be_told(tmp_path: Path) -> None:
    settings = f"FTD_BIN={FTD_BIN}\nFTD_SOCKET={tmp_path}/absent.sock\nexport FTD_SOCKET\nFTD_PROLOG_GATE=1\n"
    done = run_hook(tmp_path, "prolog", settings)
    assert done.returncode == 1
    assert "(gate: failing the prolog)" in done.stderr


def test_without_ftd_installed_the_hooks_warn_and_exit_zero(tmp_path: Path) -> None:
    for hook in ("prolog", "epilog", "healthcheck"):
        done = run_hook(tmp_path, hook, f"FTD_BIN={tmp_path}/no-such-ftd\n")
        assert done.returncode == 0, (hook, done.stderr)
        assert "not found" in done.stderr


def test_a_preflight_gate_fails_the_prolog_with_the_reason(tmp_path: Path) -> None:
    agent = tmp_path / "agent.toml"
    agent.write_text(
        f'[agent]\nstate_dir = "{tmp_path}"\n[agent.nvml]\nenabled = false\n'
        '[agent.preflight]\ncommands = ["echo nvlink 3 down; exit 1"]\n'
    )
    settings = f"FTD_BIN={FTD_BIN}\nFTD_PROLOG_PREFLIGHT=1\nFTD_AGENT_CONFIG={agent}\n"
    done = run_hook(tmp_path, "prolog", settings)
    assert done.returncode == 1
    assert "preflight failed: commands: command 1 exit 1: nvlink 3 down" in done.stderr
