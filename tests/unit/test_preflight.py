"""``ftd preflight``: each check against the fake NVML (no GPU on this machine), the verdict's one-line
reason, the inventory recorded by a first pass, skips with their reasons, and the command's exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftd.agent.preflight.checks import FAIL, PASS, SKIP
from ftd.agent.preflight.runner import CHECKS, run_preflight
from ftd.agent.watchers.nvml.fake import FakeNvml
from ftd.cli import main
from ftd.config import AgentConfig, NvmlConfig
from ftd.config.schema import PreflightConfig


def config(tmp_path: Path, expected: int | None = None, commands: list[str] | None = None) -> AgentConfig:
    return AgentConfig(
        state_dir=str(tmp_path),
        nvml=NvmlConfig(expected_gpus=expected),
        preflight=PreflightConfig(commands=commands or []),
    )


def statuses(report: object) -> dict[str, str]:
    return {c.name: c.status for c in report.checks}  # type: ignore[attr-defined]


def test_a_healthy_node_passes_and_its_inventory_is_recorded(tmp_path: Path) -> None:
    fake = FakeNvml(2)
    report = run_preflight(config(tmp_path, expected=2), fake)
    assert report.ok, report
    got = statuses(report)
    assert [got[n] for n in ("gpu_inventory", "nvml_health", "ecc_remap")] == [PASS, PASS, PASS]
    # no torch GPU, no DCGM, no commands here: skipped with their reasons, never failed
    assert got["gpu_compute"] == got["dcgm_diag"] == got["nccl_allreduce"] == got["commands"] == SKIP
    assert json.loads((tmp_path / "gpu-inventory.json").read_text()) == sorted(g.uuid for g in fake.gpus)
    assert report.reason.startswith("3 check(s) passed, 4 skipped")


def test_a_gpu_node_without_torch_says_the_compute_and_nccl_checks_did_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The documented install has no torch (issue #32 item 7): on a GPU node the verdict still passes
    on the NVML checks, but its one line (what ``ftd preflight`` prints and what the return-to-service
    gate records) says which GPU checks could not run and why, instead of a bare "passed"."""
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # `import torch` raises ImportError
    report = run_preflight(config(tmp_path, expected=2), FakeNvml(2))
    assert report.ok, report
    assert report.reason == (
        "3 check(s) passed, 4 skipped; not checked on this GPU node: gpu_compute: torch is not "
        "installed; nccl_allreduce: torch is not installed (docs/operators.md: the full preflight)"
    )
    # a node without GPUs, or a site that turned the checks off, gets no such note
    off = AgentConfig(
        state_dir=str(tmp_path),
        nvml=NvmlConfig(expected_gpus=2),
        preflight=PreflightConfig(gpu_compute=False, nccl=False),
    )
    assert run_preflight(off, FakeNvml(2)).reason == "3 check(s) passed, 4 skipped"


@pytest.mark.parametrize(
    ("break_it", "reason"),
    [
        (lambda f: f.vanish(1), "gpu_inventory: 1 GPUs found, 2 expected"),
        (lambda f: setattr(f.gpus[1], "lost", True), "gpu_inventory: GPU 1 is lost: GPU is lost"),
        (
            lambda f: setattr(f.gpus[0], "retired_pending", True),
            "nvml_health: GPU 0 (0000:18:00.0) has retired",
        ),
        (lambda f: f.gpus[0].bump_ecc("dbe", 2), "ecc_remap: GPU 0 (0000:18:00.0): 2 uncorrectable ECC"),
        (
            lambda f: setattr(f.gpus[1], "remap_pending", True),
            "ecc_remap: GPU 1 (0000:28:00.0): row remap pending",
        ),
        (
            lambda f: setattr(f.gpus[1], "remap_failure", True),
            "ecc_remap: GPU 1 (0000:28:00.0): row remapping failed",
        ),
    ],
)
def test_each_fault_fails_with_a_one_line_reason(tmp_path: Path, break_it: object, reason: str) -> None:
    fake = FakeNvml(2)
    break_it(fake)  # type: ignore[operator]
    report = run_preflight(config(tmp_path, expected=2), fake)
    assert not report.ok
    assert report.reason.startswith(reason), report.reason
    assert "\n" not in report.reason


def test_a_gpu_swapped_since_the_first_pass_is_named(tmp_path: Path) -> None:
    fake = FakeNvml(2)
    assert run_preflight(config(tmp_path), fake).ok
    gone = fake.gpus[1].uuid
    fake.gpus[1].uuid = "GPU-replacement"
    report = run_preflight(config(tmp_path), fake)
    assert report.reason == f"gpu_inventory: GPU(s) gone from the inventory: {gone}"


def test_without_nvml_every_gpu_check_skips_and_site_commands_decide(tmp_path: Path) -> None:
    cfg = AgentConfig(state_dir=str(tmp_path), nvml=NvmlConfig(enabled=False))
    report = run_preflight(cfg)  # nothing could be checked: not a pass (fails closed, issue #20)
    assert not report.ok and report.unchecked and statuses(report)["gpu_inventory"] == SKIP
    assert next(c for c in report.checks if c.name == "gpu_inventory").reason == "no NVML on this node"
    passing = config(tmp_path, commands=["true"])
    report = run_preflight(AgentConfig(**{**_fields(passing), "nvml": NvmlConfig(enabled=False)}))
    assert report.ok and not report.unchecked and statuses(report)["commands"] == PASS
    failing = config(tmp_path, commands=["true", "echo checking; echo 'ib0 down' >&2; exit 3"])
    report = run_preflight(AgentConfig(**{**_fields(failing), "nvml": NvmlConfig(enabled=False)}))
    assert report.reason == "commands: command 2 exit 3: ib0 down"
    assert statuses(report)["commands"] == FAIL


def _fields(cfg: AgentConfig) -> dict[str, object]:
    return {f: getattr(cfg, f) for f in cfg.__struct_fields__}


def test_the_command_exits_non_zero_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "agent.toml"
    conf.write_text(
        f'[agent]\nstate_dir = "{tmp_path}"\n[agent.nvml]\nenabled = false\n'
        '[agent.preflight]\ncommands = ["echo disk /scratch read-only; exit 1"]\n'
    )
    assert main(["preflight", "--config", str(conf), "--skip", "rdma"]) == 1  # rdma: this host's sysfs
    assert (
        capsys.readouterr().out == "preflight failed: commands: command 1 exit 1: disk /scratch read-only\n"
    )
    # nothing left to check: exit 3 unless the site allows it explicitly
    assert main(["preflight", "--config", str(conf), "--skip", "commands", "--skip", "rdma"]) == 3
    assert capsys.readouterr().out.startswith("preflight could not check this node: no check could run")
    assert (
        main(
            [
                "preflight",
                "--config",
                str(conf),
                "--skip",
                "commands",
                "--skip",
                "rdma",
                "--json",
                "--allow-unchecked",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert (
        data["ok"] is True
        and data["unchecked"] is True
        and [c["name"] for c in data["checks"]] == [n for n in CHECKS if n != "commands"]
    )
    assert main(["preflight", "--skip", "nope"]) == 2
