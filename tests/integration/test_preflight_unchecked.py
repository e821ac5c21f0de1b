"""Preflight fails closed (issue #20, item 7): a preflight that could run no check is not a pass.

With NVML failing (no driver here: the real ``pynvml`` cannot initialise) and no site command, every
check skips. That used to print ``preflight passed: 0 check(s) passed, 7 skipped`` and exit 0, so a
Prolog or return-to-service gate put a node with a broken driver back in service. Now it exits
:data:`~ftd.agent.preflight.runner.EXIT_UNCHECKED` (3) with a sentence, the shipped Prolog
(``deploy/slurm/prolog.sh``) fails on it, and only an explicit opt-out (``--allow-unchecked``,
``agent.preflight.allow_unchecked``, ``FTD_PREFLIGHT_ALLOW_UNCHECKED=1``) lets it pass. The agent's
answer to the coordinator's ``preflight`` directive says not ok too.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ftd.agent.preflight.runner import EXIT_UNCHECKED, run_preflight
from ftd.config import AgentConfig
from ftd.config.schema import PreflightConfig

REPO = Path(__file__).resolve().parents[2]
FTD_BIN = Path(sys.executable).parent / "ftd"


def _nvml_fails_here() -> bool:
    try:
        import pynvml  # type: ignore[import-untyped]
    except ImportError:
        return True
    try:
        pynvml.nvmlInit()
    except Exception:
        return True
    pynvml.nvmlShutdown()
    return False


pytestmark = pytest.mark.skipif(not _nvml_fails_here(), reason="NVML works on this machine (a GPU node)")


def agent_toml(tmp_path: Path, extra: str = "") -> Path:
    conf = tmp_path / "agent.toml"
    # NVML enabled (the default): the real library is asked and fails; the slow checks off
    conf.write_text(
        f'[agent]\nstate_dir = "{tmp_path}"\n[agent.preflight]\ngpu_compute = false\n'
        f"dcgm = false\nnccl = false\n{extra}"
    )
    return conf


def ftd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(FTD_BIN), *args], capture_output=True, text=True, timeout=120)


def test_with_nvml_failing_and_nothing_checked_preflight_fails_with_its_own_exit_code(tmp_path: Path) -> None:
    done = ftd("preflight", "--config", str(agent_toml(tmp_path)))
    assert done.returncode == EXIT_UNCHECKED == 3, (done.returncode, done.stdout, done.stderr)
    assert done.stdout.startswith("preflight could not check this node: no check could run"), done.stdout
    assert "gpu_inventory: no NVML on this node" in done.stdout
    assert "passed" not in done.stdout
    as_json = ftd("preflight", "--config", str(agent_toml(tmp_path)), "--json")
    assert as_json.returncode == 3
    data = json.loads(as_json.stdout)
    assert data["ok"] is False and data["unchecked"] is True
    assert [c["status"] for c in data["checks"]] == ["skip"] * 7


def test_the_site_may_opt_out_explicitly(tmp_path: Path) -> None:
    flag = ftd("preflight", "--config", str(agent_toml(tmp_path)), "--allow-unchecked")
    assert flag.returncode == 0, flag.stdout
    assert flag.stdout == "preflight passed: 0 check(s) passed, 7 skipped (unchecked: allowed)\n"
    key = ftd("preflight", "--config", str(agent_toml(tmp_path, "allow_unchecked = true\n")))
    assert key.returncode == 0, key.stdout


def test_one_check_that_ran_is_enough(tmp_path: Path) -> None:
    done = ftd("preflight", "--config", str(agent_toml(tmp_path, 'commands = ["true"]\n')))
    assert done.returncode == 0, done.stdout
    assert done.stdout == "preflight passed: 1 check(s) passed, 6 skipped\n"


def run_prolog(tmp_path: Path, settings: str) -> subprocess.CompletedProcess[str]:
    defaults = tmp_path / "ftd-slurm"
    defaults.write_text(settings)
    env = {"PATH": "/usr/bin:/bin", "FTD_SLURM_DEFAULTS": str(defaults), "SLURM_JOB_ID": "41"}
    return subprocess.run(
        [str(REPO / "deploy" / "slurm" / "prolog.sh")], env=env, capture_output=True, text=True, timeout=120
    )


def test_the_shipped_prolog_fails_on_an_unchecked_node_unless_the_site_opts_out(tmp_path: Path) -> None:
    base = (
        f"FTD_BIN={FTD_BIN}\nFTD_PROLOG_PREFLIGHT=1\nFTD_AGENT_CONFIG={agent_toml(tmp_path)}\n"
        f"FTD_SOCKET={tmp_path}/absent.sock\nexport FTD_SOCKET\nFTD_HOOK_TIMEOUT=1\n"
    )
    done = run_prolog(tmp_path, base)
    assert done.returncode == 1, done.stderr
    assert "preflight could not check this node" in done.stderr
    allowed = run_prolog(tmp_path, base + "FTD_PREFLIGHT_ALLOW_UNCHECKED=1\n")
    assert allowed.returncode == 0, allowed.stderr


def test_the_agents_answer_to_the_return_to_service_directive_is_not_ok(tmp_path: Path) -> None:
    from ftd.agent.node_actions import NodeActions
    from ftd.agent.spool import Outbox
    from ftd.bus.memory import MemoryBroker, MemoryBus
    from ftd.events import Ack, Directive, Event

    cfg = AgentConfig(
        state_dir=str(tmp_path), preflight=PreflightConfig(gpu_compute=False, dcgm=False, nccl=False)
    )
    answers: list[Ack] = []
    events: list[Event] = []

    class Capturing(NodeActions):
        def _answer(self, ack: Ack) -> None:
            answers.append(ack)

    async def emit(event: Event) -> None:
        events.append(event)

    async def preflight_now() -> dict[str, Any]:
        return run_preflight(cfg).to_dict()

    actions = Capturing(
        "node-1",
        outbox=Outbox(MemoryBus(MemoryBroker())),
        emit=emit,
        gpu_resetter=None,  # type: ignore[arg-type]
        jobs=dict,
        preflight_now=preflight_now,
        diagnostics_dir=tmp_path,
    )
    directive = Directive(id="d-1", ts=0.0, action="preflight", action_id="a-1", node="node-1")
    asyncio.run(actions.preflight(directive))
    assert len(answers) == 1 and answers[0].ok is False
    assert "no check could run" in answers[0].reason, answers[0]
    assert [e.data["result"] for e in events] == ["failed"]
