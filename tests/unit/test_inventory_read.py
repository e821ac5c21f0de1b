"""The inventory's small readers: NVML's CUDA number as people write it, ``os-release`` without
``PRETTY_NAME``, ``ofed_info -s`` failing every way (exit status, no output, missing command) falling
back to the module's version file, and a hardware profile matched from GPU names or not at all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ftd.agent.inventory.read import _profile, read_gpus, read_ofed, read_os
from ftd.agent.watchers.nvml.real import RealNvml, cuda_text
from ftd.catalog.hardware_profiles import load_hardware_catalog
from ftd.platform.inventory import GpuFacts, known, unknown
from tests.skips import skip_without_gpu


def test_cuda_numbers() -> None:
    assert cuda_text(12040) == "12.4" and cuda_text(12020) == "12.2" and cuda_text(11080) == "11.8"


def test_os_release_without_pretty_name(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/os-release").write_text('NAME="Rocky Linux"\nVERSION_ID="9.3"\n# comment\n')
    assert read_os(tmp_path).value == "Rocky Linux 9.3"
    (tmp_path / "etc/os-release").write_text("garbage without keys\n")
    assert read_os(tmp_path).unknown.endswith("has no PRETTY_NAME, NAME or VERSION_ID")


def test_ofed_info_failures_fall_back_to_the_module_version(tmp_path: Path) -> None:
    def failing(argv: list[str], timeout_s: float) -> tuple[int, str]:
        return 1, ""

    fact = read_ofed(tmp_path, "sh", 1.0, failing)  # "sh" exists on PATH; the runner plays ofed_info
    assert not fact.known and "sh -s exited 1 with no output" in fact.unknown
    (tmp_path / "sys/module/mlx5_core").mkdir(parents=True)
    (tmp_path / "sys/module/mlx5_core/version").write_text("23.10-1.1.9\n")
    assert read_ofed(tmp_path, "sh", 1.0, failing).value == "23.10-1.1.9"
    assert read_ofed(tmp_path, "no-such-command-here", 1.0, failing).value == "23.10-1.1.9"


def test_profile_from_gpu_names() -> None:
    catalog = load_hardware_catalog()

    def gpus(*names: str) -> list[GpuFacts]:
        return [GpuFacts(i, known(n)) for i, n in enumerate(names)]

    assert _profile("", gpus("NVIDIA H200", "NVIDIA H200"), catalog).value == "h200-sxm"
    assert _profile("l40s", gpus("NVIDIA H200"), catalog).value == "l40s"  # configured wins
    assert "no single hardware profile" in _profile("", gpus("NVIDIA H200", "NVIDIA L40S"), catalog).unknown
    assert "no single hardware profile" in _profile("", gpus("Tesla T4"), catalog).unknown
    unread = [GpuFacts(0, unknown("NVML: NvmlGpuLost: GPU is lost"))]
    assert "no GPU name could be read" in _profile("", unread, catalog).unknown


@pytest.mark.gpu
def test_the_real_nvml_answers_the_inventory() -> None:
    """On a GPU machine: the real backend's driver, CUDA, VBIOS and serial, and a profile from the name
    (an H100 or H200 node is matched; another GPU's name says so, never a pass)."""
    backend = RealNvml()
    try:
        backend.init()
    except Exception as exc:
        if os.environ.get("FTD_REQUIRE_GPU") == "1":
            pytest.fail(f"FTD_REQUIRE_GPU=1 and no NVML here: {exc}", pytrace=False)
        skip_without_gpu(f"no NVML (set FTD_REQUIRE_GPU=1 on a GPU machine): {exc}")
    try:
        found = read_gpus(backend, profile="", catalog=load_hardware_catalog())
        if not found.gpus:
            skip_without_gpu("NVML present but no GPU")
        assert found.driver.known and found.driver.value[0].isdigit(), found.driver
        assert found.cuda.known and found.cuda.value.count(".") == 1, found.cuda
        assert found.vbios.known or found.vbios.unknown.startswith("GPU "), found.vbios
        assert found.gpus[0].name.known
        assert found.profile.known or "no single hardware profile" in found.profile.unknown
    finally:
        backend.shutdown()
