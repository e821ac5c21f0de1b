"""Preflight fails closed (issue #20 item 7, issue #31 item 4): a preflight that checked nothing is
not a pass.

With NVML failing (the fake NVML's init fails as a node without a loaded driver does) and no site
command, every check skips. That used to print ``preflight passed: 0 check(s) passed, 7 skipped``
and exit 0, so a Prolog or return-to-service gate put a node with a broken driver back in service.
Now it exits :data:`~ftd.agent.preflight.runner.EXIT_UNCHECKED` (3) with a sentence, the shipped
Prolog (``deploy/slurm/prolog.sh``) fails on it, and only an explicit opt-out (``--allow-unchecked``,
``agent.preflight.allow_unchecked``, ``FTD_PREFLIGHT_ALLOW_UNCHECKED=1``) lets it pass. The agent's
answer to the coordinator's ``preflight`` directive says not ok too.

NVML that starts but sees 0 GPUs, with no expected count and no recorded inventory, used to pass
the inventory check and skip every other one (exit 0, nothing checked): it fails now, unless the node
says it has no GPU (``nvml.expected_gpus = 0``).

Every test here runs on any machine, a GPU node included: NVML is the fake
(:class:`~ftd.agent.watchers.nvml.fake.FakeNvml`) put where ``ftd preflight`` opens the real one,
or turned off in the config where the command runs in a subprocess (the Prolog).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.agent.preflight import checks
from ftd.agent.preflight.runner import EXIT_FAILED, EXIT_UNCHECKED, run_preflight
from ftd.agent.watchers.nvml import real
from ftd.agent.watchers.nvml.fake import FakeNvml
from ftd.cli import main
from ftd.config import AgentConfig, NvmlConfig
from ftd.config.schema import PreflightConfig
from tests.properties import examples

REPO = Path(__file__).resolve().parents[2]
FTD_BIN = Path(sys.executable).parent / "ftd"
NO_DRIVER = "nvmlInit failed: Driver Not Loaded"


def agent_toml(tmp_path: Path, extra: str = "", nvml: str = "") -> Path:
    conf = tmp_path / "agent.toml"
    # NVML as configured (enabled by default: the command opens the backend); the slow checks off
    conf.write_text(
        f'[agent]\nstate_dir = "{tmp_path}"\n[agent.nvml]\n{nvml}[agent.preflight]\ngpu_compute = false\n'
        f"dcgm = false\nnccl = false\n{extra}"
    )
    return conf


class NvmlHere:
    """What ``ftd preflight`` opens as NVML here: a fake; with ``gpus`` None its init fails (no
    driver), else it starts with that many GPUs. ``opened`` holds every one opened."""

    def __init__(self) -> None:
        self.gpus: int | None = None
        self.opened: list[FakeNvml] = []

    def open(self) -> FakeNvml:
        fake = FakeNvml(2, unavailable=NO_DRIVER) if self.gpus is None else FakeNvml(self.gpus)
        self.opened.append(fake)
        return fake


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> NvmlHere:
    here = NvmlHere()
    monkeypatch.setattr(real, "RealNvml", here.open)
    return here


def preflight(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    # The RDMA node check (issue #36) reads this host's sysfs; these tests are about the GPU checks.
    code = main(["preflight", *args, "--skip", "rdma"])
    return code, capsys.readouterr().out


def test_with_nvml_failing_and_nothing_checked_preflight_fails_with_its_own_exit_code(
    tmp_path: Path, nvml: NvmlHere, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = preflight(capsys, "--config", str(agent_toml(tmp_path)))
    assert code == EXIT_UNCHECKED == 3, out
    assert [f.calls["init"] for f in nvml.opened] == [1]  # the fake was asked, and failed
    assert out.startswith("preflight could not check this node: no check could run"), out
    assert "gpu_inventory: no NVML on this node" in out
    assert "passed" not in out
    code, out = preflight(capsys, "--config", str(agent_toml(tmp_path)), "--json")
    assert code == 3
    data = json.loads(out)
    assert data["ok"] is False and data["unchecked"] is True
    assert [c["status"] for c in data["checks"]] == ["skip"] * 7


def test_the_site_may_opt_out_explicitly(
    tmp_path: Path, nvml: NvmlHere, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = preflight(capsys, "--config", str(agent_toml(tmp_path)), "--allow-unchecked")
    assert code == 0, out
    assert out == "preflight passed: 0 check(s) passed, 7 skipped (unchecked: allowed)\n"
    code, out = preflight(capsys, "--config", str(agent_toml(tmp_path, "allow_unchecked = true\n")))
    assert code == 0, out
    assert len(nvml.opened) == 2


def test_one_check_that_ran_is_enough(
    tmp_path: Path, nvml: NvmlHere, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = preflight(capsys, "--config", str(agent_toml(tmp_path, 'commands = ["true"]\n')))
    assert code == 0, out
    assert out == "preflight passed: 1 check(s) passed, 6 skipped\n"


def test_nvml_seeing_no_gpu_with_none_expected_fails(
    tmp_path: Path, nvml: NvmlHere, capsys: pytest.CaptureFixture[str]
) -> None:
    nvml.gpus = 0
    code, out = preflight(capsys, "--config", str(agent_toml(tmp_path)))
    assert code == EXIT_FAILED == 1, out
    assert out == (
        "preflight failed: gpu_inventory: NVML reports 0 GPUs and none are expected "
        "(a node without GPUs sets nvml.expected_gpus = 0)\n"
    )
    assert nvml.opened[0].calls["device_count"] == 1
    # a site command that passes does not hide it: the GPU node still has no GPU
    code, out = preflight(capsys, "--config", str(agent_toml(tmp_path, 'commands = ["true"]\n')))
    assert code == 1 and "gpu_inventory: NVML reports 0 GPUs" in out
    assert not (tmp_path / "gpu-inventory.json").exists()


def test_a_node_without_gpus_says_so_and_passes(
    tmp_path: Path, nvml: NvmlHere, capsys: pytest.CaptureFixture[str]
) -> None:
    nvml.gpus = 0
    conf = agent_toml(tmp_path, nvml="expected_gpus = 0\n")
    code, out = preflight(capsys, "--config", str(conf), "-v")
    assert code == 0, out
    assert "gpu_inventory   pass  no GPU, as expected (nvml.expected_gpus = 0)" in out
    assert out.endswith("preflight passed: 1 check(s) passed, 6 skipped\n")


def test_zero_gpus_fails_for_every_caller_of_the_runner(tmp_path: Path) -> None:
    cfg = AgentConfig(
        state_dir=str(tmp_path), preflight=PreflightConfig(gpu_compute=False, dcgm=False, nccl=False)
    )
    report = run_preflight(cfg, FakeNvml(0))
    assert not report.ok and not report.unchecked and report.exit_code == EXIT_FAILED
    assert report.reason.startswith("gpu_inventory: NVML reports 0 GPUs and none are expected")
    # the opt-out for unchecked nodes does not pass it: something ran, and it failed
    assert not run_preflight(cfg, FakeNvml(0), allow_unchecked=True).ok
    # a node that had GPUs when it first passed and has none now names them
    fake = FakeNvml(1)
    assert run_preflight(cfg, fake).ok
    gone = fake.vanish(0).uuid
    assert run_preflight(cfg, fake).reason == f"gpu_inventory: GPU(s) gone from the inventory: {gone}"
    expected_none = AgentConfig(
        state_dir=str(tmp_path / "cpu"),
        nvml=NvmlConfig(expected_gpus=0),
        preflight=PreflightConfig(gpu_compute=False, dcgm=False, nccl=False),
    )
    assert run_preflight(expected_none, FakeNvml(0)).ok
    assert run_preflight(expected_none, FakeNvml(1)).reason == "gpu_inventory: 1 GPUs found, 0 expected"


def run_prolog(tmp_path: Path, settings: str) -> subprocess.CompletedProcess[str]:
    defaults = tmp_path / "ftd-slurm"
    defaults.write_text(settings)
    env = {"PATH": "/usr/bin:/bin", "FTD_SLURM_DEFAULTS": str(defaults), "SLURM_JOB_ID": "41"}
    return subprocess.run(
        [str(REPO / "deploy" / "slurm" / "prolog.sh")], env=env, capture_output=True, text=True, timeout=120
    )


def test_the_shipped_prolog_fails_on_an_unchecked_node_unless_the_site_opts_out(tmp_path: Path) -> None:
    # NVML off in the config: nothing to check on any machine (the fake cannot reach a subprocess)
    conf = agent_toml(tmp_path, nvml="enabled = false\n")
    base = (
        f"FTD_BIN={FTD_BIN}\nFTD_PROLOG_PREFLIGHT=1\nFTD_AGENT_CONFIG={conf}\n"
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

    async def preflight_now(params: Any) -> dict[str, Any]:
        return run_preflight(cfg, FakeNvml(2, unavailable=NO_DRIVER)).to_dict()

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


@settings(max_examples=examples(100), deadline=None)
@given(count=st.integers(0, 4), expected=st.one_of(st.none(), st.integers(0, 4)))
def test_the_inventory_gate_passes_only_the_expected_count_or_some_gpus(
    count: int, expected: int | None
) -> None:
    fake = FakeNvml(count)
    fake.init()
    result, gpus = checks.gpu_inventory(fake, expected, None)
    assert len(gpus) == count
    assert (result.status == checks.PASS) == (count == expected if expected is not None else count > 0)
    assert result.status in (checks.PASS, checks.FAIL)  # NVML answered: never a skip
